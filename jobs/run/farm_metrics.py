"""The farm's Prometheus metrics: what the sweep driver exports while a job runs.

Off unless configured. Either the caller passes a `FarmMetrics` in `RunOptions(metrics=...)` (and owns
its HTTP server), or the runner builds one from the environment for the length of the job:
  FARM_METRICS_PORT=9464          serve /metrics on this port (0 picks a free one; the URL is printed)
  FARM_METRICS_ADDR=127.0.0.1     the address to bind (default 127.0.0.1)
  FARM_METRICS_PUSHGATEWAY=URL    push to a Pushgateway every FARM_METRICS_PUSH_S seconds (default 10)
                                  and once at the end of the job: for jobs shorter than a scrape interval
Labels are bounded: family and backend (the registered kernel families and their backends), status
(the trial outcomes below), node and gpu (the cluster's inventory), kind (ANOMALY_KINDS). Never a trial
id, shape, job id or user.

The runner wires it in with `metrics.listen(listener)`, a tee in front of the store listener that sees
every dispatcher callback, and `metrics.job(family, backends, dispatcher)`, which zero-fills the label
sets the job will use (so the first failure shows up as an increase) and lets the queue length and busy
worker gauges read the dispatcher at scrape time (nothing is added to the dispatch loop).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, push_to_gateway, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from cluster.dispatch import DispatchSnapshot, Listener, WorkerResult, WorkItem
from kernels.base import FINISHED, TrialStatus

log = logging.getLogger(__name__)

# The finished trial statuses (pruned/skipped: finished without running, not failures).
TRIAL_STATUSES = tuple(str(s) for s in FINISHED)
# Anomaly kinds: the analysis step's kinds (jobs/judge/anomalies.py, in progress) plus `other` for anything
# new, so the label stays bounded. `correctness` and `noisy` are seen per trial here; the analysis step
# reports the rest (slower, faster, memory, ...) through `FarmMetrics.anomaly`.
ANOMALY_KINDS = (
    "correctness",
    "slower",
    "faster",
    "ambiguous",
    "noisy",
    "timeout",
    "crashed",
    "error",
    "invalid",
    "memory",
    "hw_fraction",
    "resource",
    "throttled",
    "other",
)
DEFAULT_PORT = 9464

_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
# Kernel medians: 1 us .. 10 s, about three buckets per decade.
_KERNEL_BUCKETS = tuple(m * 10.0**e for e in range(-6, 1) for m in (1, 2, 5)) + (10.0,)


class _Dispatcher(Protocol):
    """What the scrape-time gauges read from cluster.dispatch.Dispatcher."""

    def snapshot(self) -> DispatchSnapshot: ...


@dataclass
class _Job:
    family: str
    dispatcher: _Dispatcher


class _LiveCollector(Collector):
    """Queue length, running trials and workers (ready and busy) per node and GPU, read at scrape time."""

    def __init__(self, owner: FarmMetrics) -> None:
        self.owner = owner

    def describe(self) -> Iterable[Any]:
        return []  # collected live; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queue = GaugeMetricFamily("farm_queue_length", "Trials waiting for a worker", labels=["family"])
        running = GaugeMetricFamily(
            "farm_trials_running", "Trials sent to a worker and not finished", labels=["family"]
        )
        ready = GaugeMetricFamily("farm_workers", "Workers started and ready", labels=["node", "gpu"])
        busy = GaugeMetricFamily("farm_workers_busy", "Workers running a trial", labels=["node", "gpu"])
        job = self.owner._job
        if job is not None:
            snap = job.dispatcher.snapshot()
            queue.add_metric([job.family], snap.queued)
            per_node: dict[tuple[str, str], list[int]] = {}
            for slot in snap.slots:
                if not slot.ready:
                    continue
                key = (str(slot.node or "unknown"), str(slot.gpu_id or "none"))
                counts = per_node.setdefault(key, [0, 0])
                counts[0] += 1
                counts[1] += 1 if slot.in_flight else 0
            running.add_metric([job.family], snap.in_flight)
            for labels, (n_ready, n_busy) in sorted(per_node.items()):
                ready.add_metric(list(labels), n_ready)
                busy.add_metric(list(labels), n_busy)
        yield from (queue, running, ready, busy)


class FarmMetrics:
    """One registry per instance (tests build several side by side), optionally served over HTTP."""

    def __init__(self, registry: CollectorRegistry | None = None, *, pushgateway: str | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.pushgateway = pushgateway
        self.push_interval_s = 10.0
        self._job: _Job | None = None
        self._server: Any = None
        self._server_thread: threading.Thread | None = None
        self._pusher: threading.Thread | None = None
        self._stop_push = threading.Event()
        self.close_after_job = False  # set by from_env: the exporter lives as long as its job
        r = self.registry
        fb = ["family", "backend"]
        self.trials = Counter("farm_trials", "Finished trials by outcome", [*fb, "status"], registry=r)
        self.retries = Counter(
            "farm_trial_retries", "Trials sent again after their worker died", fb, registry=r
        )
        self.duration = Histogram(
            "farm_trial_duration_seconds",
            "Wall time of a trial on its worker (inputs, checks and measurement)",
            fb,
            buckets=_DURATION_BUCKETS,
            registry=r,
        )
        self.kernel_median = Histogram(
            "farm_kernel_median_seconds",
            "Median kernel time of each measured trial",
            fb,
            buckets=_KERNEL_BUCKETS,
            registry=r,
        )
        self.anomalies = Counter("farm_anomalies", "Anomalies found, by kind", ["family", "kind"], registry=r)
        self.workers_lost = Counter(
            "farm_workers_lost", "Worker actors that died or were killed", ["node"], registry=r
        )
        r.register(_LiveCollector(self))

    # ---- construction -----------------------------------------------------------------------------
    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, echo: Callable[[str], None] | None = None
    ) -> FarmMetrics | None:
        """A started exporter when FARM_METRICS_PORT or FARM_METRICS_PUSHGATEWAY is set, else None.

        It is closed when its job ends; `echo` is told where it serves or pushes.
        """
        from jobs.settings import FarmSettings  # a bad value: FarmSettingsError (a ValueError) naming it

        settings = FarmSettings.load(environ)
        port, gateway = settings.metrics_port, settings.metrics_pushgateway
        if port is None and not gateway:
            return None
        m = cls(pushgateway=gateway or None)
        m.push_interval_s = settings.metrics_push_s
        if port is not None:
            m.serve(port, settings.metrics_addr)
        m.close_after_job = True
        if echo is not None:
            where = [w for w in (m.url, gateway and f"push to {gateway}") if w]
            echo(f"farm metrics: {', '.join(where)}")
        return m

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> int:
        """Serve /metrics on a background thread; returns the bound port (port 0 picks a free one)."""
        self._server, self._server_thread = start_http_server(port, addr=addr, registry=self.registry)
        return self.port

    @property
    def port(self) -> int | None:
        return self._server.server_port if self._server is not None else None

    @property
    def url(self) -> str | None:
        if self._server is None:
            return None
        host = self._server.server_address[0]
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop the HTTP server and the pusher (a final push is made by `job` on exit)."""
        self._stop_push.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- the runner's hooks ---------------------------------------------------------------------
    def listen(self, inner: Listener) -> Listener:
        """A listener that records every dispatcher callback here, then passes it on to `inner`."""
        return _MetricsListener(self, inner)

    @contextmanager
    def job(self, family: str, backends: Iterable[str], dispatcher: _Dispatcher) -> Iterator[FarmMetrics]:
        """For the length of a job: zero series for its label sets, live gauges, pushes, then cleanup."""
        for backend in backends:
            for status in TRIAL_STATUSES:
                self.trials.labels(family, backend, status)
            self.retries.labels(family, backend)
            self.duration.labels(family, backend)
            self.kernel_median.labels(family, backend)
        for kind in ANOMALY_KINDS:
            self.anomalies.labels(family, kind)
        self._job = _Job(family, dispatcher)
        self._start_pusher()
        try:
            yield self
        finally:
            self._job = None
            self._stop_push.set()
            if self._pusher is not None:
                self._pusher.join(timeout=5)
                self._pusher = None
            self.push()
            if self.close_after_job:
                self.close()

    def anomaly(self, family: str, kind: str, n: int = 1) -> None:
        """Count an anomaly (the analysis step calls this); unknown kinds are counted as `other`."""
        self.anomalies.labels(family, kind if kind in ANOMALY_KINDS else "other").inc(n)

    def push(self) -> None:
        if not self.pushgateway:
            return
        try:
            push_to_gateway(self.pushgateway, job="kernelfarm", registry=self.registry, timeout=5)
        except OSError as err:  # a missing Pushgateway never fails a sweep
            log.warning("farm metrics: push to %s failed: %s", self.pushgateway, err)

    def _start_pusher(self) -> None:
        if not self.pushgateway or self._pusher is not None:
            return
        self._stop_push.clear()

        def loop() -> None:
            while not self._stop_push.wait(self.push_interval_s):
                self.push()

        self._pusher = threading.Thread(target=loop, name="farm-metrics-push", daemon=True)
        self._pusher.start()

    # ---- recording --------------------------------------------------------------------------------
    def record_finished(self, item: WorkItem, result: WorkerResult) -> None:
        req = item.request
        outcome = result.outcome
        status = outcome.status if outcome.status.finished else TrialStatus.ERROR
        self.trials.labels(req.family, req.backend, status).inc()
        if result.started and result.finished:
            self.duration.labels(req.family, req.backend).observe(max(0.0, result.finished - result.started))
        median_ns = outcome.median_ns
        if status is TrialStatus.OK and median_ns is not None and median_ns == median_ns:
            self.kernel_median.labels(req.family, req.backend).observe(median_ns / 1e9)
        if status is TrialStatus.INCORRECT or outcome.correctness.get("passed") is False:
            self.anomaly(req.family, "correctness")
        summary = outcome.summary
        cv, max_cv = (summary.cv if summary else None), getattr(req.policy, "max_cv", None)
        if cv is not None and max_cv is not None and summary and summary.n >= 2 and cv > max_cv:
            self.anomaly(req.family, "noisy")


class _MetricsListener:
    def __init__(self, metrics: FarmMetrics, inner: Listener) -> None:
        self.metrics = metrics
        self.inner = inner
        self.nodes: dict[str, str] = {}

    def worker_ready(self, slot: str, info: dict[str, Any]) -> None:
        self.nodes[slot] = node = str(info.get("node") or "unknown")
        self.metrics.workers_lost.labels(node)  # a zero series per node, so the first loss is an increase
        self.inner.worker_ready(slot, info)

    def dispatch_started(self, ready: int, wanted: int, waited_s: float) -> None:
        self.inner.dispatch_started(ready, wanted, waited_s)

    def worker_lost(self, slot: str, reason: str, retired: bool) -> None:
        self.metrics.workers_lost.labels(self.nodes.get(slot, "unknown")).inc()
        self.inner.worker_lost(slot, reason, retired)

    def trial_started(self, item: WorkItem, slot: str) -> None:
        self.inner.trial_started(item, slot)

    def trial_finished(self, item: WorkItem, slot: str, result: WorkerResult) -> None:
        self.metrics.record_finished(item, result)
        self.inner.trial_finished(item, slot, result)

    def trial_timed_out(self, item: WorkItem, slot: str, seconds: float) -> None:
        self.metrics.trials.labels(item.request.family, item.request.backend, TrialStatus.TIMEOUT).inc()
        self.metrics.duration.labels(item.request.family, item.request.backend).observe(seconds)
        self.inner.trial_timed_out(item, slot, seconds)

    def trial_crashed(self, item: WorkItem, slot: str, error: str, final: bool) -> None:
        req = item.request
        if final:
            self.metrics.trials.labels(req.family, req.backend, TrialStatus.CRASHED).inc()
        else:
            self.metrics.retries.labels(req.family, req.backend).inc()
        self.inner.trial_crashed(item, slot, error, final)
