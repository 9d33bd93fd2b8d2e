"""Prometheus metrics, one CollectorRegistry per app. Labels: project, model, task, status, reason, limit.

No key, user, session or request id is ever a label. ``task`` is bounded by the project's configured
task list (anything else is labelled ``other``) and ``model`` by the configured routes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from gateway.limits import Limits

if TYPE_CHECKING:
    from gateway.ledger import LedgerWriter

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)


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


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        pmt = ["project", "model", "task"]
        self.requests = Counter(
            "gateway_requests", "Client requests by outcome", pmt + ["status"], registry=r
        )
        self.input_tokens = Counter("gateway_input_tokens", "Input tokens reported upstream", pmt, registry=r)
        self.output_tokens = Counter(
            "gateway_output_tokens", "Output tokens reported upstream", pmt, registry=r
        )
        self.latency = Histogram(
            "gateway_request_latency_seconds",
            "End-to-end latency of a client request",
            ["project", "model", "status"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_latency = Histogram(
            "gateway_upstream_latency_seconds",
            "Time spent waiting on the upstream (retries included)",
            ["project", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Latency the gateway itself adds (end to end minus upstream and queue wait)",
            ["project", "model"],
            buckets=_OVERHEAD_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Time to the first streamed byte reaching the client",
            ["project", "model"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Wait for a concurrency slot",
            ["project"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "gateway_upstream_retries",
            "Upstream retries by reason",
            ["project", "model", "reason"],
            registry=r,
        )
        self.rejections = Counter(
            "gateway_rejections", "Requests rejected by a project limit", ["project", "limit"], registry=r
        )
        self.in_flight = Gauge(
            "gateway_in_flight", "Requests holding a concurrency slot", ["project"], registry=r
        )
        self.queue_depth = Gauge(
            "gateway_queue_depth", "Requests waiting for a slot", ["project"], registry=r
        )
        self.budget_remaining = Gauge(
            "gateway_daily_budget_remaining_tokens", "Tokens left in today's budget", ["project"], registry=r
        )
        self.budget = Gauge(
            "gateway_daily_budget_tokens", "Today's token budget as configured", ["project"], registry=r
        )

        # labels() costs ~2 us a call (a lock and a dict behind it): the request path reuses the children.
        # Bounded like the labels themselves (configured projects, models and tasks, plus unknown/other).
        self._children: dict[tuple[str, str, str, str], RequestChildren] = {}

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
            )
        return c

    def bind_limits(self, limits: Limits) -> None:
        """Gauges read live from the limiters at scrape time (nothing on the request path)."""
        for name, pl in limits.projects.items():
            self.in_flight.labels(name).set_function(lambda pl=pl: pl.in_flight)
            self.queue_depth.labels(name).set_function(lambda pl=pl: pl.waiting)
            if pl.cfg.daily_token_budget is not None:
                self.budget_remaining.labels(name).set_function(lambda pl=pl: pl.budget_remaining() or 0)
                self.budget.labels(name).set(pl.cfg.daily_token_budget)

    def bind_ledger(self, writer: LedgerWriter) -> None:
        """The ledger writer's backlog and counters, read at scrape time."""
        self.registry.register(_LedgerCollector(writer))


class _LedgerCollector:
    def __init__(self, writer: LedgerWriter) -> None:
        self._w = writer

    def describe(self):
        return self._families(0, 0.0, 0, 0, 0, 0, 0)

    def collect(self):
        w = self._w
        return self._families(
            w.pending_rows, w.oldest_pending_s(), w.written, w.dropped, w.failed_flushes, w.spool_errors,
            w.replayed,
        )  # fmt: skip

    @staticmethod
    def _families(pending, oldest, written, dropped, failures, spool_errors, replayed):
        return [
            GaugeMetricFamily("gateway_ledger_pending_rows", "Ledger rows not yet written", value=pending),
            GaugeMetricFamily(
                "gateway_ledger_oldest_pending_seconds",
                "Age of the oldest unwritten ledger row",
                value=oldest,
            ),
            CounterMetricFamily("gateway_ledger_written_rows", "Ledger rows written", value=written),
            CounterMetricFamily(
                "gateway_ledger_dropped_rows", "Ledger rows refused for their data and dropped", value=dropped
            ),
            CounterMetricFamily(
                "gateway_ledger_flush_failures", "Ledger flushes that failed (rows kept)", value=failures
            ),
            CounterMetricFamily(
                "gateway_ledger_spool_errors", "Ledger rows the spool could not write", value=spool_errors
            ),
            CounterMetricFamily(
                "gateway_ledger_replayed_rows",
                "Rows of a previous process written from the spool",
                value=replayed,
            ),
        ]
