"""The ray part of `python -m benchmarks queue-scale` (benchmarks/queue_scale.py): one job of many no-op
trials served from the queue on PostgreSQL by the pool's own loop (jobs.queue.pool.serve) on logical
workers of a `ray.cluster_utils` cluster (nodes of 16 logical GPUs each), in this process.

Every 10 s (a window) it reads how many trials the pool has written and the time the pool spent in
statements on the store meanwhile (queue_scale.StoreClock on the pool's engine: claims, results, logs,
beats, finishes); every fourth window it times `farm jobs list` (its own engine, not counted); every
sixth it vacuums and analyzes the store's queue and trial tables as autovacuum would on a team's server
(the server the tests start, and so this one, runs without autovacuum; without it a pending trial's
index range keeps the entries of every trial written since, and a claim reads through them). It stops
when the job completes or `budget_s` after its first trial was written, and says how many ran.
"""

from __future__ import annotations

import os
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
STARTUP_S = 1200.0  # the longest wait for the first trial (64 workers start in minutes on 2 cores)
VACUUM_EVERY = 6  # windows: autovacuum's default naptime (60 s), as a team's server runs it


def _vacuum(store: Any) -> None:
    """What autovacuum does on a team's server (the server tests/pgserver.py starts runs without it):
    the queue's tables and the trials vacuumed and analyzed, on a connection of its own (its time is not
    the pool's)."""
    from sqlalchemy import create_engine

    engine = create_engine(store.url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(
                "VACUUM (ANALYZE) trial_claims, job_queue, jobs, job_events, trials, samples"
            )
    finally:
        engine.dispose()


def _cluster(workers: int) -> Any:
    """A throwaway cluster on this machine, as the multi-node tests make theirs (tests/conftest.py: no
    token between its own processes, no usage report)."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
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
    from benchmarks.queue_scale import ServerClock, StoreClock, WaitSampler, jobs_list_s, per_trial
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
    clock, server = StoreClock(store.engine), ServerClock(store.url)
    waits = WaitSampler(store.url).start()
    rows: list[dict] = []
    lists: list[float] = []
    started = time.perf_counter()
    first: list[float | None] = [None]  # when the first trial was written: the budget counts from there
    server_from = [0]  # trials written when the server's clock was reset

    def watch() -> None:  # the pool runs in the main thread (Ray's driver); this one watches it
        while not options.stop.is_set():
            before, at = written[0], time.perf_counter()
            clock.reset()
            if options.stop.wait(window_s):
                return
            n, s = clock.reset()
            rows.append({"trials": written[0] - before, "store_s": s, "statements": n,
                         "wall_s": time.perf_counter() - at})  # fmt: skip
            if written[0] and len(rows) % 4 == 0:
                lists.append(jobs_list_s(store.url, repeat=0))
            print(f"ray: {written[0]:,} of {trials:,} trials written; last window {rows[-1]}", flush=True)
            if written[0] and first[0] is None:
                first[0] = time.perf_counter()
                server.reset()  # the server's time from the first trial written (the workers' start left out)
                server_from[0] = written[0]
            if len(rows) % VACUUM_EVERY == 0:
                _vacuum(store)
            late = first[0] is None and time.perf_counter() - started >= STARTUP_S  # no worker came up
            if written[0] >= trials or late or (first[0] and time.perf_counter() - first[0] >= budget_s):
                options.stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        serve(store, options)
    finally:
        options.stop.set()
        watcher.join(60)
        clock.close()
        session.disconnect()
        cluster.shutdown()
    out = {
        "trials asked": trials,
        "trials written": written[0],
        "job status": store.get_job(job).status,
        "workers": workers,
        "seconds": time.perf_counter() - started,
        "seconds from the first trial written": time.perf_counter() - (first[0] or started),
        "statements that took longest (count, s)": clock.top(),
        **per_trial(server.read(), written[0] - server_from[0], top=8),
        "server backends active, by statement and wait (samples)": waits.close(),
        **_windows(rows),
    }
    if lists:
        out["farm jobs list s (median while it ran)"] = statistics.median(lists)
        out["farm jobs list s (max while it ran)"] = max(lists)
    print(out, flush=True)
    return out
