"""Prometheus metrics, one CollectorRegistry per app. Labels: project, model, task, status, reason, limit.

No key, user, session or request id is ever a label. ``task`` is bounded by the project's configured
task list (anything else is labelled ``other``) and ``model`` by the configured routes.

Several processes (``serve --workers N``, gateway.http.workers): with ``PROMETHEUS_MULTIPROC_DIR`` set, every
process writes its metrics to files there (prometheus_client's multiprocess mode) and ``registry`` is the
exposition of all of them: counters and histograms summed, ``gateway_in_flight``, ``gateway_queue_depth``
and ``gateway_ledger_pending_rows`` summed over live processes, ``gateway_daily_budget_remaining_tokens``,
``gateway_daily_cost_budget_remaining_usd`` and ``gateway_shared_state_up`` their minimum,
``gateway_ledger_oldest_pending_seconds``, ``gateway_daily_budget_tokens`` and
``gateway_daily_cost_budget_usd`` their maximum. The values read live in one process (limits, ledger, shared
state) are copied into the files every ``MIRROR_INTERVAL_S`` and before each scrape (``sync``).
Names and labels are the same either way (no per-process label), so queries need not change.
"""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.core.metrics_live import (
    KeysCollector,
    KeysView,
    LedgerCollector,
    LedgerView,
    PendingUsageView,
    SharedCollector,
    SharedView,
)
from gateway.core.record import own_time

if TYPE_CHECKING:
    from gateway.config import ProjectConfig


# What the scrape-time gauges read from the services (gateway.limits, gateway.store.ledger, gateway.redis):
# structural views, so that this module depends on none of them.
class _ProjectView(Protocol):
    cfg: ProjectConfig

    @property
    def in_flight(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def budget_remaining(self) -> int | None: ...

    def cost_budget_remaining(self) -> float | None: ...


class LimitsView(Protocol):
    @property
    def projects(self) -> Mapping[str, _ProjectView]: ...


_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
MAX_FIELD_LABELS = 100  # distinct (client, dropped field) labels per process; further ones count as "other"
# What the User-Agents of the clients the gateway serves contain -> the client label of the metrics
_CLIENTS = (
    ("claude-cli", "claude-code"),
    ("claude-code", "claude-code"),
    ("codex", "codex"),
    ("openai/python", "openai-sdk"),
    ("openai/js", "openai-sdk"),
    ("anthropic/python", "anthropic-sdk"),
    ("anthropic/js", "anthropic-sdk"),
    ("agents/python", "openai-agents"),
)
MIRROR_INTERVAL_S = 1.0  # multiprocess mode: how stale another process's gauges may be at a scrape


class RequestChildren(NamedTuple):
    """The labelled metric children one (project, model, task, status) request outcome updates."""

    requests: Counter
    latency: Histogram
    input_tokens: Counter
    output_tokens: Counter
    upstream_latency: Histogram
    overhead: Histogram
    ttft: Histogram
    queue_wait: Histogram
    cost: Counter


class _HistTally:
    """The observations of one histogram child since its last drain, kept as prometheus_client keeps them
    (a count per bucket, not cumulative, and their sum) and added to the child in one step per bucket.
    prometheus_client has no public call for that: this reads the child's ``_upper_bounds`` and adds to its
    ``_sum`` and ``_buckets`` values (test_the_request_tally_exposes_what_prometheus_client_would checks
    that a scrape sees what observing each value would give)."""

    __slots__ = ("child", "bounds", "counts", "total")

    def __init__(self, child: Histogram) -> None:
        self.child = child
        self.bounds = tuple(child._upper_bounds)  # ends with +Inf: every finite value has a bucket
        self.counts = [0] * len(self.bounds)
        self.total = 0.0

    def observe(self, v: float) -> None:
        if v == v:  # NaN: in no bucket (as prometheus_client does), and kept out of the sum
            self.counts[bisect_left(self.bounds, v)] += 1
            self.total += v

    def drain(self) -> None:
        counts, total = self.counts, self.total
        if not any(counts):
            return
        self.counts, self.total = [0] * len(counts), 0.0
        child = self.child
        child._sum.inc(total)
        for bucket, n in zip(child._buckets, counts, strict=True):
            if n:
                bucket.inc(n)


def client_label(user_agent: str | None) -> str:
    """The client a User-Agent names, as a bounded metrics label: claude-code, codex, openai-sdk,
    anthropic-sdk, openai-agents, or other."""
    ua = (user_agent or "").lower()
    for mark, label in _CLIENTS:
        if (
            mark in ua
        ):  # "AsyncAnthropic/Python 0.49", "claude-cli/2.1.3 (external, cli)", "codex_cli_rs/0.17"
            return label
    return "other"


class _Timings(Protocol):
    """The timing histograms of one request outcome: RequestChildren's, or RequestTally's own tallies."""

    @property
    def latency(self) -> _HistTally | Histogram: ...
    @property
    def upstream_latency(self) -> _HistTally | Histogram: ...
    @property
    def overhead(self) -> _HistTally | Histogram: ...
    @property
    def ttft(self) -> _HistTally | Histogram: ...
    @property
    def queue_wait(self) -> _HistTally | Histogram: ...


def _observe_times(
    h: _Timings,
    latency: float,
    upstream_s: float | None,
    queue_wait: float,
    ttft: float | None,
    overhead: float | None = None,
) -> None:
    """A request's latency, upstream time (None: it never went upstream) with the gateway's own time
    (``overhead``, as its answer's header says; None: the one that latency leaves,
    gateway.core.record.own_time), time to first byte (None: not streamed) and queue wait (0: none) on the
    histograms ``h``."""
    h.latency.observe(latency)
    if upstream_s is not None:
        h.upstream_latency.observe(upstream_s)
        h.overhead.observe(own_time(latency, upstream_s, queue_wait) if overhead is None else overhead)
    if ttft is not None:
        h.ttft.observe(ttft)
    if queue_wait:
        h.queue_wait.observe(queue_wait)


class RequestTally:
    """What requests of one (project, model, task, status) outcome add to the request metrics, counted in
    plain Python on the request path and added to the metric children by ``drain``, which runs before every
    read of the registry (a scrape, ``get_sample_value``) and, with several processes, every
    ``MIRROR_INTERVAL_S``. prometheus_client takes a lock and several calls per value: updating the
    children on the request path cost 61K instructions a request, 5.6% of the gateway (gateway-ir).
    With several processes (``_WriteThrough``) each request still goes to the children at once."""

    __slots__ = (
        "children", "requests", "input_tokens", "output_tokens", "cost", "latency", "upstream_latency",
        "overhead", "ttft", "queue_wait",
    )  # fmt: skip

    def __init__(self, c: RequestChildren) -> None:
        self.children = c
        self.requests = self.input_tokens = self.output_tokens = 0
        self.cost = 0.0
        self.latency = _HistTally(c.latency)
        self.upstream_latency = _HistTally(c.upstream_latency)
        self.overhead = _HistTally(c.overhead)
        self.ttft = _HistTally(c.ttft)
        self.queue_wait = _HistTally(c.queue_wait)

    def record(
        self,
        latency: float,
        upstream_s: float | None,
        queue_wait: float,
        ttft: float | None,
        input_tokens: int,
        output_tokens: int,
        cost: float | None,
        overhead: float | None = None,
    ) -> None:
        """One request of this outcome: its latency, upstream time (None: it never went upstream), queue
        wait, time to first byte (None: not streamed), tokens, cost (None: unpriced) and the gateway's own
        time (None: what the others leave)."""
        self.requests += 1
        _observe_times(self, latency, upstream_s, queue_wait, ttft, overhead)
        if input_tokens:
            self.input_tokens += input_tokens
        if output_tokens:
            self.output_tokens += output_tokens
        if cost:
            self.cost += cost

    def drain(self) -> None:
        c = self.children
        requests, input_tokens, output_tokens, cost = (
            self.requests, self.input_tokens, self.output_tokens, self.cost
        )  # fmt: skip
        self.requests = self.input_tokens = self.output_tokens = 0
        self.cost = 0.0
        # a counter only grows (prometheus_client refuses less); NaN fails every comparison and is dropped
        if requests > 0:
            c.requests.inc(requests)
        if input_tokens > 0:
            c.input_tokens.inc(input_tokens)
        if output_tokens > 0:
            c.output_tokens.inc(output_tokens)
        if cost > 0:
            c.cost.inc(cost)
        for h in (self.latency, self.upstream_latency, self.overhead, self.ttft, self.queue_wait):
            h.drain()


class _WriteThrough(RequestTally):
    """Multiprocess mode: each request goes to the metric children (their files) at once, so a scrape
    served by any process counts every process's requests at once: recorded, then drained."""

    def record(self, *args: Any, **kwargs: Any) -> None:
        super().record(*args, **kwargs)
        self.drain()


class _Factory:
    """Every metric of a GatewayMetrics on one registry; a gauge's mode (multiprocess_mode) says how the
    processes' values combine."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, doc: str, labels: list[str]) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, labels: list[str], buckets=_LATENCY_BUCKETS) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: list[str], mode: str) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry, multiprocess_mode=mode)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._tallies: dict[tuple[str, str, str, str], RequestTally] = {}
        # multiprocess mode (gateway.http.workers): the metrics below write to files; `registry` serves them
        # all
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self._mirror: _Mirror | None = None
        if self.multiprocess:
            from prometheus_client.multiprocess import MultiProcessCollector

            self._mirror = _Mirror()
            r = CollectorRegistry()  # this process's metrics, never served on their own
            self.registry.register(_SyncFirst(self))
            MultiProcessCollector(self.registry)
        else:
            self.registry.register(_SyncFirst(self))  # first: the tallies are drained before any metric

        f = _Factory(r)
        self._request_metrics(f)
        self._routing_metrics(f)
        self._limit_gauges(f)

        # labels() costs ~2 us a call (a lock and a dict behind it): the request path reuses the children.
        # Bounded like the labels themselves (configured projects, models and tasks, plus unknown/other).
        self._children: dict[tuple[str, str, str, str], RequestChildren] = {}

    def _request_metrics(self, f: _Factory) -> None:
        """Per request: outcomes, tokens, cost, latencies, retries, rejections and dropped fields."""
        pmt = ["project", "model", "task"]
        self.requests = f.counter("gateway_requests", "Client requests by outcome", pmt + ["status"])
        self.input_tokens = f.counter("gateway_input_tokens", "Input tokens reported upstream", pmt)
        self.output_tokens = f.counter("gateway_output_tokens", "Output tokens reported upstream", pmt)
        self.cost = f.counter(
            "gateway_cost_usd",
            "US dollars spent upstream, priced by gateway.core.pricing (models without a price add nothing)",
            pmt,
        )
        self.latency = f.histogram(
            "gateway_request_latency_seconds",
            "End-to-end latency of a client request",
            ["project", "model", "status"],
        )
        self.upstream_latency = f.histogram(
            "gateway_upstream_latency_seconds",
            "Time spent waiting on the upstream (retries included)",
            ["project", "model"],
        )
        self.overhead = f.histogram(
            "gateway_overhead_seconds",
            "Latency the gateway itself adds (end to end minus upstream and queue wait)",
            ["project", "model"],
            _OVERHEAD_BUCKETS,
        )
        self.ttft = f.histogram(
            "gateway_time_to_first_token_seconds",
            "Time to the first streamed byte reaching the client",
            ["project", "model"],
        )
        self.queue_wait = f.histogram(
            "gateway_queue_wait_seconds", "Wait for a concurrency slot", ["project"]
        )
        self.retries = f.counter(
            "gateway_upstream_retries", "Upstream retries by reason", ["project", "model", "reason"]
        )
        # the token account (issue 33): per task, the upstream 429s requests met and the time they waited
        # between attempts; counted only for requests that retried (gateway.http.pipeline.account)
        self.rate_limited = f.counter(
            "gateway_upstream_rate_limited",
            "Upstream 429 answers met by requests (retried, or the last answer)",
            pmt,
        )
        self.retry_wait = f.counter(
            "gateway_upstream_retry_wait_seconds",
            "Time requests waited between upstream attempts (backoff, Retry-After)",
            pmt,
        )
        self.rejections = f.counter(
            "gateway_rejections", "Requests rejected by a project limit", ["project", "limit"]
        )
        self.dropped_fields = f.counter(
            "gateway_translation_dropped_fields",
            "Request fields translation left out, by client and field (gateway.translate.policy)",
            ["client", "field"],
        )
        self._dropped_seen: set[str] = set()  # field labels given so far (at most MAX_FIELD_LABELS)

    def _routing_metrics(self, f: _Factory) -> None:
        # routing (gateway.upstream.routing): per deployment of a public model; both labels come from the
        # config
        md = ["model", "deployment"]
        self.deployment_requests = f.counter(
            "gateway_deployment_requests", "Upstream attempts sent to a deployment", md
        )
        self.deployment_errors = f.counter(
            "gateway_deployment_errors",
            "Failed attempts by class (rate_limit, server_error, timeout, connect, other)",
            md + ["class"],
        )
        self.deployment_cooldowns = f.counter(
            "gateway_deployment_cooldowns", "Cooldowns started for a deployment", md
        )
        self.deployment_in_flight = f.gauge(
            "gateway_deployment_in_flight", "Attempts in flight on a deployment", md, "livesum"
        )
        self.fallbacks = f.counter(
            "gateway_fallbacks", "Requests moved to a fallback model", ["from_model", "to_model"]
        )

    def _limit_gauges(self, f: _Factory) -> None:
        """Read live from the limiters at scrape time (bind_limits)."""
        self.in_flight = f.gauge(
            "gateway_in_flight", "Requests holding a concurrency slot", ["project"], "livesum"
        )
        self.queue_depth = f.gauge(
            "gateway_queue_depth", "Requests waiting for a slot", ["project"], "livesum"
        )
        self.budget_remaining = f.gauge(
            "gateway_daily_budget_remaining_tokens", "Tokens left in today's budget", ["project"], "livemin"
        )
        self.budget = f.gauge(
            "gateway_daily_budget_tokens", "Today's token budget as configured", ["project"], "livemax"
        )
        self.cost_budget_remaining = f.gauge(
            "gateway_daily_cost_budget_remaining_usd",
            "US dollars left in today's cost budget",
            ["project"],
            "livemin",
        )
        self.cost_budget = f.gauge(
            "gateway_daily_cost_budget_usd", "Today's cost budget as configured", ["project"], "livemax"
        )

    def request_children(self, project: str, model: str, task: str, status: str) -> RequestChildren:
        key = (project, model, task, status)
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = RequestChildren(
                self.requests.labels(project, model, task, status),
                self.latency.labels(project, model, status),
                self.input_tokens.labels(project, model, task),
                self.output_tokens.labels(project, model, task),
                self.upstream_latency.labels(project, model),
                self.overhead.labels(project, model),
                self.ttft.labels(project, model),
                self.queue_wait.labels(project),
                self.cost.labels(project, model, task),
            )
        return c

    def dropped(self, client: str, fields: list[str]) -> list[str]:
        """Count a request's dropped fields; returns those this process had not seen before from this
        client (to be logged once). Field names come from clients: past ``MAX_FIELD_LABELS`` distinct
        ones, a new name is labelled "other" (a bounded label set)."""
        new = []
        for f in fields:
            seen = f"{client}\0{f}"
            if seen not in self._dropped_seen:
                if len(self._dropped_seen) >= MAX_FIELD_LABELS:
                    f = "other"
                else:
                    self._dropped_seen.add(seen)
                    new.append(f)
            self.dropped_fields.labels(client, f).inc()
        return new

    def tally(self, project: str, model: str, task: str, status: str) -> RequestTally:
        """The request path's counts for one outcome (see RequestTally)."""
        key = (project, model, task, status)
        t = self._tallies.get(key)
        if t is None:
            kind = _WriteThrough if self.multiprocess else RequestTally
            t = self._tallies[key] = kind(self.request_children(project, model, task, status))
        return t

    def drain(self) -> None:
        """Add the request path's counts to the metrics (before every read of the registry)."""
        for t in self._tallies.values():
            t.drain()

    def bind_limits(self, limits: LimitsView) -> None:
        """Gauges read live from the limiters at scrape time (nothing on the request path)."""
        if self._mirror is not None:
            self._mirror.limits = limits
            self._mirror.budget_gauges = (
                self.in_flight, self.queue_depth, self.budget_remaining, self.budget,
                self.cost_budget_remaining, self.cost_budget,
            )  # fmt: skip
            self.sync()
            return
        for name, pl in limits.projects.items():
            self.in_flight.labels(name).set_function(lambda pl=pl: pl.in_flight)
            self.queue_depth.labels(name).set_function(lambda pl=pl: pl.waiting)
            if pl.cfg.daily_token_budget is not None:
                self.budget_remaining.labels(name).set_function(lambda pl=pl: pl.budget_remaining() or 0)
                self.budget.labels(name).set(pl.cfg.daily_token_budget)
            if pl.cfg.daily_cost_budget_usd is not None:
                remaining = self.cost_budget_remaining.labels(name)
                remaining.set_function(lambda pl=pl: pl.cost_budget_remaining() or 0.0)
                self.cost_budget.labels(name).set(pl.cfg.daily_cost_budget_usd)

    def bind_ledger(self, writer: LedgerView) -> None:
        """The ledger writer's backlog and counters, read at scrape time."""
        if self._mirror is not None:
            self._mirror.bind(LedgerCollector(writer))
            return
        self.registry.register(LedgerCollector(writer))

    def bind_keys(self, keys: KeysView) -> None:
        """How the key store's outages were met (gateway.store.keys), read at scrape time."""
        if self._mirror is not None:
            self._mirror.bind(KeysCollector(keys))
            return
        self.registry.register(KeysCollector(keys))

    def bind_shared(self, shared: SharedView, usage: PendingUsageView) -> None:
        """The shared state's health (gateway.redis.state; only with ``redis_url``) and the usage the shared
        limits still have to add to its counters (gateway.limits.redis), read at scrape time."""
        if self._mirror is not None:
            self._mirror.bind(SharedCollector(shared, usage))
            return
        self.registry.register(SharedCollector(shared, usage))

    # --- multiprocess mode ---------------------------------------------------------------------------
    def sync(self) -> None:
        """The request path's counts into the metrics (``drain``); in multiprocess mode also this process's
        live values (limits, ledger, shared state) into the metrics folder."""
        self.drain()
        if self._mirror is not None:
            self._mirror.sync()

    async def mirror_forever(self, interval_s: float = MIRROR_INTERVAL_S) -> None:
        """``sync`` every ``interval_s`` (run as a task while the app serves, multiprocess mode only)."""
        while True:
            self.sync()
            await asyncio.sleep(interval_s)


class _SyncFirst:
    """Registered before every metric (and the MultiProcessCollector): what the registry reads is fresh."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._m = metrics

    def collect(self):
        self._m.sync()
        return []


# how a collector family's per-process values combine in multiprocess mode (counters always add up)
_GAUGE_MODES = {
    "gateway_ledger_pending_rows": "livesum",
    "gateway_ledger_oldest_pending_seconds": "livemax",
    "gateway_shared_state_up": "livemin",
}


class _Mirror:
    """Multiprocess mode: the scrape-time collectors' families and the limits' gauges, written into the
    multiprocess files as ordinary gauges and counters (counters by their increase since the last sync)."""

    def __init__(self) -> None:
        self.limits: LimitsView | None = None
        # in flight, queue depth, tokens left, token budget, US dollars left, cost budget
        self.budget_gauges: tuple[Gauge, Gauge, Gauge, Gauge, Gauge, Gauge] | None = None
        self._collectors: list = []
        self._gauges: dict[str, Gauge] = {}
        self._counters: dict[str, tuple[Counter, list[float]]] = {}
        self._registry = CollectorRegistry()  # unserved: only holds the names

    def bind(self, collector) -> None:
        for fam in collector.describe():
            if fam.type == "counter":
                c = Counter(fam.name, fam.documentation, registry=self._registry)
                self._counters[fam.name] = (c, [0.0])
            else:
                mode = _GAUGE_MODES.get(fam.name, "livesum")
                self._gauges[fam.name] = Gauge(
                    fam.name, fam.documentation, registry=self._registry, multiprocess_mode=mode
                )
        self._collectors.append(collector)

    def sync(self) -> None:
        if self.limits is not None and self.budget_gauges is not None:
            in_flight, queue_depth, remaining, budget, cost_remaining, cost_budget = self.budget_gauges
            for name, pl in self.limits.projects.items():
                in_flight.labels(name).set(pl.in_flight)
                queue_depth.labels(name).set(pl.waiting)
                if pl.cfg.daily_token_budget is not None:
                    remaining.labels(name).set(pl.budget_remaining() or 0)
                    budget.labels(name).set(pl.cfg.daily_token_budget)
                if pl.cfg.daily_cost_budget_usd is not None:
                    cost_remaining.labels(name).set(pl.cost_budget_remaining() or 0.0)
                    cost_budget.labels(name).set(pl.cfg.daily_cost_budget_usd)
        for collector in self._collectors:
            for fam in collector.collect():
                value = fam.samples[0].value
                if fam.type == "counter":
                    counter, last = self._counters[fam.name]
                    if value > last[0]:
                        counter.inc(value - last[0])
                        last[0] = value
                else:
                    self._gauges[fam.name].set(value)
