"""The ray part of `python -m benchmarks queue-scale` (benchmarks/queue_scale.py): one job of many no-op
trials served from the queue on PostgreSQL by the pool's own loop (jobs.queue.pool.serve) on logical
workers of a `ray.cluster_utils` cluster (nodes of 16 logical GPUs each), in this process.

Every `--window-s` seconds it reads how many trials the pool has written and the time the pool spent in
statements on the store meanwhile (queue_scale.StoreClock on the pool's engine: claims, results, logs,
beats, finishes); every fourth window it times `farm jobs list` (its own engine, not counted). It stops
when the job completes or after `budget_s`, and says how many of the trials ran.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

SPEC = """
name: queue-scale
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {n}}}}}
measure: {{warmup_ms: 0, min_samples: 1, max_samples: 1, max_time_s: 0.05}}
timeout_s: 60
"""
NODE_GPUS = 16


def _cluster(workers: int) -> Any:
    from ray.cluster_utils import Cluster

    nodes = max(1, -(-workers // NODE_GPUS))
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": min(workers, NODE_GPUS)}
    )
    for i in range(1, nodes):
        cluster.add_node(num_cpus=1, num_gpus=min(NODE_GPUS, workers - i * NODE_GPUS))
    cluster.wait_for_nodes()
    return cluster


def _job(store: Any, trials: int) -> int:
    from jobs.queue.queue import Queue
    from jobs.spec.sweep import loads_spec

    spec = loads_spec(SPEC.format(n=list(range(trials))))
    return Queue(store).submit(spec, owner="scale")


def _windows(rows: list[dict]) -> dict[str, Any]:
    """The windows with trials written, in thirds: start, middle, end."""
    busy = [r for r in rows if r["trials"]]
    if not busy:
        return {}
    third = max(1, len(busy) // 3)
    parts = {"start": busy[:third], "middle": busy[third : 2 * third], "end": busy[2 * third :]}
    out: dict[str, Any] = {}
    for name, part in parts.items():
        if not part:
            continue
        n = sum(r["trials"] for r in part)
        out[f"store ms per trial ({name})"] = 1e3 * sum(r["store_s"] for r in part) / n
        out[f"statements per trial ({name})"] = sum(r["statements"] for r in part) / n
        out[f"trials per second ({name})"] = n / sum(r["wall_s"] for r in part)
    return out


def ray_part(store: Any, trials: int, workers: int, budget_s: float, window_s: float = 10.0) -> dict:
    from benchmarks.queue_scale import StoreClock, jobs_list_s
    from cluster import session
    from jobs.queue.pool import PoolOptions, serve
    from jobs.run.runner import RunOptions

    cluster = _cluster(workers)
    written = [0]

    def observed(_result: Any, _worker: Any) -> None:
        written[0] += 1

    job = _job(store, trials)
    run = RunOptions(address=cluster.address, gpus=workers, show_progress=False, echo=lambda _m: None,
                     oversubscribe=True, observer=observed, ready_wait_s=600.0)  # fmt: skip
    options = PoolOptions(run=run, idle_exit_s=5.0)
    clock = StoreClock(store.engine)
    pool = threading.Thread(target=serve, args=(store, options), daemon=True)
    started = time.perf_counter()
    pool.start()
    rows: list[dict] = []
    lists: list[float] = []
    try:
        while pool.is_alive() and time.perf_counter() - started < budget_s:
            before, at = written[0], time.perf_counter()
            clock.reset()
            options.stop.wait(window_s)
            n, s = clock.reset()
            rows.append({"trials": written[0] - before, "store_s": s, "statements": n,
                         "wall_s": time.perf_counter() - at})  # fmt: skip
            if written[0] and len(rows) % 4 == 0:
                lists.append(jobs_list_s(store.url, repeat=0))
            print(f"ray: {written[0]:,} of {trials:,} trials written; last window {rows[-1]}", flush=True)
    finally:
        options.stop.set()
        pool.join(300)
        clock.close()
        session.disconnect()
        cluster.shutdown()
    out = {
        "trials asked": trials,
        "trials written": written[0],
        "job status": store.get_job(job).status,
        "workers": workers,
        "seconds": time.perf_counter() - started,
        **_windows(rows),
    }
    if lists:
        out["farm jobs list s (median while it ran)"] = statistics.median(lists)
        out["farm jobs list s (max while it ran)"] = max(lists)
    print(out, flush=True)
    return out
