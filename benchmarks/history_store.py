"""A store with a history to look at: N jobs of one probe spec, a slowdown injected from one job on.

The first `real_sweeps` jobs run for real through the runner (local Ray must be connected by the
caller); the rest are written through the Store API, one job per fake commit, with each trial's raw
samples drawn from a seeded distribution around the median level the real sweeps measured (or fixed
levels when none ran). From job `slow_from` on (1-based, in creation order) every `spin` trial is `slowdown`
slower. Used by tests/jobs/test_history.py, tests/jobs/test_site.py and benchmarks/site_bench.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jobs.spec.sweep import loads_spec
from jobs.store.repository import Store

SPEC = """
name: history-probe
family: probe
backends:
  - {name: noop, baseline: true}
  - {name: spin, configs: {grid: {ms: [2]}}}
shapes: {grid: {n: [0, 1]}}
measure: {warmup_ms: 0, min_samples: 5, max_samples: 9, max_time_s: 0.5, min_time_s: 0}
timeout_s: 30
"""
DEFAULT_LEVEL_NS = {"noop": 2_000.0, "spin": 2_050_000.0}
CPU_ENV = {"host": "history-host", "device_kind": "cpu", "device_name": "Synthetic CPU", "torch": "-"}


@dataclass
class HistoryStore:
    job_ids: list[int]  # in creation order: job_ids[k] is job number k + 1
    real_jobs: list[int]
    slow_job: int  # the first slowed-down job's id


def fake_commit(i: int) -> str:
    return hashlib.sha1(f"history commit {i}".encode()).hexdigest()


def _summary(samples: np.ndarray) -> dict:
    q10, q25, q50, q75, q90 = np.percentile(samples, [10, 25, 50, 75, 90])
    mean, stdev = float(samples.mean()), float(samples.std(ddof=1))
    return {
        "n": len(samples),
        "n_kept": len(samples),
        "median": float(q50),
        "mean": mean,
        "min": float(samples.min()),
        "max": float(samples.max()),
        "p10": float(q10),
        "p90": float(q90),
        "iqr": float(q75 - q25),
        "mad": float(np.median(np.abs(samples - q50))),
        "stdev": stdev,
        "cv": stdev / mean,
        "flags": [],
    }


def build_history_store(
    store: Store,
    *,
    jobs: int = 30,
    slow_from: int = 20,
    slowdown: float = 0.20,
    real_sweeps: int = 0,
    seed: int = 20,
    echo: Callable[[str], None] = lambda _msg: None,
) -> HistoryStore:
    spec = loads_spec(SPEC)
    if not 0 <= real_sweeps < slow_from <= jobs:
        raise ValueError("need 0 <= real_sweeps < slow_from <= jobs")
    job_ids, real = [], []
    if real_sweeps:
        from jobs.run.runner import RunOptions, run_sweep

        quiet = RunOptions(show_progress=False, echo=echo)
        for _ in range(real_sweeps):
            result = run_sweep(spec, store, quiet)
            if result.exit_code != 0:
                raise RuntimeError(f"real sweep job {result.job_id} ended {result.status}: {result.counts}")
            job_ids.append(result.job_id)
            real.append(result.job_id)
    # what each trial key measured in the real sweeps: the synthetic jobs resample those levels
    measured: dict[str, list[float]] = {}
    env = CPU_ENV
    for job_id in real:
        for t in store.trials(job_id):
            measured.setdefault(t.key, []).append(float(t.median_ns))
        env = store.environments(job_id)[0].data
    rng = np.random.default_rng(seed)
    for number in range(len(job_ids) + 1, jobs + 1):
        job_id = store.create_job(
            name=spec.name,
            family=spec.family,
            spec_yaml=SPEC,
            spec_hash=spec.spec_hash(),
            trials=spec.trials(),
            git_commit=fake_commit(number),
        )
        results = []
        for t in store.trials(job_id):
            # the median of the real levels: one real sweep slowed by a busy machine does not move it
            levels = measured.get(t.key) or [DEFAULT_LEVEL_NS[t.backend]]
            level = float(np.median(levels)) * (1 + rng.normal(0, 0.01))
            if t.backend == "spin" and number >= slow_from:
                level *= 1 + slowdown
            samples = level * (1 + rng.normal(0, 0.02, 9))  # median about `level`, as the real ones
            results.append(
                {
                    "trial_id": t.id,
                    "status": "ok",
                    "attempt": 1,
                    "worker": "w0",
                    "node": env.get("host", "?"),
                    "summary": _summary(samples),
                    "stop_reason": "max_samples",
                    "timer": "perf_counter",
                    "correct": True,
                    "correctness": {"passed": True, "method": "none"},
                    "metrics": {},
                    "samples_ns": [int(v) for v in samples],
                    "environment": env,
                }
            )
        store.record_results(results)
        store.set_job_status(job_id, "running")
        store.set_job_status(job_id, "completed")
        job_ids.append(job_id)
    return HistoryStore(job_ids=job_ids, real_jobs=real, slow_job=job_ids[slow_from - 1])
