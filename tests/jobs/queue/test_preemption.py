"""Preemption at trial boundaries on the session's real local Ray (issue 47), on SQLite and PostgreSQL:
a pool with `--preempt` stops a long trial of a priority-0 job when a priority-10 job waits with every
worker busy; the stopped trial goes back to the queue with its attempt unchanged, is never a failure, is
not stopped twice (again_after), and every trial of both jobs is written exactly once."""

from __future__ import annotations

import threading
import time

from sqlalchemy import func, select

from jobs.queue.policy import Policy
from jobs.queue.pool import PoolOptions, serve
from jobs.queue.queue import Queue
from jobs.run.runner import RunOptions
from jobs.spec.sweep import loads_spec
from jobs.store import Store, TrialClaim, TrialPreemption

LONG = """
name: long
family: probe
backends: [{name: sleep, baseline: true, configs: {grid: {s: [4]}}}]
shapes: {grid: {n: [0, 1]}}
measure: {warmup_ms: 0, min_samples: 2, max_samples: 2, max_time_s: 5.0, seeds: 1}
timeout_s: 120
"""
CI = """
name: ci
family: probe
backends: [{name: wait, baseline: true, configs: {grid: {ms: [5]}}}]
shapes: {grid: {n: [0, 1]}}
measure: {warmup_ms: 0, min_samples: 2, max_samples: 2, max_time_s: 5.0, seeds: 1}
timeout_s: 60
"""


def _when_both_long_trials_run(url: str, then) -> threading.Thread:
    """Once the store holds claims on both long trials (both workers busy), call `then` (CI submits)."""

    def watch() -> None:
        store = Store(url)
        deadline = time.monotonic() + 180
        with store.engine.connect() as conn:
            while conn.execute(select(func.count()).select_from(TrialClaim)).scalar() < 2:
                assert time.monotonic() < deadline, "the long trials were never both taken"
                time.sleep(0.05)  # another thread's pool writes the claims: polled
                conn.rollback()
        then(store)
        store.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_preempted_trial_is_requeued_unchanged_and_written_exactly_once(ray_local, store_url):
    store = Store(store_url)
    long = Queue(store).submit(loads_spec(LONG), priority=0, owner="explorer")
    ci: list[int] = []
    watcher = _when_both_long_trials_run(
        store_url, lambda s: ci.append(Queue(s).submit(loads_spec(CI), priority=10, owner="ci"))
    )
    policy = Policy.from_dict(
        {"preempt": {"enabled": True, "min_run": 0, "again_after": "1h", "patience": 0}}
    )
    run = RunOptions(gpus=2, show_progress=False, echo=lambda _m: None, oversubscribe=True)
    assert serve(store, PoolOptions(run=run, idle_exit_s=0.5, policy=policy)) == 2
    watcher.join(10)
    assert ci, "CI's job was never submitted"
    with store.engine.connect() as conn:
        stopped = conn.execute(select(TrialPreemption.trial_id, TrialPreemption.job_id)).all()
    assert stopped and {job for _t, job in stopped} == {long}, stopped  # only the priority-0 job yields
    assert len({t for t, _j in stopped}) == len(stopped)  # none stopped twice within again_after
    trials = store.trials(long) + store.trials(ci[0])
    # never a failure, the attempt unchanged, every trial written once with its samples once
    assert all(t.status == "ok" and t.attempt == 1 for t in trials), [(t.status, t.attempt) for t in trials]
    assert all(len(store.samples(t.id)) == 2 for t in trials)
    first_ci = min(t.started_at for t in store.trials(ci[0]))
    rerun = [t for t in store.trials(long) if t.id in {s for s, _j in stopped}]
    assert all(first_ci < t.started_at for t in rerun)  # CI ran in the stopped trial's place
    assert any("preempted by pool-" in e.line for e in Queue(store).events(long))
    assert Queue(store).preemptions()[0] == len(stopped)
    store.close()
