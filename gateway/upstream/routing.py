"""Routing: which deployment of a public model serves an attempt, cooldowns, and fallback models.

A public model has one or more deployments (``models.<m>.deployments`` in the config; the single form
``{provider, upstream_model}`` is one deployment named after its provider). Each is a ``Deployment`` here:
its provider's ``UpstreamClient`` (deployments of one provider share its connection pool and fair slots, so
``max_connections`` still bounds the provider), the upstream model id, and, when it has its own
``api_key_env``, the auth header sent with each of its requests in place of the provider's.

**Picking** (``ModelDeployments.pick``, on every request): a deployment whose cooldown has just ended is
probed first (one request at a time); otherwise, among the deployments neither cooling down nor at their
``rpm``/``tpm``, the model's ``strategy`` chooses (gateway.upstream.strategies): ``weighted`` (the default:
the fewest requests in flight relative to the weight, ties by smooth weighted round-robin, so sequential
requests split exactly by weight), ``latency`` (the lowest recent time to first byte, exploring) or
``least-busy`` (the fewest in flight). The plan keeps why (``RoutePlan.why``, the ``x-farm-route`` header).
With ``routing.health_check_interval_s``, idle deployments get the smallest model call
(gateway.upstream.health). A deployment's rpm/tpm are counted over
one-minute windows by its ``gateway.limits.base.DeploymentLimiter``, which the router is given by the
gateway's limits (``Limiters.deployment``): in this process (``gateway.limits.local``), or, with
``redis_url``, in Redis for every process (``gateway.limits.redis_deployment``). Shared counters are taken
before each attempt (``RoutePlan.claim``, awaited by the retry loop): one atomic check-and-count per attempt,
so the processes together send a deployment at most its rpm within a window; a deployment another process used
up meanwhile is skipped for the rest of its window and the next choice is taken instead.

**Cooldowns** (``RoutingConfig``): a 429 cools a deployment down at once, for its Retry-After when it gives
one; a 5xx, a timeout or a failed connection does once more than ``allowed_fails`` happen in a row. The
cooldown is ``cooldown_s``, doubling with each cooldown in a row, at most ``max_cooldown_s``. Any answer
that is not a failure (a 2xx, a 400) ends the streak. A cooling deployment is skipped while another is
usable; when every one is cooling, the request goes to the model's fallbacks, or else to the deployment
whose cooldown ends first.

**A request's plan** (``RoutePlan``): the retry loop (gateway.upstream.client.send_planned) asks it for the
first
target, tells it of each failure and asks where to go next: another deployment of the same model not yet
tried by this request (at once, without backing off), then the model's ``fallbacks`` in order when the
failure's class is in the project's ``fallback_on``, else the same model again after the usual backoff. A
context-window error (a 400 that says so) is re-sent once to the model's first
``context_window_fallbacks`` entry when ``fallback_on`` has ``context_window``; any other 400 is final.
Fallbacks are operator config: any project allowed the primary model may be served by its fallbacks.
Deployments and fallbacks may speak different wire formats: a target is an explicit ``Deployment`` with its
provider ``kind``, and the request's ``prepare(target)`` gives what to send it (gateway.http.targets
translates the body, path and headers for a target of another kind; the endpoint translates its answer back).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.upstream.client import UpstreamClient, UpstreamResult, auth_headers, send_planned
from gateway.upstream.strategies import (
    WHY_FORCED,
    WHY_LEAST_BUSY,
    WHY_PROBE,
    WHY_SINGLE,
    WHY_WEIGHTED,
    fastest,
    fewest,
    observe,
)

if TYPE_CHECKING:
    from gateway.config import DeploymentConfig, GatewaySettings, ProjectConfig, RoutingConfig
    from gateway.core.metrics import GatewayMetrics
    from gateway.limits.base import DeploymentLimiter, Limiters

log = logging.getLogger("gateway.upstream.routing")

# what a plan's ``prepare(target)`` gives: the body, or (path, body, headers) for a translated target
Prepared = bytes | tuple[str, bytes, Mapping[str, str]]

# failure kinds (metrics label "class") -> the fallback_on class that lets them move to a fallback model
FALLBACK_CLASS = {"rate_limit": "rate_limit", "server_error": "server_error", "timeout": "timeout",
                  "connect": "server_error"}  # fmt: skip


class Deployment:
    """One deployment of one public model and its health; the explicit target of an attempt."""

    __slots__ = (
        "model", "name", "provider", "kind", "upstream_model", "effort", "client", "auth", "weight", "rpm",
        "tpm", "in_flight", "current", "fails", "strikes", "cooldown_until", "probing", "window", "ttfb",
        "samples", "last_begun", "_m_requests", "_m_in_flight", "_m_cooldowns", "_m_errors", "_metrics",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        cfg: DeploymentConfig,
        kind: str,
        client: UpstreamClient | None,
        auth: Mapping[str, str] | None,
        metrics: GatewayMetrics | None,
        window: DeploymentLimiter | None = None,
        window_n: int = 5,
    ) -> None:
        self.model, self.name, self.provider = model, cfg.name, cfg.provider
        self.kind = kind  # the provider's wire format (openai | anthropic | local)
        self.upstream_model = cfg.upstream_model
        self.effort = cfg.effort  # takes an effort hint (gateway.translate.policy.EFFORT)
        self.client = client  # None: a `local` provider (the offline drafter)
        self.auth = auth  # this deployment's own key header, else None (the provider's key)
        self.weight, self.rpm, self.tpm = cfg.weight, cfg.rpm, cfg.tpm
        self.in_flight = 0
        self.current = 0.0  # smooth weighted round-robin
        self.fails = 0  # failures in a row
        self.strikes = 0  # cooldowns in a row
        self.cooldown_until = 0.0  # 0: healthy; else a cooldown ends (or ended: a probe is due) then
        self.probing = False
        self.window = window  # its rpm/tpm (None: neither set), from the gateway's limits
        self.ttfb: float | None = None  # recent time to first byte (timed routers only, strategies.observe)
        self.samples: deque[float] = deque(maxlen=window_n)  # its latest ones (routing.latency_window)
        self.last_begun = 0.0  # when its latest attempt began (timed routers only: the health checks)
        self._metrics = metrics
        self._m_errors: dict[str, Any] = {}
        if metrics is not None:
            self._m_requests = metrics.deployment_requests.labels(model, cfg.name)
            self._m_in_flight = metrics.deployment_in_flight.labels(model, cfg.name)
            self._m_cooldowns = metrics.deployment_cooldowns.labels(model, cfg.name)

    def __repr__(self) -> str:
        return f"Deployment({self.model}/{self.name})"

    # --- limits ----------------------------------------------------------------------------------
    def _limited(self, now: float) -> bool:
        window = self.window
        return window is not None and window.limited(now)

    def usable_at(self, now: float) -> float:
        """When this deployment may next be picked without forcing (``now`` or later)."""
        t = self.cooldown_until if self.cooldown_until > now else now
        if self.window is not None and self.window.limited(now):
            t = max(t, self.window.free_at(now))
        return t

    # --- an attempt's life -----------------------------------------------------------------------
    def begin(self, tokens: int) -> None:
        self.in_flight += 1
        if self.window is not None:
            self.window.begin(tokens)
        if self._metrics is not None:
            self._m_requests.inc()
            self._m_in_flight.inc()

    def done(self) -> None:
        self.in_flight -= 1
        self.probing = False  # a probe that got no verdict (cancelled) is due again
        if self._metrics is not None:
            self._m_in_flight.dec()

    def settle(self, estimate: int, actual: int) -> None:
        if self.window is not None:
            self.window.settle(estimate, actual)

    def ok(self) -> None:
        self.fails = self.strikes = 0
        self.cooldown_until = 0.0
        self.probing = False

    def failed(self, kind: str, retry_after: float | None, cfg: RoutingConfig, now: float) -> None:
        """Count a failure (``kind``: rate_limit | server_error | timeout | connect | other); maybe cool."""
        if self._metrics is not None:
            child = self._m_errors.get(kind)
            if child is None:
                child = self._m_errors[kind] = self._metrics.deployment_errors.labels(
                    self.model, self.name, kind
                )
            child.inc()
        if kind == "other":
            return
        self.fails += 1
        if kind != "rate_limit" and self.fails <= cfg.allowed_fails and not self.probing:
            return
        seconds = retry_after if retry_after is not None else cfg.cooldown_s * 2**self.strikes
        seconds = min(max(seconds, 0.001), cfg.max_cooldown_s)
        self.cooldown_until = now + seconds
        self.strikes += 1
        self.fails = 0
        self.probing = False
        if self._metrics is not None:
            self._m_cooldowns.inc()
        log.info("deployment %s/%s cools down for %.1fs (%s)", self.model, self.name, seconds, kind)


class ModelDeployments:
    """The deployments of one public model, and the picker over them."""

    __slots__ = (
        "model", "kind", "deployments", "fallbacks", "context_window_fallbacks", "_single", "strategy",
        "explore", "rng", "why",
    )  # fmt: skip

    def __init__(
        self,
        model: str,
        deployments: list[Deployment],
        fallbacks: list[str],
        cw: list[str],
        strategy: str = "weighted",
        explore: float = 0.0,
        rng: random.Random | None = None,
    ):
        self.model = model
        self.deployments = deployments
        self.kind = deployments[0].kind
        self.fallbacks = fallbacks
        self.context_window_fallbacks = cw
        self._single = deployments[0] if len(deployments) == 1 else None
        self.strategy = strategy
        self.explore = explore  # strategy latency: the share of requests that explore
        self.rng = rng or random.Random()
        self.why = WHY_SINGLE  # why the latest pick chose its deployment (gateway.upstream.strategies)

    def pick(
        self, now: float, exclude: frozenset[Deployment] | set[Deployment] = frozenset()
    ) -> Deployment | None:
        """The deployment for the next attempt, or None when every one not in ``exclude`` is cooling down
        or at its limits."""
        single = self._single
        if single is not None:  # the plain case: one deployment, nothing to choose
            if single in exclude:
                return None
            if single.cooldown_until == 0.0 and not single._limited(now):
                self.why = WHY_SINGLE
                return single
        usable: list[Deployment] = []
        for d in self.deployments:
            if d in exclude:
                continue
            if d.cooldown_until:
                if d.cooldown_until > now or d.probing:
                    continue
                d.probing = True  # its cooldown is over: this request probes it
                self.why = WHY_PROBE
                return d
            if not d._limited(now):
                usable.append(d)
        if not usable:
            return None
        strategy = self.strategy
        if strategy == "latency":
            chosen, self.why = fastest(usable, self.explore, self.rng)
            return chosen
        self.why = WHY_WEIGHTED if strategy == "weighted" else WHY_LEAST_BUSY
        return fewest(usable, by_weight=strategy == "weighted")

    def force(self, now: float, exclude: set[Deployment] | frozenset[Deployment] = frozenset()) -> Deployment:
        """The deployment usable soonest (every one cools down or is at its limits): tried anyway."""
        pool = [d for d in self.deployments if d not in exclude] or self.deployments
        return min(pool, key=lambda d: d.usable_at(now))


class Router:
    """The deployments of every public model of one gateway. ``clock``: monotonic seconds (tests replace
    it to end a cooldown without sleeping). ``limits``: the gateway's ``Limiters``, which give each
    deployment with an rpm or tpm its ``DeploymentLimiter`` (shared through Redis with ``redis_url``)."""

    def __init__(
        self,
        settings: GatewaySettings,
        clients: Mapping[str, UpstreamClient],
        metrics: GatewayMetrics | None = None,
        *,
        limits: Limiters,
        clock: Callable[[], float] = time.monotonic,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self.cfg = settings.routing
        self.retry = settings.retry
        self.metrics = metrics
        self.clock = clock
        self.rng = random.Random()
        self.models: dict[str, ModelDeployments] = {}
        for model, route in settings.models.items():
            deps = []
            for dc in route.deployments:
                provider = settings.providers[dc.provider]
                auth = None
                if dc.api_key_env:
                    key = environ.get(dc.api_key_env)
                    if key:
                        auth = auth_headers(
                            provider.kind, key, f"deployment {model}/{dc.name}", dc.api_key_env
                        )
                    else:
                        log.warning(
                            "deployment %s/%s: environment variable %s is not set; it uses provider %s's key",
                            model, dc.name, dc.api_key_env, dc.provider,
                        )  # fmt: skip
                window = None
                if dc.rpm is not None or dc.tpm is not None:
                    window = limits.deployment(model, dc.name, dc.rpm, dc.tpm)
                deps.append(
                    Deployment(
                        model,
                        dc,
                        provider.kind,
                        clients.get(dc.provider),
                        auth,
                        metrics,
                        window,
                        self.cfg.latency_window,
                    )  # fmt: skip
                )
            self.models[model] = ModelDeployments(
                model, deps, list(route.fallbacks), list(route.context_window_fallbacks), route.strategy,
                self.cfg.latency_explore, self.rng,
            )  # fmt: skip
        # attempts are timed (time to first byte, when each began) only where something reads the times
        self.timed = self.cfg.health_check_interval_s is not None or any(
            md.strategy == "latency" for md in self.models.values()
        )
        # any deployment counted in Redis: every attempt takes its target's counters first (RoutePlan.claim)
        self.shared = any(
            d.window is not None and d.window.shared for md in self.models.values() for d in md.deployments
        )

    def plan(
        self,
        model: str,
        project: ProjectConfig,
        *,
        tokens: int = 0,
        prepare: Callable[[Deployment], Prepared] | None = None,
    ) -> RoutePlan:
        """The plan of one request for public ``model`` (a configured one). ``tokens``: its estimate for the
        deployments' tpm; ``prepare(target)``: the body to send to a target (its upstream model id), or
        (path, body, headers) when the target needs a request of its own (another wire format)."""
        return RoutePlan(self, self.models[model], project.fallback_on, tokens, prepare)


class RoutePlan:
    """Where one request's attempts go. It sends like an UpstreamClient (``send``), so the pipeline's send
    stage takes either; ``target`` is the deployment of the latest attempt, ``fallback_from`` the public
    model asked for when a fallback model is serving it. ``claim``: awaited by the retry loop before each
    attempt when the router's deployment limits are shared (None otherwise)."""

    __slots__ = (
        "router", "primary", "models", "fallback_on", "tokens", "prepare", "target", "fallback_from",
        "tried", "claim", "_fallbacks", "_cw_used", "_forced", "why", "_t_begin",
    )  # fmt: skip

    def __init__(
        self,
        router: Router,
        primary: ModelDeployments,
        fallback_on: list[str],
        tokens: int,
        prepare: Callable[[Deployment], Prepared] | None,
    ) -> None:
        self.router = router
        self.primary = primary
        self.models = primary  # the model being served now (a fallback once one is used)
        self.fallback_on = fallback_on
        self.tokens = tokens
        self.prepare = prepare
        self.target: Deployment | None = None
        self.fallback_from: str | None = None
        self.tried: set[Deployment] | None = None
        self.claim: Callable[[Deployment], Awaitable[Deployment]] | None = (
            self._claim if router.shared else None
        )
        self._fallbacks: list[str] | None = None
        self._cw_used = False
        self._forced: Deployment | None = None  # the target chosen although at its limits (taken anyway)
        self.why: str | None = None  # why the latest target was chosen (x-farm-route)
        self._t_begin = 0.0  # when the latest attempt began (timed routers only)

    @property
    def kind(self) -> str:
        return self.primary.kind

    async def send(
        self,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        on_retry: Callable[[str], None] | None = None,
        *,
        project: str | None = None,
    ) -> UpstreamResult:
        """The attempts of this request with the gateway's retry rules (gateway.upstream.client.send_planned).
        ``body`` is sent as it is when the plan has no ``prepare``."""
        if self.prepare is None:
            self.prepare = lambda _d: body
        return await send_planned(self, self.router.retry, path, headers, on_retry, project=project)

    # --- the protocol of gateway.upstream.client.send_planned ---------------------------------------------
    def first(self) -> Deployment:
        now = self.router.clock()
        target = self.primary.pick(now)
        self.why = self.primary.why
        if target is None and self._may_fall_back(None):
            target = self._next_fallback(now)
        if target is None:
            target = self._force(self.primary, now)
        self.target = target
        return target

    async def _claim(self, target: Deployment) -> Deployment:
        """Take ``target``'s shared rpm/tpm for the attempt about to go (one atomic step in Redis). When other
        processes used them up meanwhile: the next choice, as ``first`` makes it (another deployment of the
        model being served not yet tried, a fallback model, else the soonest usable, sent anyway)."""
        now = self.router.clock()
        while True:
            window = target.window
            if window is None or not window.shared:
                return target
            # a forced target or a probe (its cooldown is over) goes anyway: it is counted, never refused
            force = target is self._forced or target.cooldown_until != 0.0
            self._forced = None
            if await window.take(now, self.tokens, force):
                return target
            nxt = self.models.pick(now, self.tried or frozenset())
            self.why = self.models.why
            if nxt is None and self._may_fall_back(None):
                nxt = self._next_fallback(now)
            target = nxt if nxt is not None else self._force(self.models, now, self.tried or frozenset())

    def request(
        self, target: Deployment, path: str, headers: Mapping[str, str]
    ) -> tuple[str, bytes, Mapping[str, str]]:
        """What an attempt to ``target`` sends: ``prepare(target)``'s body on the request's own path and
        headers, or its own (path, body, headers) for a target of another wire format."""
        assert self.prepare is not None
        out = self.prepare(target)
        if isinstance(out, bytes):
            return path, out, headers
        return out

    def begin(self, target: Deployment) -> None:
        self.target = target
        target.begin(self.tokens)
        if self.router.timed:
            self._t_begin = target.last_begun = self.router.clock()

    def done(self, target: Deployment) -> None:
        target.done()

    def answered(self, target: Deployment) -> None:
        """A head that is not a failure (2xx, or a 4xx that is the request's own fault)."""
        if target.fails or target.cooldown_until or target.probing:
            target.ok()
        if self.router.timed:
            observe(target, self.router.clock() - self._t_begin)

    def failed(self, target: Deployment, kind: str, retry_after: float | None) -> None:
        target.failed(kind, retry_after, self.router.cfg, self.router.clock())

    def switch(self, target: Deployment, kind: str, same_model: bool) -> Deployment | None:
        """Where to go at once after ``target`` failed (``kind``), without backing off: another deployment of
        the model being served not yet tried (when ``same_model``), else the next fallback model that
        ``fallback_on`` allows; None: retry after the backoff (``again``) or give up."""
        now = self.router.clock()
        tried = self.tried
        if tried is None:
            tried = self.tried = set()
        tried.add(target)
        if same_model:
            nxt = self.models.pick(now, tried)
            if nxt is not None:
                self.why = self.models.why
                return nxt
        if self._may_fall_back(kind):
            return self._next_fallback(now)
        return None

    def again(self, target: Deployment) -> Deployment:
        """The target of a retry after a backoff: the model's best deployment now, or the soonest usable."""
        now = self.router.clock()
        nxt = self.models.pick(now)
        if nxt is None:
            return self._force(self.models, now)
        self.why = self.models.why
        return nxt

    def context_fallback(self, target: Deployment, status: int, body: bytes | None) -> Deployment | None:
        """The target a context-window error is re-sent to (once), or None."""
        if (
            status != 400
            or self._cw_used
            or not self.models.context_window_fallbacks
            or "context_window" not in self.fallback_on
            or not is_context_window_error(target.kind, body)
        ):
            return None
        self._cw_used = True
        models = self.router.models[self.models.context_window_fallbacks[0]]
        now = self.router.clock()
        nxt = models.pick(now)
        self.why = models.why
        return self._move_to(models, nxt or self._force(models, now))

    def settle(self, actual_tokens: int) -> None:
        """The request's real tokens, for its deployment's tpm window."""
        if self.target is not None:
            self.target.settle(self.tokens, actual_tokens)

    # --- fallbacks -------------------------------------------------------------------------------
    def _may_fall_back(self, kind: str | None) -> bool:
        if not self.primary.fallbacks:
            return False
        if kind is None:  # every deployment cools down: any failure class enabled allows it
            return any(c in self.fallback_on for c in ("rate_limit", "server_error", "timeout"))
        cls = FALLBACK_CLASS.get(kind)
        return cls is not None and cls in self.fallback_on

    def _next_fallback(self, now: float) -> Deployment | None:
        if self._fallbacks is None:
            self._fallbacks = list(self.primary.fallbacks)
        while self._fallbacks:
            models = self.router.models[self._fallbacks.pop(0)]
            target = models.pick(now)
            self.why = models.why
            if target is None and not self._fallbacks:
                target = self._force(models, now)  # the last fallback is tried even when it cools down
            if target is not None:
                return self._move_to(models, target)
        return None

    def _force(
        self,
        models: ModelDeployments,
        now: float,
        exclude: set[Deployment] | frozenset[Deployment] = frozenset(),
    ) -> Deployment:
        self._forced = target = models.force(now, exclude)
        self.why = WHY_FORCED
        return target

    def _move_to(self, models: ModelDeployments, target: Deployment) -> Deployment:
        if models is not self.models:
            self.models = models
            self.fallback_from = self.primary.model
            self.why = f"fallback from {self.primary.model}: {self.why}"
            metrics = self.router.metrics
            if metrics is not None:
                metrics.fallbacks.labels(self.primary.model, models.model).inc()
        return target


def is_context_window_error(kind: str, body: bytes | None) -> bool:
    """An upstream 400 saying the prompt does not fit the model's context window. OpenAI: ``error.code ==
    "context_length_exceeded"``; Anthropic: an ``invalid_request_error`` whose message says the prompt is
    too long."""
    if not body:
        return False
    try:
        data = json.loads(body)
    except ValueError:
        return False
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return False
    if kind == "anthropic":
        message = err.get("message")
        return (
            err.get("type") == "invalid_request_error"
            and isinstance(message, str)
            and "prompt is too long" in message.lower()
        )
    return err.get("code") == "context_length_exceeded"
