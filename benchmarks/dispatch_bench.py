"""Farm dispatch overhead and worker scaling on this machine.

1. Overhead per trial: a no-op probe trial through the whole pipeline (Ray actor call, result
   streamed into SQLite) against calling the same trial in-process. Timed from the first result to
   the last, so Ray start-up and actor start-up are excluded. Target: <= 1 ms per trial.
2. Scaling: CPU-bound trials (50 ms busy loops) on 1 worker, then on 2. Target: >= 1.8x.
"""

from __future__ import annotations

import os
import tempfile
import time

from cluster import session
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from kernels.base import TrialRequest
from kernels.registry import get_family

N_NOOP = 1000
N_SPIN, SPIN_MS = 40, 50


def _spec(backend: str, n: int, config: str = "") -> str:
    return f"""
name: bench-{backend}
family: probe
backends: [{{name: {backend}, baseline: true{config}}}]
shapes: {{grid: {{n: {list(range(n))}}}}}
measure: {{warmup_ms: 0, min_samples: 1, max_samples: 1, max_time_s: 1}}
timeout_s: 60
"""


def _timed_sweep(spec_text: str, store: Store, workers: int) -> tuple[float, int]:
    """Seconds from the first finished trial to the last, and the number of trials in that span."""
    stamps: list[float] = []
    options = RunOptions(
        gpus=workers,
        oversubscribe=True,  # the figures are the dispatcher's overhead, not timings: any worker count
        show_progress=False,
        echo=lambda _m: None,
        observer=lambda _row, _w: stamps.append(time.perf_counter()),
    )
    result = run_sweep(loads_spec(spec_text), store, options)
    assert result.exit_code == 0, result
    return stamps[-1] - stamps[0], len(stamps) - 1


def main() -> dict[str, float]:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    family = get_family("probe")
    spec = loads_spec(_spec("noop", 1))
    req = TrialRequest("probe", "noop", {"n": 0}, {}, "float32", policy=spec.measure)
    family.run(req)
    t0 = time.perf_counter()
    for _ in range(N_NOOP):
        family.run(req)
    in_process = (time.perf_counter() - t0) / N_NOOP

    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(os.path.join(tmp, "bench.db"))
        session.connect(gpus=2)
        try:
            span, n = _timed_sweep(_spec("noop", N_NOOP), store, 1)
            figures["noop_in_process_ms"] = in_process * 1e3
            figures["noop_pipeline_1_worker_ms"] = span / n * 1e3
            figures["overhead_per_trial_ms"] = (span / n - in_process) * 1e3
            span, n = _timed_sweep(_spec("noop", N_NOOP), store, 2)
            figures["noop_pipeline_2_workers_ms"] = span / n * 1e3
            spin = _spec("spin", N_SPIN, f", configs: {{grid: {{ms: [{SPIN_MS}]}}}}")
            span1, n1 = _timed_sweep(spin, store, 1)
            span2, n2 = _timed_sweep(spin, store, 2)
            figures["spin_1_worker_trials_per_s"] = n1 / span1
            figures["spin_2_workers_trials_per_s"] = n2 / span2
            figures["scaling_1_to_2"] = (n2 / span2) / (n1 / span1)
        finally:
            session.disconnect()
            store.close()

    print("farm dispatch (probe family, SQLite store, local Ray, this machine)")
    print(f"  no-op trial in-process            {figures['noop_in_process_ms']:8.3f} ms")
    print(
        f"  no-op trial through the pipeline  {figures['noop_pipeline_1_worker_ms']:8.3f} ms/trial (1 worker)"
    )
    print(
        f"  overhead per trial                {figures['overhead_per_trial_ms']:8.3f} ms   (target <= 1 ms)"
    )
    two = figures["noop_pipeline_2_workers_ms"]
    print(f"  no-op through the pipeline        {two:8.3f} ms/trial (2 workers)")
    print(f"  {SPIN_MS} ms CPU trials, 1 worker       {figures['spin_1_worker_trials_per_s']:8.2f} trials/s")
    print(f"  {SPIN_MS} ms CPU trials, 2 workers      {figures['spin_2_workers_trials_per_s']:8.2f} trials/s")
    print(f"  scaling 1 -> 2 workers            {figures['scaling_1_to_2']:8.2f} x    (target >= 1.8x)")
    return figures


if __name__ == "__main__":
    main()
