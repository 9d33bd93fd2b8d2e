"""A pool's metrics with something to show (jobs.queue.pool_metrics), for the dashboard tests: a store
whose queue has two owners holding workers of a two-type pool, one waiting, past usage charged; the
metrics registered in a registry the caller serves (the farm exporter's)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from jobs.queue.policy import Policy
from jobs.queue.pool_metrics import PoolMetrics
from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec
from jobs.store import Store

SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""


def busy_pool_metrics(path: Path, registry: CollectorRegistry) -> tuple[PoolMetrics, Store]:
    """Pool metrics over a queue in the store at `path` with workers held and waits observed."""
    store = Store(str(path))
    queue = Queue(store, Policy.from_dict({"owners": {"ana": {"weight": 2}}}))
    queue.register_pool("pool-dash", 4, {"H100": 2, "H200": 2})
    for owner, n in (("ana", 4), ("bo", 2), ("cy", 2)):
        queue.submit(loads_spec(SPEC.format(name=owner, grid=list(range(n)))), owner=owner)
    for gpu_type in ("H100", "H100", "H200", "H200"):
        queue.claim("pool-dash", gpu_type)
    queue.charge({"ana": 3600.0, "bo": 600.0})
    metrics = PoolMetrics(queue, registry=registry)
    metrics.waited("cy", 30.0)
    return metrics, store
