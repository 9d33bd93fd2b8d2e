"""`farm accept --confirm`: re-run the suspicious trials interleaved with their baseline before calling
a regression.

For each suspicious trial (a regression verdict of slower or ambiguous), `rounds` rounds of A then B
are run, A the baseline trial's request (backend, shape, config, dtype) and B the candidate's, all rounds
of all pairs in one confirmation job on ONE worker, in the order A1 B1 A1' B1' ... A2 B2 ... round by
round: both sides see the same machine, clocks and neighbours. The job is stored and listed like any
other; its rows are created here and run by the farm's runner with one worker that gets the same
torch thread count as the job's workers had (on a CPU, 1 vs 2 threads is a different measurement: the
runner's threads_per_worker option).

A is re-run whenever re-running it measures the baseline: its request differs from B's, or the baseline
was taken at the commit being measured now (unchanged code judged against itself). Only when A and B
are the same request AND the baseline is from another commit (its code cannot be re-run here) is B
alone re-run, and its runs are compared with the baseline trial's stored run: the question is then
whether the slowdown reproduces, with the run-to-run spread measured from the re-runs.

The verdict is run-level (jobs.judge.runs.compare_runs): interleaved rounds are paired, one log ratio
per round; the pair is confirmed slower when that says slower AND at least two thirds of the rounds
have a median ratio above 1 + max_slowdown; "same" or "faster" means the job's verdict did not
reproduce (pass); anything else stays ambiguous. What ran (job, rounds, each run's trial, role and
median) is kept in the result's numbers under `ran`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from jobs.judge.baselines import digest
from jobs.judge.checks import (
    AMBIGUOUS,
    DEFAULT_MAX_CV,
    FAIL,
    Context,
    Outcome,
    load_allowance,
    verdict_outcome,
)
from jobs.judge.runs import compare_runs, prior_drift
from jobs.run.runner import RunOptions, kernels_commit, resume_job
from jobs.spec.sweep import dump_spec, loads_spec
from jobs.store import Job, Store, TrialRow
from jobs.store.retention import CONFIRM_SUFFIX  # `farm db prune` keeps these jobs' samples
from kernels.base import TrialStatus


@dataclass(frozen=True)
class _Row:
    """A trial row of the confirmation job (the shape jobs.store.Store.create_job reads)."""

    key: str
    family: str
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    dtype: str
    baseline: bool


def _request(t: TrialRow) -> list[Any]:
    return [t.family, t.backend, sorted(t.shape.items()), sorted(t.config.items()), t.dtype]


def _row(t: TrialRow, role: str, pair: int, rnd: int) -> _Row:
    key = digest([role, pair, rnd, _request(t)])[:20]
    return _Row(key, t.family, t.backend, dict(t.shape), dict(t.config), t.dtype, role == "A")


def _median(values: list[int]) -> float:
    s = sorted(values)
    n = len(s)
    return math.nan if n == 0 else (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


@dataclass
class Confirmation:
    job_id: int
    outcomes: dict[int, Outcome]  # candidate trial id -> the confirmed outcome


def confirm(
    store: Store,
    job: Job,
    contexts: list[Context],
    *,
    rounds: int = 3,
    options: RunOptions | None = None,
) -> Confirmation:
    """Run the confirmation job for the given trials (each with its baseline) and judge each pair."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (got {rounds})")
    pairs = [c for c in contexts if c.baseline is not None]
    rows: list[_Row] = []
    now = kernels_commit()
    rerun_a = [_rerun_baseline(store, c, now) for c in pairs]
    for rnd in range(rounds):
        for i, c in enumerate(pairs):
            if rerun_a[i]:
                rows.append(_row(c.baseline, "A", i, rnd))  # type: ignore[arg-type]
            rows.append(_row(c.trial, "B", i, rnd))
    spec = loads_spec(job.spec, source=f"job {job.id} spec")
    named = {"name": spec.name + CONFIRM_SUFFIX, "description": f"confirms job {job.id}"}
    spec = spec.model_copy(update=named)
    confirm_id = store.create_job(
        name=spec.name,
        family=spec.family,
        spec_yaml=dump_spec(spec),
        spec_hash=spec.spec_hash(),
        trials=rows,
        git_commit=now,
    )
    threads = (pairs[0].env.data or {}).get("torch_threads") if pairs and pairs[0].env else None
    status = _run_one_worker(store, confirm_id, threads, options or RunOptions(show_progress=False))
    ran = ", ".join(f"#{c.trial.seq} {'A/B' if a else 'B only'}" for c, a in zip(pairs, rerun_a, strict=True))
    store.set_job_status(
        confirm_id, status, message=f"confirmation of job {job.id}: {rounds} interleaved rounds ({ran})"
    )

    by_key = {t.key: t for t in store.trials(confirm_id)}
    outcomes: dict[int, Outcome] = {}
    for i, c in enumerate(pairs):
        a_trials = [by_key[_row(c.baseline, "A", i, r).key] for r in range(rounds)] if rerun_a[i] else []  # type: ignore[arg-type]
        b_trials = [by_key[_row(c.trial, "B", i, r).key] for r in range(rounds)]
        outcomes[c.trial.id] = _judge(store, c, a_trials, b_trials, confirm_id)
    return Confirmation(confirm_id, outcomes)


def _rerun_baseline(store: Store, c: Context, now: str | None) -> bool:
    """Whether re-running the baseline's request measures the baseline (see the module docstring)."""
    assert c.baseline is not None
    if _request(c.baseline) != _request(c.trial):
        return True
    base_job = store.get_job(c.baseline.job_id) if c.baseline.job_id is not None else None
    return base_job is not None and base_job.git_commit is not None and base_job.git_commit == now


def _run_one_worker(store: Store, job_id: int, threads: int | None, options: RunOptions) -> str:
    """Run the job's rows in order on one worker with `threads` torch threads (None: the plan's)."""
    result = resume_job(job_id, store, replace(options, gpus=1, threads_per_worker=threads))
    return result.status


def _judge(store: Store, c: Context, a: list[TrialRow], b: list[TrialRow], confirm_id: int) -> Outcome:
    assert c.baseline is not None and c.card.performance is not None
    bad = [t for t in a + b if t.status != TrialStatus.OK]
    if bad:
        statuses = sorted({t.status for t in bad})
        return Outcome(AMBIGUOUS, f"confirmation runs did not finish ok ({statuses}) in job {confirm_id}", {})
    a_runs = [c.timings(t.id)[0] for t in a]
    b_runs = [c.timings(t.id)[0] for t in b]
    min_effect = c.card.max_slowdown(c.on_cpu)
    result = compare_runs(
        a_runs if a else [c.timings(c.baseline.id)[0]],
        b_runs,
        min_effect=min_effect,
        alpha=c.card.performance.alpha,
        max_cv=c.card.max_cv(c.on_cpu) or DEFAULT_MAX_CV,
        prior=prior_drift(c.on_cpu),
        paired=bool(a),
        inflated=(load_allowance(c, a or [c.baseline]), load_allowance(c, b)),
    )
    if a:
        ratios = [_median(bs) / _median(as_) for as_, bs in zip(a_runs, b_runs, strict=True)]
    else:
        base_median = _median(c.timings(c.baseline.id)[0])
        ratios = [_median(bs) / base_median for bs in b_runs]
    agreeing = sum(1 for r in ratios if r > 1.0 + min_effect)
    ran = [
        {"round": i // 2 if a else i, "role": role, "trial_id": t.id, "config": t.config,
         "median_ns": _median(c.timings(t.id)[0])}
        for i, (role, t) in enumerate(_order(a, b))
    ]  # fmt: skip
    numbers = {
        "confirm_job": confirm_id,
        "rounds": len(b),
        "baseline_rerun": bool(a),
        "ran": ran,
        "round_ratios": ratios,
        "rounds_slower": agreeing,
        **result.to_dict(),
    }
    prefix = (
        f"confirmed over {len(b)} interleaved A/B rounds (job {confirm_id}): "
        if a
        else f"re-ran the candidate {len(b)}x vs the stored baseline of another commit (job {confirm_id}): "
    )
    out = verdict_outcome(result, numbers, prefix)
    if out.outcome == FAIL and agreeing * 3 < 2 * len(ratios):
        text = f"{prefix}slower, but only {agreeing}/{len(ratios)} rounds slower by > {min_effect:.0%}"
        return Outcome(AMBIGUOUS, text, numbers, "ambiguous")
    return out


def _order(a: list[TrialRow], b: list[TrialRow]) -> list[tuple[str, TrialRow]]:
    """The runs in the order they ran: A1 B1 A2 B2 ..., or B1 B2 ... when A was not re-run."""
    if not a:
        return [("B", t) for t in b]
    return [(role, t) for pair in zip(a, b, strict=True) for role, t in zip("AB", pair, strict=True)]
