"""A store with a history to look at: N jobs of one probe spec, a real slowdown injected from one job on.

The spec is tiny: one probe backend, `spin` by default (a busy loop of a few ms of CPU time; its wall time
grows when the machine is busy, as a kernel's would) or `wait` (a sleep of a few ms: a latency that a busy
machine barely moves), on two shapes. From job `slow_from` on (1-based, in creation
order) its config carries the `_slowdown` fault of testkit.kernels.faults (a FARM_PLUGINS module), so those
jobs really run `slowdown` slower; the fault is a variant key, not part of the point, so all 30 jobs are
one history per shape.

Jobs whose numbers are in `real` run for real through the runner (the caller connects local Ray); the
others are written through the Store API, each trial's samples drawn from a seeded distribution around
the median level the real sweeps of the same phase (before / after the slowdown) measured, or fixed
levels where none ran. Every job gets a commit of its own (`fake_commit(number)`), as one job per commit
would: a real sweep's job is stamped after it ran, since the runner records the working tree's commit.

`real=range(1, 31)` is the all-real store (about 4 s a sweep: the runner starts its workers per job;
benchmarks/site_bench.py builds it); tests/jobs/test_history.py runs jobs 1-3 and 20-22 for real, so the
slowdown it detects is a measured one, and writes the rest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
from sqlalchemy import update
from sqlalchemy.orm import Session

from jobs.judge.baselines import point_config
from jobs.spec.sweep import loads_spec
from jobs.store import Job, Store, TrialRow
from jobs.store.results import result_of
from testkit.kernels import faults

faults.enable()  # the injected faults its specs use: a FARM_PLUGINS module, for Ray and subprocesses too

NAME = "history-probe"
MS = 3
SPEC = """
name: history-probe
family: probe
backends:
  - {name: %(backend)s, baseline: true, configs: {grid: {ms: [%(ms)s]%(knob)s}}}
shapes: {grid: {n: [0, 1]}}
measure: {warmup_ms: 0, min_samples: 7, max_samples: 7, max_time_s: 1, min_time_s: 0}
timeout_s: 30
"""
CPU_ENV = {"host": "history-host", "device_kind": "cpu", "device_name": "Synthetic CPU", "torch": "-"}


def spec_yaml(slowdown: float = 0.0, backend: str = "spin") -> str:
    """The history spec of one probe backend (spin or wait); with `_slowdown` when `slowdown` is not 0."""
    knob = f", _slowdown: [{slowdown}]" if slowdown else ""
    return SPEC % {"ms": MS, "knob": knob, "backend": backend}


@dataclass
class HistoryStore:
    job_ids: list[int]  # in creation order: job_ids[k] is job number k + 1
    real_jobs: list[int]
    slow_job: int  # the first slowed-down job's id


def fake_commit(i: int) -> str:
    return hashlib.sha1(f"history commit {i}".encode()).hexdigest()


def _point(t: TrialRow) -> str:
    """What a trial measures, without its variant keys: the same in slowed and plain jobs."""
    return json.dumps([t.backend, t.shape, point_config(t)], sort_keys=True)


def _stamp_commit(store: Store, job_id: int, commit: str) -> None:
    with Session(store.engine) as s, s.begin():
        s.execute(update(Job).where(Job.id == job_id).values(git_commit=commit))


def _real_job(store: Store, yaml: str, echo: Callable[[str], None]) -> int:
    from jobs.run.runner import RunOptions, run_sweep

    result = run_sweep(loads_spec(yaml), store, RunOptions(show_progress=False, echo=echo))
    if result.exit_code != 0:
        raise RuntimeError(f"real sweep job {result.job_id} ended {result.status}: {result.counts}")
    return result.job_id


def _written_job(
    store: Store, yaml: str, number: int, level: Callable[[str], float], env: dict, rng: np.random.Generator
) -> int:
    spec = loads_spec(yaml)
    job_id = store.create_job(
        name=spec.name,
        family=spec.family,
        spec_yaml=yaml,
        spec_hash=spec.spec_hash(),
        trials=spec.trials(),
        git_commit=fake_commit(number),
    )
    results = []
    for t in store.trials(job_id):
        median = level(_point(t)) * (1 + rng.normal(0, 0.01))
        samples = median * (1 + rng.normal(0, 0.02, 7))  # about `median`, as the real ones
        results.append(
            result_of(
                t.id,
                [int(v) for v in samples],
                worker="w0",
                node=env.get("host", "?"),
                stop_reason="max_samples",
                timer="perf_counter",
                correctness={"passed": True, "method": "none"},
                environment=env,
            )
        )
    store.record_results(results)
    store.set_job_status(job_id, "running")
    store.set_job_status(job_id, "completed")
    return job_id


def build_history_store(
    store: Store,
    *,
    jobs: int = 30,
    slow_from: int = 20,
    slowdown: float = 0.20,
    real: Collection[int] = (),
    backend: str = "spin",
    seed: int = 20,
    echo: Callable[[str], None] = lambda _msg: None,
) -> HistoryStore:
    """Jobs 1..`jobs` of the history spec, in order, `slowdown` from job `slow_from` on. The job numbers
    in `real` run through the runner (local Ray connected by the caller); a written job takes its levels
    from the real jobs before it in the same phase (before / after the slowdown)."""
    if not 1 < slow_from <= jobs:
        raise ValueError(f"need 1 < slow_from <= jobs (got slow_from={slow_from}, jobs={jobs})")
    if not set(real) <= set(range(1, jobs + 1)):
        raise ValueError(f"real job numbers must lie in 1..{jobs} (got {sorted(real)})")
    plain, slowed = spec_yaml(backend=backend), spec_yaml(slowdown, backend)
    # what each point measured for real before and after the slowdown: the written jobs resample those
    measured: dict[tuple[bool, str], list[float]] = {}
    env = CPU_ENV
    job_ids: list[int] = []
    real_ids: list[int] = []
    rng = np.random.default_rng(seed)
    default = MS * 1e6 + 5_000  # a busy loop of MS ms plus the timer's overhead, when no real job ran

    def level(slow: bool, point: str) -> float:
        before, after = measured.get((False, point)), measured.get((True, point))
        if slow and after:
            return float(np.median(after))
        return (float(np.median(before)) if before else default) * (1 + slowdown if slow else 1)

    for number in range(1, jobs + 1):
        slow = number >= slow_from
        yaml = slowed if slow else plain
        if number in real:
            job_id = _real_job(store, yaml, echo)
            _stamp_commit(store, job_id, fake_commit(number))
            real_ids.append(job_id)
            for t in store.trials(job_id):
                measured.setdefault((slow, _point(t)), []).append(float(t.median_ns))
            env = store.environments(job_id)[0].data
        else:
            job_id = _written_job(store, yaml, number, lambda p, s=slow: level(s, p), env, rng)
        job_ids.append(job_id)
    return HistoryStore(job_ids=job_ids, real_jobs=real_ids, slow_job=job_ids[slow_from - 1])
