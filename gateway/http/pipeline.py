"""The one request path every model call goes through: authenticate -> admit -> send -> settle -> account.

Endpoints (gateway.http.endpoints) supply only how to read their body, what to send and how to shape the
answer; the summaries batcher (gateway.summaries) makes its model calls through the same path. Every promise
is kept here, once:

- ``serve`` wraps a client request: it makes the ``Record``, turns any ``GatewayError`` into an error in the
  caller's API shape (a client error logs one line, never a traceback) and writes the record's one ledger
  row and metrics when the request ends (a whole answer: before it leaves; a stream: ``relay`` writes it
  before the client's last byte);
- ``authenticate``: the gateway key from ``Authorization`` or ``x-api-key`` -> (key, project), or 401/403;
- ``exchange``: admit (the project's limits, or a 429 naming the limit) -> send (the routing plan's
  attempts, retries, cooldowns and fallbacks, gateway.upstream) -> the caller reads the answer ->
  release and settle the admission and the plan, exactly once, whatever happened;
- ``model_call``: one internal model call (a summaries batch) as its own ledger row.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from aiohttp import web
from multidict import istr

from gateway.core import jsoncodec
from gateway.core.record import OVERHEAD_HEADER, Record, own_time
from gateway.errors import (
    ApiStyle,
    AuthError,
    BadRequest,
    ClientError,
    Forbidden,
    GatewayError,
    LimitsUnavailable,
    PayloadTooLarge,
    RateLimited,
    UpstreamError,
    UpstreamTimeout,
    error_response,
)
from gateway.limits.base import LimitExceeded
from gateway.store.keys import KeyInfo, credential_from_headers

if TYPE_CHECKING:
    from collections.abc import Mapping

    from gateway.config import ModelPrice, ProjectConfig
    from gateway.http.services import Services
    from gateway.limits.base import Admission
    from gateway.upstream.client import UpstreamResponse, UpstreamResult

log = logging.getLogger("gateway")


class Sender(Protocol):
    """What the send stage sends through: an UpstreamClient, or a routing plan (gateway.upstream.routing)."""

    async def send(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        on_retry: Callable[[str], None] | None = None,
        *,
        project: str | None = None,
    ) -> UpstreamResult: ...


class Settles(Protocol):
    """A routing plan's side of ``exchange``: its deployments' tpm settled with the real tokens."""

    def settle(self, actual_tokens: int) -> None: ...


class RoutedSender(Sender, Settles, Protocol):
    pass


class StreamShape(Protocol):
    """How an endpoint shapes a streamed answer (``relay``): the upstream's bytes in, the client's out."""

    def feed(self, chunk: bytes) -> bytes: ...
    def finish(self) -> bytes: ...
    def error_event(self, status: int, message: str) -> bytes: ...
    def count(self, rec: Record) -> None: ...  # the record's tokens from what was relayed

    @property
    def failed(self) -> str | None: ...  # an error event from the upstream ended the stream


class _Relay(web.StreamResponse):
    """A streamed answer whose head is held until its first body bytes, and written with them (aiohttp's
    ``web.Response`` does this; a ``StreamResponse`` otherwise sends its head at ``prepare``)."""

    _send_headers_immediately = False


def credential_refused(provider: str | None, status: int) -> str:
    """An upstream refused the gateway's own provider key (401/403): logged for the operator, and the
    message the client gets (it is not the client's key that is wrong)."""
    log.error("upstream %r refused the gateway's provider credential (HTTP %d)", provider, status)
    return (
        f"upstream {provider!r} rejected the gateway's provider credential (HTTP {status}); "
        "this is a gateway configuration problem, not your API key: tell the gateway operator"
    )


def header(request: web.Request, name: str) -> str | None:
    """A client header as clean text: bytes that were not UTF-8 (aiohttp keeps them as surrogates)
    become U+FFFD, so nothing downstream (ledger, logs, metrics) ever sees an unencodable string."""
    value = request.headers.get(name)
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def session_header(request: web.Request) -> str | None:
    """The agent session a request belongs to: Claude Code's ``X-Claude-Code-Session-Id``, else the
    ``session-id`` header (Codex, or any client: the farm's drafts send it), as clean text; None without."""
    return header(request, "X-Claude-Code-Session-Id") or header(request, "session-id")


async def read_body(request: web.Request) -> bytes:
    """The request body. aiohttp's own refusals (a body over ``client_max_size``, a body that does not
    match its ``Content-Encoding``) become client errors instead of internal ones."""
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise PayloadTooLarge(e.text or "request body too large") from None
    except web.HTTPException as e:
        raise GatewayError(e.status, e.text or e.reason, error_class=f"http_{e.status}") from None
    except Exception as e:  # aiohttp's decompression and payload errors (e.g. gzip that is not gzip)
        encoding = request.headers.get("Content-Encoding")
        what = f" (Content-Encoding: {encoding})" if encoding else ""
        err = BadRequest(f"request body could not be read{what}: {e}", error_class="bad_body")
        err.close_connection = True  # the rest of the body cannot be told apart from a next request
        raise err from None


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; anything else (not JSON, nested too deep, not an object) is a 400."""
    try:
        body = jsoncodec.loads(raw)
    except ValueError as e:  # includes UnicodeDecodeError
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest("request body is nested too deeply to be a request") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def dump_json(body: Any) -> bytes:
    try:
        return jsoncodec.dumps(body)
    except (RecursionError, ValueError) as e:
        raise BadRequest(f"request body cannot be re-encoded: {e.__class__.__name__}") from None


_OVERHEAD = istr(OVERHEAD_HEADER)  # the header's key made once (multidict lowers a plain str on each set)


def _ms(seconds: float | None) -> str:
    """A header's milliseconds, to the microsecond."""
    return f"{(seconds or 0.0) * 1000:.3f}"


class Pipeline:
    """The stages, over the services of one gateway (gateway.http.services)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.prices = services.prices

    def cost_of(self, rec: Record) -> float | None:
        """The record's cost in US dollars from its token counts (None: its model has no price)."""
        return self.prices.cost(
            rec.upstream_model,
            rec.public_model,
            rec.input_tokens,
            rec.output_tokens,
            rec.cached_input_tokens,
            rec.cache_write_tokens,
        )

    # --- wrapping a client request ---------------------------------------------------------------
    async def serve(
        self,
        request: web.Request,
        endpoint: str,
        style: ApiStyle,
        handle: Callable[[web.Request, Record], Awaitable[web.StreamResponse]],
        *,
        ledger: bool = True,
    ) -> web.StreamResponse:
        """Run ``handle`` with a fresh Record; shape its errors; write the record's row when it ends (unless
        ``ledger`` is False: a route that makes no model call of its own, e.g. the summaries route, whose
        model calls are rows of their own through ``model_call``)."""
        rec = Record(endpoint)
        try:
            resp = await handle(request, rec)
        except GatewayError as e:
            self._note_error(rec, e, request.method, request.path)
            resp = error_response(
                style,
                e.status,
                e.message,
                code=e.code,
                retry_after=e.retry_after,
                request_id=rec.request_id,
                limit=e.limit,
                headers=e.headers,
            )
            if e.close_connection:
                resp.force_close()
        except asyncio.CancelledError:
            rec.status = "cancelled"
            rec.error_class = rec.error_class or "client_disconnected"
            raise
        except Exception:
            log.exception("internal error on %s (request %s)", endpoint, rec.request_id)
            rec.fail("error", 500, "internal_error")
            resp = error_response(style, 500, "internal gateway error", request_id=rec.request_id)
        finally:
            if ledger:
                self.account(rec)
        if ledger and not resp.prepared:  # a stream's head went out with the figure of its own time
            resp.headers[_OVERHEAD] = _ms(rec.overhead)
        return resp

    @contextlib.asynccontextmanager
    async def model_call(self, rec: Record) -> AsyncIterator[Record]:
        """One internal model call (not a client request) as its own ledger row: a GatewayError inside
        is noted on the record (and raised on), and the row is written when the call ends."""
        try:
            yield rec
        except GatewayError as e:
            rec.status = "rejected" if e.limit else "error"
            rec.http_status = rec.http_status or e.status
            rec.error_class = rec.error_class or e.error_class
            raise
        finally:
            self.account(rec)

    @staticmethod
    def _note_error(rec: Record, e: GatewayError, method: str, path: str) -> None:
        rejected = e.status in (401, 403, 404, 405) or e.limit
        rec.fail("rejected" if rejected else "error", e.status, e.error_class)
        if isinstance(e, ClientError):
            log.info("%s %s -> %d %s: %s", method, path, e.status, e.error_class, e.message)
        else:  # the upstream or the gateway's own store failed: one line, the request's fault is not at issue
            log.warning("%s %s -> %d %s: %s", method, path, e.status, e.error_class, e.message)

    # --- authenticate ----------------------------------------------------------------------------
    async def authenticate(
        self, request: web.Request, rec: Record | None = None
    ) -> tuple[KeyInfo, ProjectConfig]:
        cred = credential_from_headers(request.headers)
        key = cred.key
        if not key:
            raise AuthError(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                error_class="auth_missing",
                code="invalid_api_key",
            )
        info = await self.services.keys.authenticate(key)
        if info is None:
            raise AuthError(cred.invalid_message(), code="invalid_api_key")
        project = self.services.settings.projects.get(info.project)
        if project is None:
            raise Forbidden(
                f"the key's project {info.project!r} is not configured on this gateway",
                error_class="project_unknown",
            )
        if rec is not None:
            rec.project, rec.key_id = info.project, info.id
        return info, project

    # --- admit -> send -> settle -----------------------------------------------------------------
    def exchange(
        self,
        rec: Record,
        plan: RoutedSender,
        request: tuple[str, bytes, Mapping[str, str]],
        *,
        token_cap: int | None,
        input_estimate: int,
        on_target: Callable[[], None] | None = None,
    ) -> Exchange:
        """``async with pipeline.exchange(...) as result``: admit ``rec`` against its project's limits,
        send ``request`` (path, body, headers) through ``plan``, and give the final attempt's result for
        the block to read. When the block ends, however it ends, the admission is released and settled and
        the plan settled, once, with the record's tokens (so the block sets them before it ends).
        ``on_target`` runs after the send, answered or not (the record notes where the request went)."""
        return Exchange(self, rec, plan, request, token_cap, input_estimate, on_target)

    async def _admit(self, rec: Record, token_cap: int | None, input_estimate: int) -> tuple[Admission, bool]:
        """The project's limits; a refusal is a 429 that names the limit and carries Retry-After.

        With a daily cost budget the request reserves its most likely worst case, ``token_cap`` (or the
        project's default) at the output price plus ``input_estimate`` at the input price; the settlement
        then charges the record's real cost. Returns the admission and whether the project has a cost
        budget."""
        assert rec.project is not None
        limits = self.services.limits[rec.project]
        cost_reserve = 0.0
        if limits.cfg.daily_cost_budget_usd is not None:
            cap = token_cap or limits.cfg.default_max_tokens
            cost_reserve = max(
                (p.cost(max(0, input_estimate), cap) for p in self._candidate_prices(rec)), default=0.0
            )
        try:
            admission = await limits.admit(token_cap, input_estimate, cost_reserve, rec.request_id)
        except LimitsUnavailable:  # Redis down with redis_outage: refuse: a 503 with Retry-After
            self.services.metrics.rejections.labels(rec.project, "redis_outage").inc()
            raise
        except LimitExceeded as e:
            self.services.metrics.rejections.labels(rec.project, e.limit).inc()
            raise RateLimited(
                e.message,
                error_class=f"limit_{e.limit}",
                code=f"{e.limit}_limit_exceeded",
                retry_after=e.retry_after_header,
                limit=e.limit,
            ) from None
        rec.queue_wait = admission.queue_wait_s
        return admission, limits.cfg.daily_cost_budget_usd is not None

    def _candidate_prices(self, rec: Record) -> list[ModelPrice]:
        """The prices the request may be billed at: its upstream model's when chosen already, else those
        of every deployment of its public model (the reservation takes the dearest)."""
        if rec.upstream_model is not None:
            upstreams = [rec.upstream_model]
        else:
            route = self.services.settings.models.get(rec.public_model or "")
            upstreams = [d.upstream_model for d in getattr(route, "deployments", None) or []] or [None]
        prices = (self.prices.price(u, rec.public_model) for u in upstreams)
        return [p for p in prices if p is not None]

    async def send(
        self, rec: Record, sender: Sender, path: str, raw: bytes, headers: Mapping[str, str]
    ) -> UpstreamResult:
        """One upstream call with its retries. The time spent waiting for a connection slot of the
        provider's pool is queue wait, not upstream time. The record counts the upstream 429 answers met
        (retried ones, and the last answer when it is one) and the time waited between attempts."""
        retries = self.services.metrics.retries

        def on_retry(reason: str) -> None:
            rec.retries += 1
            if reason == "429":
                rec.rate_limited += 1
            retries.labels(rec.project, rec.model_label, reason).inc()

        rec.upstream_t0 = time.perf_counter()
        try:
            result = await sender.send(path, raw, headers, on_retry, project=rec.project)
        except GatewayError as e:
            rec.upstream_end = time.perf_counter()
            rec.retry_wait = getattr(e, "retry_wait_s", 0.0)
            raise
        rec.retries = result.retries
        rec.retry_wait = result.retry_wait_s
        if result.status == 429:
            rec.rate_limited += 1
        if result.slot_wait_s:
            rec.queue_wait += result.slot_wait_s
            rec.upstream_t0 += result.slot_wait_s
        rec.upstream_request_id = result.headers.get("x-request-id") or result.headers.get("request-id")
        return result

    # --- relay a streamed answer ---------------------------------------------------------------
    async def relay(
        self,
        request: web.Request,
        rec: Record,
        upstream: UpstreamResponse,
        shape: StreamShape,
        headers: Mapping[str, str],
    ) -> web.StreamResponse:
        """Relay an upstream stream to the client as ``shape`` shapes it. The record's row is written
        before the client's last byte (a client that saw the end always has its row); an upstream that
        breaks off or stalls ends the stream with an error event in the client's format, a fault of the
        gateway's own ends it too (never a hung stream), and a client that goes away is a cancelled row."""
        feed, readany = shape.feed, upstream.readany  # once: called for every chunk
        clean_end = False
        try:
            # Nothing has gone to the client yet: a failure here is still a clean error answer.
            data = b""
            while not data:
                chunk = await readany()
                upstream_s = time.perf_counter() - rec.upstream_t0  # type: ignore[operator]
                if not chunk:
                    break
                data = feed(chunk)

            # Few system calls: the head goes out with the first bytes, and the bytes that end the upstream's
            # body go out with the end of ours (a short answer is one write: head, events and end).
            out = _Relay(status=200, headers=headers)
            # the gateway's own time until its head, less the upstream's until the bytes that go with it
            rec.overhead = own_time(time.perf_counter() - rec.t0, upstream_s, rec.queue_wait)
            out.headers[_OVERHEAD] = _ms(rec.overhead)
            try:
                await out.prepare(request)
                rec.http_status = 200
                while True:
                    if upstream.at_eof():
                        data += shape.finish()
                        rec.status = "ok"
                        if shape.failed is not None:  # an error event ended it
                            rec.status, rec.error_class = "error", "upstream_stream_error"
                        clean_end = True
                        if data and rec.ttft is None:
                            rec.ttft = time.perf_counter() - rec.t0
                        shape.count(rec)
                        self.account(rec)  # spooled before the client's last byte
                        await out.write_eof(data)
                        break
                    if data:
                        await out.write(data)
                        if rec.ttft is None:
                            rec.ttft = time.perf_counter() - rec.t0
                    try:
                        chunk = await readany()
                    except UpstreamError as e:
                        rec.status, rec.error_class = "error", e.error_class
                        shape.count(rec)
                        self.account(rec)
                        how = (
                            "stalled mid-stream" if isinstance(e, UpstreamTimeout) else "broke off the stream"
                        )
                        await out.write(
                            shape.error_event(e.status, f"upstream {rec.provider!r} {how}: {e.message}")
                        )
                        break
                    data = feed(chunk) if chunk else b""
                await out.write_eof()  # after an error event (a no-op when the end was written above)
            except ConnectionResetError:
                if not rec.closed:
                    rec.status, rec.error_class = "cancelled", "client_disconnected"
                clean_end = False
            except Exception:  # a fault of the gateway's own once the stream began: end it, never hang it
                log.exception(
                    "internal error relaying a stream of %s (request %s)", rec.endpoint, rec.request_id
                )
                clean_end = False
                if not rec.closed:
                    rec.status, rec.error_class = "error", "internal_error"
                    shape.count(rec)
                    self.account(rec)
                with contextlib.suppress(Exception):  # the client may be gone too
                    await out.write(
                        shape.error_event(500, "internal gateway error while relaying the stream")
                    )
                    await out.write_eof()
            return out
        finally:
            rec.upstream_end = rec.upstream_end or time.perf_counter()
            if clean_end:
                upstream.release()
            else:
                upstream.close()  # drops the connection: the upstream sees the request cancelled
            if not rec.closed:
                shape.count(rec)

    # --- account ---------------------------------------------------------------------------------
    def account(self, rec: Record) -> None:
        """The record's one ledger row (spooled before this returns) and its metrics; a record already
        written is not written again (a stream writes its row before its last byte, then ``serve`` ends)."""
        if rec.closed:
            return
        rec.closed = True
        if rec.settle is not None:  # first: the row says whether Redis took the usage (shared_pending)
            rec.settle()
        end = time.perf_counter()
        upstream_s = None
        if rec.upstream_t0 is not None:
            upstream_s = max(0.0, (rec.upstream_end or end) - rec.upstream_t0)
        if rec.cost_usd is None:
            rec.cost_usd = self.cost_of(rec)
        latency = end - rec.t0
        overhead = rec.overhead
        if overhead is None:  # a whole answer: its own time up to now (a stream's was taken at its head)
            overhead = rec.overhead = own_time(latency, upstream_s, rec.queue_wait)
        self.services.ledger.submit(rec.row(latency, upstream_s), owned=True)
        tally = self.services.metrics.tally(
            rec.project or "unknown", rec.model_label, rec.task_label, rec.status
        )
        tally.record(
            latency, upstream_s, rec.queue_wait, rec.ttft, rec.input_tokens, rec.output_tokens, rec.cost_usd,
            overhead,
        )  # fmt: skip
        if rec.rate_limited or rec.retry_wait:  # rare: labels() only for the requests that retried
            metrics = self.services.metrics
            labels = (rec.project or "unknown", rec.model_label, rec.task_label)
            if rec.rate_limited:
                metrics.rate_limited.labels(*labels).inc(rec.rate_limited)
            if rec.retry_wait:
                metrics.retry_wait.labels(*labels).inc(rec.retry_wait)


class Exchange:
    """One admitted model call (``Pipeline.exchange``); a class, not a generator: it is on every request's
    path, and a generator-based context manager costs about 3% of the gateway's instructions per request."""

    __slots__ = ("pipeline", "rec", "plan", "request", "token_cap", "input_estimate", "on_target", "_held")

    def __init__(
        self,
        pipeline: Pipeline,
        rec: Record,
        plan: RoutedSender,
        request: tuple[str, bytes, Mapping[str, str]],
        token_cap: int | None,
        input_estimate: int,
        on_target: Callable[[], None] | None,
    ) -> None:
        self.pipeline, self.rec, self.plan, self.request = pipeline, rec, plan, request
        self.token_cap, self.input_estimate, self.on_target = token_cap, input_estimate, on_target
        self._held: tuple[Admission, bool] | None = None

    async def __aenter__(self) -> UpstreamResult:
        pipeline, rec = self.pipeline, self.rec
        rec.max_tokens = self.token_cap
        self._held = await pipeline._admit(rec, self.token_cap, self.input_estimate)
        rec.settle = self._settle  # a stream writes its row before the block ends: settled then
        try:
            result = await pipeline.send(rec, self.plan, *self.request)
        except BaseException:
            if self.on_target is not None:
                self.on_target()
            self._settle()  # the block never runs: __aexit__ is not called
            raise
        if self.on_target is not None:
            self.on_target()
        return result

    async def __aexit__(self, *_exc: object) -> None:
        self._settle()

    def _settle(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        admission, budgeted = held
        rec = self.rec
        rec.settle = None
        admission.release()
        admission.settle(rec.tokens, (self.pipeline.cost_of(rec) or 0.0) if budgeted else 0.0)
        if admission.shared_pending:  # Redis could not take it: the row says so
            rec.shared_pending = True
        self.plan.settle(rec.tokens)
