"""Upstream clients: one per provider, each a fair slot scheduler in front of a transport
(gateway.upstream.transport: an aiohttp session and connection pool), and the retry loop.

Nothing above this module sees an aiohttp or asyncio exception: ``UpstreamClient.send`` and the
``read()`` / ``readany()`` of the response it returns raise only ``gateway.errors`` kinds
(``UpstreamUnreachable``, ``UpstreamTimeout``, ``UpstreamDisconnected``, ``UpstreamTooLarge``; ``BadRequest``
for a header that cannot be sent). An upstream's own error answer is not an exception: it comes back as an
``UpstreamResult`` with its status and body.

**Fair slots.** A provider has ``max_connections`` slots, shared fairly between projects, given to its client
by the limits (a ``gateway.limits.base.ProviderSlots``, ``Limiters.provider``). A request holds one from the
moment it is sent until its response is released or closed (a stream holds it to its end); the waits between
retries do not hold one. The time spent waiting for a slot is returned as ``slot_wait_s``: queueing, not
upstream time.

**Retries.** Retried: 408, 409, 429, 5xx, and connection failures where nothing of the response came back
(refused, DNS, connect timeout, a connection dropped before the head), with backoff
``base * 2**n`` capped, plus jitter. An upstream ``Retry-After`` (or ``retry-after-ms``) is honoured up to
``max_retry_after_s``; a longer one is handed to the client instead of being waited out. The total wait
across retries is capped too. Never retried: any other 4xx (a 400 above all), a read timeout, a response
over the caps, or anything once a response's head has been returned to the caller.

**Plans.** The loop itself (``send_planned``) asks a plan where each attempt goes: ``UpstreamClient.send``
uses a plan of one target (itself); gateway.upstream.routing's ``RoutePlan`` spreads a public model's attempts
over its deployments and fallback models. A plan may move a retry to another target at once instead of backing
off; the rules above still bound the attempts (``max_retries``), and a 400 is never retried, except that a
plan may re-send a context-window error once to a longer-context model. A plan gives each attempt's path, body
and headers (``request``): a target of another wire format gets a translated request
(gateway.http.targets).
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Protocol

from multidict import CIMultiDictProxy

from gateway.config import ProviderConfig, RetryConfig
from gateway.errors import BadRequest, GatewayError, UpstreamBadAnswer, UpstreamError, UpstreamTimeout
from gateway.upstream.transport import (
    AiohttpTransport,
    Transport,
    TransportResponse,
    check_headers,
    retry_reason,
)

if TYPE_CHECKING:
    from gateway.config import GatewaySettings
    from gateway.limits.base import ProviderSlots

log = logging.getLogger("gateway.upstream.client")

RETRYABLE_STATUS = frozenset({408, 409, 429})
# Headers the gateway sets itself; a caller passing one is refused rather than overriding the provider key or
# the framing.
RESERVED_HEADERS = frozenset(
    {"authorization", "x-api-key", "proxy-authorization", "host", "content-length", "transfer-encoding",
     "connection", "upgrade", "te", "trailer", "keep-alive", "cookie"}
)  # fmt: skip


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def status_failure_kind(status: int) -> str:
    """The failure class of a retryable status (metrics label, gateway.upstream.routing's cooldowns and
    fallbacks)."""
    if status == 429:
        return "rate_limit"
    if status == 408:
        return "timeout"
    return "server_error" if status >= 500 else "other"


def error_failure_kind(err: UpstreamError) -> str:
    """The failure class of an attempt that raised: timeout (read or connect), connect, or other."""
    reason = retry_reason(err)
    if isinstance(err, UpstreamTimeout) or reason == "connect_timeout":
        return "timeout"
    if reason is not None:  # refused, DNS, dropped before the head
        return "connect"
    return "other"


def auth_headers(kind: str, api_key: str, who: str, env: str | None) -> dict[str, str]:
    """The header carrying an upstream key for a provider ``kind``; ValueError naming ``who`` and the
    variable ``env`` when the key cannot be sent (a line break, a non-ASCII character)."""
    auth = {"x-api-key": api_key} if kind == "anthropic" else {"Authorization": f"Bearer {api_key}"}
    try:
        check_headers(auth)
    except BadRequest:
        raise ValueError(f"{who}: the API key in ${env} has a line break or a non-ASCII character") from None
    return auth


MAX_RETRY_AFTER_S = 86_400.0  # an upstream's Retry-After is believed up to a day


def _seconds(v: float) -> float | None:
    """A delay within 0..MAX_RETRY_AFTER_S; None for NaN (no delay was said)."""
    if v != v:
        return None
    return min(max(0.0, v), MAX_RETRY_AFTER_S)


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date), within
    0..MAX_RETRY_AFTER_S (``inf`` or ``1e400`` is the most); None when absent or unreadable."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            found = _seconds(float(ms) / 1000)
        except ValueError:
            found = None
        if found is not None:
            return found
    ra = headers.get("Retry-After")
    if not ra:
        return None
    try:
        return _seconds(float(ra))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(ra)
    except (TypeError, ValueError, OverflowError):
        return None
    try:
        return _seconds(when.timestamp() - time.time())
    except (OverflowError, ValueError, OSError):
        return None


def _is_answer(status: int) -> bool:
    """Whether a status below 400 can carry an answer of these APIs: 2xx with a body. 1xx as a final
    status, 204/205 (no body) and 3xx (the gateway follows no redirect) cannot."""
    return 200 <= status < 300 and status not in (204, 205)


def client_retry_after(headers: Mapping[str, str]) -> str | None:
    """A plain ``Retry-After: <whole seconds>`` for the client from the upstream's headers (seconds, HTTP
    date or ``retry-after-ms``), at least 1 (an upstream's 0 or past date would make clients retry in a
    tight loop); None when the upstream sent none."""
    seconds = parse_retry_after(headers)
    if seconds is None:
        return None
    return str(max(1, math.ceil(seconds)))


# --- responses and results -----------------------------------------------------------------------
class UpstreamResponse:
    """An upstream response whose head has arrived, holding its provider slot. Read the body whole
    (``read()``) or as it arrives (``readany()``, b"" at the end), then ``release()`` it (the connection is
    kept when the body was read to its end) or ``close()`` it (the connection is dropped: the upstream sees
    the request cancelled). Either frees the slot; so does a failed read. Reads raise only gateway.errors
    kinds."""

    __slots__ = ("_r", "_slots", "_project", "_on_done", "status", "headers")

    def __init__(
        self,
        r: TransportResponse,
        slots: ProviderSlots | None,
        project: str,
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self._r = r
        self._slots = slots
        self._project = project
        self._on_done = on_done  # called once when the slot is freed (the plan's in-flight count)
        self.status = r.status
        self.headers = r.headers

    @property
    def content(self) -> UpstreamResponse:
        """``content.readany()`` works too, as on an aiohttp response."""
        return self

    async def readany(self) -> bytes:
        try:
            return await self._r.readany()
        except GatewayError:
            self.close()
            raise

    def at_eof(self) -> bool:
        """The body has been read to its end: the caller can finish without another ``readany``."""
        return self._r.at_eof()

    async def read(self) -> bytes:
        try:
            return await self._r.read()
        except GatewayError:
            self.close()
            raise

    def release(self) -> None:
        self._r.release()
        self._free()

    def close(self) -> None:
        self._r.close()
        self._free()

    def _free(self) -> None:
        slots, self._slots = self._slots, None
        if slots is not None:
            slots.release(self._project)
            if self._on_done is not None:
                self._on_done()

    def __del__(self) -> None:
        if self._slots is not None:  # never released: a bug above; don't let the provider lose the slot
            log.warning("an upstream response was dropped without release() or close()")
            try:
                self.close()
            except Exception:  # pragma: no cover - the loop may be gone at exit
                pass


@dataclass(slots=True)
class UpstreamResult:
    """The final attempt. On success (status < 400) ``response`` is open and holds a provider slot; read it,
    then release or close it. On an error status ``body`` holds the upstream's answer (read already, at most
    ``max_response_bytes``) and ``response`` is None."""

    status: int
    headers: CIMultiDictProxy[str]
    response: UpstreamResponse | None
    body: bytes | None = None
    retries: int = 0
    retry_wait_s: float = 0.0
    retry_reasons: list[str] = field(default_factory=list)
    slot_wait_s: float = 0.0  # waiting for a provider slot (queueing, not upstream time), all attempts
    target: Any = None  # the plan's target of the final attempt (gateway.upstream.routing: a Deployment)


# --- the client ----------------------------------------------------------------------------------
class UpstreamClient:
    """One provider: its fair slots (``slots``, given by the limits: ``Limiters.provider``), its transport,
    the retry loop. ``transport``: another Transport than the default AiohttpTransport (tests, another HTTP
    library); it then sends the provider key itself."""

    def __init__(
        self,
        name: str,
        cfg: ProviderConfig,
        retry: RetryConfig,
        api_key: str | None,
        *,
        slots: ProviderSlots,
        transport: Transport | None = None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.retry = retry
        self.base_url = cfg.base_url.rstrip("/")
        auth: dict[str, str] = {}
        if api_key:
            auth = auth_headers(cfg.kind, api_key, f"provider {name!r}", cfg.api_key_env)
        self._auth_headers = auth
        self.slots = slots
        self._transport: Transport | None = transport
        self._started = False

    @property
    def transport(self) -> Transport | None:
        return self._transport

    async def start(self) -> None:
        if self._transport is None:
            self._transport = AiohttpTransport(
                self.name,
                self.base_url,
                connect_timeout=self.cfg.connect_timeout_s,
                read_timeout=self.cfg.read_timeout_s,
                max_connections=self.cfg.max_connections,
                max_response_bytes=self.cfg.max_response_bytes,
                ca_file=self.cfg.ca_file,
                default_headers=self._auth_headers,
            )
        await self._transport.start()
        self._started = True

    async def close(self) -> None:
        if self._transport is not None and self._started:
            self._started = False
            await self._transport.close()

    def _backoff(self, attempt: int) -> float:
        r = self.retry
        return min(r.backoff_cap_s, r.backoff_base_s * (2**attempt)) + random.uniform(0, r.jitter_s)

    async def send(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        on_retry: Callable[[str], None] | None = None,
        *,
        project: str | None = None,
    ) -> UpstreamResult:
        """POST ``body`` to ``base_url + path`` with retries. ``headers``: the request's own (content type,
        API version, beta flags); the provider key is added here. ``project`` names the fair share the
        request's provider slot comes from. ``on_retry(reason)`` is called before each retry's wait.
        An UpstreamError raised here carries ``slot_wait_s`` too (getattr: absent on a BadRequest)."""
        return await send_planned(
            _OneTarget(self, body), self.retry, path, headers, on_retry, project=project
        )

    async def _read_error(self, resp: TransportResponse) -> bytes:
        """An error answer's body (b"" when it cannot be read whole); the response is done after it."""
        try:
            return await resp.read()
        except GatewayError:
            return b""
        finally:
            resp.release()


class Plan(Protocol):
    """Where a request's attempts go (``send_planned``); gateway.upstream.routing.RoutePlan is the full
    one."""

    def first(self) -> Any: ...
    def request(
        self, target: Any, path: str, headers: Mapping[str, str]
    ) -> tuple[str, bytes, Mapping[str, str]]: ...
    def begin(self, target: Any) -> None: ...
    def done(self, target: Any) -> None: ...
    def answered(self, target: Any) -> None: ...
    def failed(self, target: Any, kind: str, retry_after: float | None) -> None: ...
    def switch(self, target: Any, kind: str, same_model: bool) -> Any | None: ...
    def again(self, target: Any) -> Any: ...
    def context_fallback(self, target: Any, status: int, body: bytes | None) -> Any | None: ...

    # optional: ``claim`` (an attribute, None or an async function), awaited before each attempt with its
    # target; it gives the target to use (the same, or another when the first is at its shared limits)


class _OneTarget:
    """The plan of ``UpstreamClient.send``: every attempt to that client, with its own key."""

    __slots__ = ("client", "auth", "_body")

    def __init__(self, client: UpstreamClient, body: bytes) -> None:
        self.client, self.auth, self._body = client, None, body

    def first(self) -> _OneTarget:
        return self

    def request(
        self, target: Any, path: str, headers: Mapping[str, str]
    ) -> tuple[str, bytes, Mapping[str, str]]:
        return path, self._body, headers

    def begin(self, target: Any) -> None:
        pass

    def done(self, target: Any) -> None:
        pass

    def answered(self, target: Any) -> None:
        pass

    def failed(self, target: Any, kind: str, retry_after: float | None) -> None:
        pass

    def switch(self, target: Any, kind: str, same_model: bool) -> None:
        return None

    def again(self, target: Any) -> _OneTarget:
        return self

    def context_fallback(self, target: Any, status: int, body: bytes | None) -> None:
        return None


@dataclass(slots=True)
class _Tally:
    """The running counts of one request's attempts (``send_planned``)."""

    key: str  # the project whose fair share the provider slots come from
    attempt: int = 0
    waited: float = 0.0  # between attempts
    slot_wait: float = 0.0  # for provider slots
    reasons: list[str] = field(default_factory=list)

    def result(
        self, status: int, headers: Any, response: UpstreamResponse | None, body: bytes | None, target: Any
    ) -> UpstreamResult:
        return UpstreamResult(
            status, headers, response, body, self.attempt, self.waited, self.reasons, self.slot_wait, target
        )


async def send_planned(
    plan: Plan,
    r: RetryConfig,
    path: str,
    headers: Mapping[str, str],
    on_retry: Callable[[str], None] | None = None,
    *,
    project: str | None = None,
) -> UpstreamResult:
    """The retry loop over the targets ``plan`` gives (see the module docstring for the rules). Each attempt
    holds a slot of its target's client. A retryable failure may move to another target at once (the plan's
    ``switch``: another deployment, a fallback model) or is retried after the backoff (``again``); either
    way at most ``max_retries`` retries. ``UpstreamResult.target`` is the final attempt's target."""
    for name in headers:
        if name.lower() in RESERVED_HEADERS:
            raise BadRequest(
                f"header {name!r} is set by the gateway and cannot be forwarded", error_class="bad_header"
            )
    check_headers(headers)
    tally = _Tally(project or "")
    claim = getattr(plan, "claim", None)
    target = plan.first()
    while True:
        if claim is not None:  # the target's shared limits, taken (or another target) before the attempt
            target = await claim(target)
        client = _started_client(target)
        outcome = await _attempt(plan, target, client, path, headers, tally)
        if isinstance(outcome, UpstreamError):
            nxt, delay, reason = _after_failure(plan, r, target, client, outcome, tally)
        elif outcome.response is not None:
            return outcome  # an answer
        else:
            step = _after_error_answer(plan, r, target, client, outcome, tally)
            if step is None:
                return outcome
            nxt, delay, reason = step
        tally.reasons.append(reason)
        if on_retry is not None:
            on_retry(reason)
        if delay:
            log.debug("retrying %s (%s) in %.2fs", client.name, reason, delay)
            await asyncio.sleep(delay)
            tally.waited += delay
        tally.attempt += 1
        target = nxt if nxt is not None else plan.again(target)


def _started_client(target: Any) -> UpstreamClient:
    client: UpstreamClient | None = target.client
    if client is None or client._transport is None or not client._started:
        name = client.name if client is not None else "local"
        raise RuntimeError(f"upstream client {name!r} is not started")
    return client


async def _attempt(
    plan: Plan, target: Any, client: UpstreamClient, path: str, headers: Mapping[str, str], tally: _Tally
) -> UpstreamResult | UpstreamError:
    """One attempt, holding a provider slot of ``client`` while it runs: an answer (its response open, the
    slot held until it is released), the upstream's error answer (its body read, the slot freed), or the
    failure that raised."""
    slots, key = client.slots, tally.key
    tally.slot_wait += await slots.acquire(key)
    plan.begin(target)
    held = True
    try:
        auth = target.auth
        t_path, t_body, t_headers = plan.request(target, path, headers)
        assert client._transport is not None
        resp = await client._transport.post(
            t_path, t_body, t_headers if auth is None else {**t_headers, **auth}
        )
        status = resp.status
        if status < 400 and not _is_answer(status):
            resp.close()
            raise UpstreamBadAnswer(
                f"upstream {client.name!r} answered HTTP {status}, which is no answer to this API "
                "(expected 200 with a body)",
                error_class="upstream_bad_status",
            )
        if status < 400:
            held = False
            plan.answered(target)
            done = (lambda t=target: plan.done(t)) if not isinstance(plan, _OneTarget) else None
            return tally.result(status, resp.headers, UpstreamResponse(resp, slots, key, done), None, target)
        body = await client._read_error(resp)
        return tally.result(status, resp.headers, None, body, target)
    except UpstreamError as e:
        return e
    finally:
        if held:
            slots.release(key)
            plan.done(target)


def _after_failure(
    plan: Plan, r: RetryConfig, target: Any, client: UpstreamClient, err: UpstreamError, tally: _Tally
) -> tuple[Any, float, str]:
    """After an attempt that raised: (the next target or None for ``again``, the wait, the reason), or the
    error raised when it is final (not retryable, out of retries or of waiting time)."""
    reason = retry_reason(err)
    kind = error_failure_kind(err)
    plan.failed(target, kind, None)
    nxt = None
    if tally.attempt < r.max_retries:  # a read timeout is not retried, but may go to a fallback model
        nxt = plan.switch(target, kind, reason is not None)
    if nxt is not None:
        return nxt, 0.0, reason or kind
    delay = client._backoff(tally.attempt)
    if reason is not None and tally.attempt < r.max_retries and tally.waited + delay <= r.max_total_wait_s:
        return None, delay, reason
    if reason is None:
        err.slot_wait_s, err.retry_wait_s = tally.slot_wait, tally.waited
        err.target = target
        raise err
    n = tally.attempt
    final = type(err)(
        f"{err.message} (after {n} {'retry' if n == 1 else 'retries'})", error_class=err.error_class
    )
    final.slot_wait_s, final.retry_wait_s = tally.slot_wait, tally.waited
    final.target = target
    raise final from None


def _after_error_answer(
    plan: Plan, r: RetryConfig, target: Any, client: UpstreamClient, result: UpstreamResult, tally: _Tally
) -> tuple[Any, float, str] | None:
    """After the upstream's error answer: (the next target or None for ``again``, the wait, the reason), or
    None when the answer is final (the request's own fault, out of retries, a wait too long)."""
    status = result.status
    if not is_retryable_status(status):
        plan.answered(target)  # the request's own fault (or the key's): not the deployment's health
        nxt = plan.context_fallback(target, status, result.body)
        return None if nxt is None else (nxt, 0.0, "context_window")
    retry_after = parse_retry_after(result.headers)
    kind = status_failure_kind(status)
    plan.failed(target, kind, retry_after)
    if tally.attempt >= r.max_retries:
        return None
    nxt = plan.switch(target, kind, True)
    if nxt is not None:
        return nxt, 0.0, str(status)
    delay = retry_after if retry_after is not None else client._backoff(tally.attempt)
    if (
        retry_after is not None and retry_after > r.max_retry_after_s
    ) or tally.waited + delay > r.max_total_wait_s:
        return None
    return None, delay, str(status)


def pool_warnings(settings: GatewaySettings) -> list[str]:
    """One line per provider whose ``max_connections`` is below the summed ``max_concurrency`` of the
    projects that can use its models (through any deployment of them or of their fallback models): their
    requests then wait for a connection (fairly shared, the wait counted as queue time)."""
    out = []
    for pname, provider in settings.providers.items():
        if provider.kind == "local":
            continue
        users = {
            proj: cfg.max_concurrency
            for proj, cfg in settings.projects.items()
            if pname in _providers_reached(settings, cfg.models)
        }
        total = sum(users.values())
        if total > provider.max_connections:
            who = ", ".join(f"{p} {n}" for p, n in sorted(users.items()))
            out.append(
                f"provider {pname!r}: max_connections {provider.max_connections} is below the "
                f"{total} requests its projects may have in flight (max_concurrency: {who}); beyond it "
                "requests wait for a connection, shared fairly between projects"
            )
    return out


def _providers_reached(settings: GatewaySettings, models: list[str]) -> set[str]:
    """The providers that requests for ``models`` may reach: their deployments' and their fallbacks'."""
    names = set(models)
    for m in models:
        route = settings.models.get(m)
        if route is not None:
            names.update(route.fallbacks, route.context_window_fallbacks)
    return {d.provider for m in names if m in settings.models for d in settings.models[m].deployments}
