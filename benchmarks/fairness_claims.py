"""What the fair-share order costs a claim under load (issue 47): a pool's free worker asks the store's
queue for a trial (`Queue.claim`, the order of jobs.queue.fairshare over the queue's state read from the
store) while 64 jobs of five owners wait, some needing an H200 or 100 GB, some at priority 5, with past
usage charged; 16 workers (8 H100, 8 H200) stay busy (the oldest trial is written and finished, untimed,
before each claim). On SQLite and on a throwaway PostgreSQL server (tests/pgserver.py, as the scale
benchmark starts it). Also the order's own part: `Plan.pick` on the same state in memory, with best fit
and without (policy.best_fit 0), so the rule's cost reads against the claim's.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections import deque
from pathlib import Path

from jobs.queue.fairshare import Plan
from jobs.queue.policy import Policy
from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec
from jobs.store.results import result_of

SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""
OWNERS = ("ana", "bo", "cy", "dee", "ci")
TYPES = ("H100",) * 8 + ("H200",) * 8


def _submit(queue: Queue, jobs: int, trials: int) -> None:
    """`jobs` jobs of the five owners in turn: every third of bo's needs an H200, of cy's 100 GB, one in
    four at priority 5."""
    for i in range(jobs):
        owner = OWNERS[i % len(OWNERS)]
        text = SPEC.format(name=f"{owner}{i}", grid=list(range(trials)))
        if i % 3 == 1 and owner in ("bo", "cy"):
            text += "gpu: {type: H200}\n" if owner == "bo" else "gpu: {min_memory_gb: 100}\n"
        queue.submit(loads_spec(text), owner=owner, priority=5 if i % 4 == 3 else 0)


def _ms(times: list[float]) -> dict[str, float]:
    times = sorted(times)
    return {
        "median_ms": round(1e3 * statistics.median(times), 3),
        "p90_ms": round(1e3 * times[int(0.9 * len(times))], 3),
    }


def claim_cost(store, policy: Policy, claims: int = 200, jobs: int = 64) -> dict[str, float | int]:
    """ms per claim (median, p90) with `jobs` jobs waiting and the 16 workers busy; the order's part."""
    queue = Queue(store, policy)
    _submit(queue, jobs, trials=40)  # 2560 trials: every job still waits after the claims
    queue.charge({"ana": 36_000.0, "bo": 7_200.0, "dee": 600.0})
    busy: deque = deque()
    times: list[float] = []
    for i in range(claims + len(TYPES)):
        if len(busy) >= len(TYPES):  # the oldest trial ends: written, its job finished if complete
            done = busy.popleft()
            store.record_results([result_of(done.trial.id, [100_000, 100_100, 100_200])])
            queue.finish({done.job.id})
        start = time.perf_counter()
        claimed = queue.claim("fairness-bench", TYPES[i % len(TYPES)])
        if i >= len(TYPES):
            times.append(time.perf_counter() - start)
        if claimed is not None:
            busy.append(claimed)
    state, usage, now = queue.state(policy)
    out: dict[str, float | int] = {"jobs_waiting": sum(j.queued > 0 for j in state), "claims": len(times)}
    out |= {f"claim_{k}": v for k, v in _ms(times).items()}
    for name, rule in (
        ("pick", policy),
        ("pick_without_best_fit", policy.model_copy(update={"best_fit": 0.0})),
    ):
        picks = []
        for k in range(200):
            start = time.perf_counter()
            Plan(list(state), usage, rule, now).pick(TYPES[k % len(TYPES)])
            picks.append(time.perf_counter() - start)
        out |= {f"{name}_{k}": v for k, v in _ms(picks).items()}
    return out


def on_both_stores(policy: Policy, claims: int, postgres: bool = True) -> dict[str, dict]:
    """claim_cost on a fresh SQLite store and, unless told not to, on a throwaway PostgreSQL server."""
    from benchmarks.scale_bench import _new_store  # the scale benchmark's PostgreSQL server, started once

    out = {}
    with tempfile.TemporaryDirectory() as work:
        for backend in ("sqlite", "postgresql") if postgres else ("sqlite",):
            store = _new_store(backend, Path(work))
            try:
                out[backend] = claim_cost(store, policy, claims)
            finally:
                store.close()
    return out


def lines(cost: dict[str, dict]) -> str:
    """The claim costs as a markdown table."""
    rows = ["", "Claim cost under load (64 jobs waiting, 5 owners, 16 busy workers):", "",
            "| store | jobs waiting | claims | claim median | claim p90 | Plan.pick median "
            "| without best fit |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for backend, c in cost.items():
        ms = [f"{c[k]} ms" for k in ("claim_median_ms", "claim_p90_ms", "pick_median_ms",
                                     "pick_without_best_fit_median_ms")]  # fmt: skip
        cells = [backend, c["jobs_waiting"], c["claims"], *ms]
        rows.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(rows) + "\n"
