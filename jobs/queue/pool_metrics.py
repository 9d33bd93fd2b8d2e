"""The pool's Prometheus metrics (`farm pool serve` with FARM_METRICS_PORT): how long jobs wait for a
worker, and per owner the workers it holds, its share against its target, its decayed usage and its
trials waiting; the pool's workers per GPU type; preemptions and the worker time they lost.

Gauges are read from the store at scrape time (jobs.queue.status: nothing is added to the dispatch loop);
the wait is observed each time a job gets a worker. The owner label is bounded: the MAX_OWNERS owners
holding the most workers (then the most usage) are named, the rest are summed as `other`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from jobs.queue.queue import Queue
from jobs.queue.status import OwnerRow, status

MAX_OWNERS = 50
OTHER = "other"
# a wait of a trial's time (seconds) up to a working day
_WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400, 28800)


_OWNER_GAUGES = (  # OwnerRow field, metric, help
    ("running", "farm_pool_running_workers", "Workers running an owner's trials"),
    ("share", "farm_pool_share", "An owner's share of the pools' workers now"),
    ("target", "farm_pool_target_share", "An owner's target share (weights and past usage)"),
    ("usage_s", "farm_pool_usage_seconds", "An owner's past usage in worker-seconds, decayed to now"),
    ("queued", "farm_pool_queued_trials", "An owner's trials waiting for a worker"),
)


def bounded(rows: list[OwnerRow]) -> dict[str, OwnerRow]:
    """The owner label's values: the busiest MAX_OWNERS by name, the rest summed as `other`."""
    ranked = sorted(rows, key=lambda r: (-r.running, -r.usage_s, r.owner))
    named = {r.owner: r for r in ranked[:MAX_OWNERS]}
    rest = ranked[MAX_OWNERS:]
    if rest:
        named[OTHER] = OwnerRow(
            OTHER, OTHER, sum(r.running for r in rest), {}, sum(r.share for r in rest),
            sum(r.target for r in rest), sum(r.target_workers for r in rest), sum(r.usage_s for r in rest),
            sum(r.queued for r in rest), None, None,
        )  # fmt: skip
    return named


class _PoolCollector(Collector):
    def __init__(self, queue: Queue) -> None:
        self.queue = queue

    def describe(self) -> Iterable[Any]:
        return []  # collected live

    def collect(self) -> Iterator[Any]:
        now = status(self.queue)
        gauges = {key: GaugeMetricFamily(name, text, labels=["owner"]) for key, name, text in _OWNER_GAUGES}
        for owner, row in sorted(bounded(now.owners).items()):
            for key, gauge in gauges.items():
                gauge.add_metric([owner], float(getattr(row, key)))
        workers = GaugeMetricFamily("farm_pool_workers", "The live pools' workers", labels=["gpu_type"])
        for gpu_type, n in sorted(self.queue.served().gpu_types.items(), key=str):
            workers.add_metric([gpu_type or "untyped"], n)
        preempted = CounterMetricFamily("farm_pool_preemptions", "Running trials stopped and requeued")
        preempted.add_metric([], now.preemptions)
        lost = CounterMetricFamily("farm_pool_preempted_seconds", "Worker time lost to preemption")
        lost.add_metric([], now.preempted_s)
        yield from (*gauges.values(), workers, preempted, lost)


class PoolMetrics:
    """One registry per instance, optionally served over HTTP."""

    def __init__(self, queue: Queue, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.wait = Histogram(
            "farm_pool_queue_wait_seconds",
            "How long a job had waited for a worker when it got one",
            ["owner"],
            buckets=_WAIT_BUCKETS,
            registry=self.registry,
        )
        self._owners: set[str] = set()
        self.registry.register(_PoolCollector(queue))
        self._server: Any = None

    def waited(self, owner: str, seconds: float) -> None:
        if owner not in self._owners and len(self._owners) >= MAX_OWNERS:
            owner = OTHER
        self._owners.add(owner)
        self.wait.labels(owner=owner).observe(seconds)

    def serve(self, port: int = 0, addr: str = "127.0.0.1") -> str:
        """Serve /metrics on a background thread; returns its URL (port 0 picks a free one)."""
        self._server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        host, bound = self._server.server_address[:2]
        return f"http://{host}:{bound}/metrics"

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
