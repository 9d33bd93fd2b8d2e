"""The one request pipeline every model endpoint goes through: authenticate -> admit -> send -> account.

The four proxy endpoints (gateway.http.endpoints.proxy) and the summaries endpoint
(gateway.summaries.batcher) use the same
stages, so every promise is kept in one place:

- ``authenticate``: the gateway key from ``Authorization`` or ``x-api-key`` -> (key, project), or 401/403;
- ``admit``: the project's limits (budget, rpm, tpm, concurrency), or a 429 naming the limit;
- ``send``: one upstream call with its retries through the provider's client (gateway.upstream.client), which
  raises only gateway.errors kinds; the wait for a connection slot counts as queue wait;
- ``account``: exactly one ledger row and one set of metrics per ``Record``, written to the ledger's
  spool before the client gets its last byte.

``Pipeline.serve`` wraps an endpoint: it makes the ``Record``, turns any ``GatewayError`` into an error in
the caller's API shape (a client error logs one line, never a traceback), and accounts the record.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from aiohttp import web

from gateway.core import jsoncodec
from gateway.core.pricing import ModelPrice, PriceTable
from gateway.errors import (
    ApiStyle,
    AuthError,
    BadRequest,
    ClientError,
    Forbidden,
    GatewayError,
    PayloadTooLarge,
    RateLimited,
    error_response,
)
from gateway.limits.base import Admission, LimitExceeded
from gateway.store.keys import KeyInfo, credential_from_headers

if TYPE_CHECKING:
    from gateway.config import ProjectConfig
    from gateway.http.app import Gateway
    from gateway.upstream.client import UpstreamClient, UpstreamResult

log = logging.getLogger("gateway")

# Request ids: a random prefix drawn once per process, then a counter (unique without a syscall each).
_ID_PREFIX = os.urandom(6).hex()
_ID_SEQ = itertools.count(int.from_bytes(os.urandom(3), "big") << 16)


class Record:
    """What one client request (or one summaries model call) did; becomes its ledger row and metrics."""

    __slots__ = (
        "request_id", "ts", "t0", "endpoint", "project", "key_id", "public_model", "model_label",
        "upstream_model", "provider", "task", "task_label", "session_id", "stream", "status",
        "http_status", "error_class", "retries", "input_tokens", "output_tokens", "estimated",
        "upstream_t0", "upstream_end", "ttft", "queue_wait", "upstream_request_id", "batch_size",
        "accounted", "deployment", "fallback_from", "translation", "cost_usd", "cached_input_tokens",
        "cache_write_tokens",
    )  # fmt: skip

    def __init__(self, endpoint: str) -> None:
        self.request_id = f"{_ID_PREFIX}{next(_ID_SEQ):012x}"
        self.ts = datetime.now(UTC)
        self.t0 = time.perf_counter()
        self.endpoint = endpoint
        self.project = self.key_id = self.public_model = self.upstream_model = None
        self.provider = self.task = self.session_id = self.error_class = None
        self.upstream_request_id = None
        self.model_label = "unknown"
        self.task_label = "unknown"
        self.stream = False
        self.status = "error"
        self.http_status: int | None = None
        self.retries = self.input_tokens = self.output_tokens = 0
        # parts of input_tokens: cache reads (OpenAI's cached tokens) and Anthropic's cache writes
        self.cached_input_tokens = self.cache_write_tokens = 0
        self.estimated = False
        self.upstream_t0: float | None = None
        self.upstream_end: float | None = None
        self.ttft: float | None = None
        self.queue_wait = 0.0
        self.batch_size: int | None = None
        self.accounted = False
        self.deployment: str | None = None
        self.fallback_from: str | None = None
        self.translation: str | None = None
        self.cost_usd: float | None = None

    def tag(self, project: ProjectConfig, task: str | None) -> None:
        """The task (header or the project's default) and its bounded metrics label."""
        self.task = task or project.default_task
        self.task_label = (
            self.task if self.task == project.default_task or self.task in project.tasks else "other"
        )


def header(request: web.Request, name: str) -> str | None:
    """A client header as clean text: bytes that were not UTF-8 (aiohttp keeps them as surrogates)
    become U+FFFD, so nothing downstream (ledger, logs, metrics) ever sees an unencodable string."""
    value = request.headers.get(name)
    if value is None or value.isascii():
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


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


class Pipeline:
    """The stages, over the services of one ``Gateway`` (keys, limits, clients, ledger, metrics)."""

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.prices = PriceTable(gw.settings.prices)
        routes = [
            (name, d.upstream_model)
            for name, route in gw.settings.models.items()
            for d in getattr(route, "deployments", None) or [route]
        ]
        for name in dict.fromkeys(self.prices.unpriced(routes)):  # once per public model
            log.warning(
                "model %s has no price (add it to `prices:` in the config): its ledger rows get no cost "
                "and it counts nothing against daily cost budgets",
                name,
            )

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

    # --- wrapping an endpoint --------------------------------------------------------------------
    async def serve(
        self,
        request: web.Request,
        endpoint: str,
        style: ApiStyle,
        handle: Callable[[web.Request, Record], Awaitable[web.StreamResponse]],
        *,
        ledger: bool = True,
    ) -> web.StreamResponse:
        """Run ``handle`` with a fresh Record; shape its errors; account the record (unless ``ledger`` is
        False: the summaries route accounts one record per model call instead)."""
        rec = Record(endpoint)
        try:
            return await handle(request, rec)
        except GatewayError as e:
            self._note_error(rec, e, request)
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
            return resp
        except asyncio.CancelledError:
            rec.status = "cancelled"
            rec.error_class = rec.error_class or "client_disconnected"
            raise
        except Exception:
            log.exception("internal error on %s (request %s)", endpoint, rec.request_id)
            rec.status, rec.http_status, rec.error_class = "error", 500, "internal_error"
            return error_response(style, 500, "internal gateway error", request_id=rec.request_id)
        finally:
            if ledger:
                self.account(rec)

    @staticmethod
    def _note_error(rec: Record, e: GatewayError, request: web.Request) -> None:
        rec.status = "rejected" if e.status in (401, 403, 404, 405) or e.limit else "error"
        rec.http_status = e.status
        rec.error_class = e.error_class
        if isinstance(e, ClientError):
            log.info("%s %s -> %d %s: %s", request.method, request.path, e.status, e.error_class, e.message)
        else:  # the upstream or the gateway's own store failed: one line, the request's fault is not at issue
            log.warning(
                "%s %s -> %d %s: %s", request.method, request.path, e.status, e.error_class, e.message
            )

    # --- authenticate ----------------------------------------------------------------------------
    async def authenticate(self, request: web.Request, rec: Record | None = None) -> tuple[KeyInfo, Any]:
        cred = credential_from_headers(request.headers)
        key = cred.key
        if not key:
            raise AuthError(
                "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                error_class="auth_missing",
                code="invalid_api_key",
            )
        info = await self.gw.keys.authenticate(key)
        if info is None:
            raise AuthError(cred.invalid_message(), code="invalid_api_key")
        project = self.gw.settings.projects.get(info.project)
        if project is None:
            raise Forbidden(
                f"the key's project {info.project!r} is not configured on this gateway",
                error_class="project_unknown",
            )
        if rec is not None:
            rec.project, rec.key_id = info.project, info.id
        return info, project

    # --- admit -----------------------------------------------------------------------------------
    async def admit(self, rec: Record, token_cap: int | None, input_estimate: int = 0) -> Admission:
        """The project's limits; a refusal is a 429 that names the limit and carries Retry-After.

        With a daily cost budget the request reserves its most likely worst case, ``token_cap`` (or the
        project's default) at the output price plus ``input_estimate`` at the input price, and its
        admission settles the record's real cost."""
        assert rec.project is not None
        limits = self.gw.limits[rec.project]
        cost_reserve = 0.0
        if limits.cfg.daily_cost_budget_usd is not None:
            cap = token_cap or limits.cfg.default_max_tokens
            cost_reserve = max(
                (p.cost(max(0, input_estimate), cap) for p in self._candidate_prices(rec)), default=0.0
            )
        try:
            admission = await limits.admit(token_cap, input_estimate, cost_reserve)
        except LimitExceeded as e:
            self.gw.metrics.rejections.labels(rec.project, e.limit).inc()
            raise RateLimited(
                e.message,
                error_class=f"limit_{e.limit}",
                code=f"{e.limit}_limit_exceeded",
                retry_after=e.retry_after_header,
                limit=e.limit,
            ) from None
        rec.queue_wait = admission.queue_wait_s
        if limits.cfg.daily_cost_budget_usd is not None:
            return _CostSettling(admission, rec, self)
        return admission

    def _candidate_prices(self, rec: Record) -> list[ModelPrice]:
        """The prices the request may be billed at: its upstream model's when chosen already, else those
        of every deployment of its public model (the reservation takes the dearest)."""
        if rec.upstream_model is not None:
            upstreams = [rec.upstream_model]
        else:
            route = self.gw.settings.models.get(rec.public_model or "")
            upstreams = [d.upstream_model for d in getattr(route, "deployments", None) or []] or [None]
        prices = (self.prices.price(u, rec.public_model) for u in upstreams)
        return [p for p in prices if p is not None]

    # --- send ------------------------------------------------------------------------------------
    async def send(
        self, rec: Record, client: UpstreamClient, path: str, raw: bytes, headers: dict[str, str]
    ) -> UpstreamResult:
        """One upstream call with its retries. The time spent waiting for a connection slot of the
        provider's pool is queue wait, not upstream time."""
        retries = self.gw.metrics.retries

        def on_retry(reason: str) -> None:
            rec.retries += 1
            retries.labels(rec.project, rec.model_label, reason).inc()

        rec.upstream_t0 = time.perf_counter()
        try:
            result = await client.send(path, raw, headers, on_retry, project=rec.project)
        except GatewayError:
            rec.upstream_end = time.perf_counter()
            raise
        rec.retries = result.retries
        if result.slot_wait_s:
            rec.queue_wait += result.slot_wait_s
            rec.upstream_t0 += result.slot_wait_s
        rec.upstream_request_id = result.headers.get("x-request-id") or result.headers.get("request-id")
        return result

    # --- account ---------------------------------------------------------------------------------
    def account(self, rec: Record) -> None:
        """The record's one ledger row (spooled before this returns) and its metrics. Idempotent."""
        if rec.accounted:
            return
        rec.accounted = True
        end = time.perf_counter()
        latency = end - rec.t0
        upstream_s = None
        if rec.upstream_t0 is not None:
            upstream_s = max(0.0, (rec.upstream_end or end) - rec.upstream_t0)
        if rec.cost_usd is None:
            rec.cost_usd = self.cost_of(rec)
        self.gw.ledger.submit(
            {
                "request_id": rec.request_id,
                "ts": rec.ts,
                "endpoint": rec.endpoint,
                "upstream_request_id": rec.upstream_request_id,
                "project": rec.project,
                "key_id": rec.key_id,
                "public_model": rec.public_model,
                "upstream_model": rec.upstream_model,
                "provider": rec.provider,
                "task": rec.task,
                "session_id": rec.session_id,
                "stream": rec.stream,
                "status": rec.status,
                "http_status": rec.http_status,
                "error_class": rec.error_class,
                "retries": rec.retries,
                "input_tokens": rec.input_tokens,
                "output_tokens": rec.output_tokens,
                "tokens_estimated": rec.estimated,
                "cached_input_tokens": rec.cached_input_tokens,
                "cache_write_tokens": rec.cache_write_tokens,
                "latency_ms": latency * 1000,
                "upstream_ms": upstream_s * 1000 if upstream_s is not None else None,
                "ttft_ms": rec.ttft * 1000 if rec.ttft is not None else None,
                "queue_wait_ms": rec.queue_wait * 1000,
                "batch_size": rec.batch_size,
                "deployment": rec.deployment,
                "fallback_from": rec.fallback_from,
                "translation": rec.translation,
                "cost_usd": rec.cost_usd,
            },
            owned=True,
        )
        project = rec.project or "unknown"
        self.gw.metrics.tally(project, rec.model_label, rec.task_label, rec.status).record(
            latency, upstream_s, rec.queue_wait, rec.ttft, rec.input_tokens, rec.output_tokens, rec.cost_usd
        )


class _CostSettling:
    """An admission of a project with a daily cost budget: ``settle`` also settles the record's cost
    (its token counts are final by then), so the endpoints keep calling ``settle(tokens)`` alone."""

    __slots__ = ("inner", "rec", "pipeline")

    def __init__(self, inner: Admission, rec: Record, pipeline: Pipeline) -> None:
        self.inner, self.rec, self.pipeline = inner, rec, pipeline

    @property
    def queue_wait_s(self) -> float:
        return self.inner.queue_wait_s

    def release(self) -> None:
        self.inner.release()

    def settle(self, actual_tokens: int) -> None:
        self.inner.settle(actual_tokens, self.pipeline.cost_of(self.rec) or 0.0)
