"""A synthetic year of a team's farm store (issue 46), written in bulk with the rows the farm's own write
paths make.

The team runs 4 nightly specs (two GEMM, two probe; 500 trials each) 5 times a day: 20 jobs a day of 500
trials with 100 samples each. Every week each spec's baseline moves to its newest job; every job is
judged (anomalies of the points that regressed, failed assertions that keep coming back), drafted
(a draft run and its drafts when it has anomalies), and was queued (its job_queue row and job_events
lines). A `fraction` of the year is `365 * fraction` days of that.

Trial and sample rows are inserted in bulk, with explicit ids, as the rows `Store.create_job` and
`Store.record_results` write (jobs.store.trial_store.pending_row, result_row and sample_row make both);
tests/jobs/test_scale_store.py checks, column for column, that a bulk job's rows are those of the same job
written through the Store API. The results come from a pool per spec: for each trial, a few noise
draws (100 samples, lognormal around the point's level) at its level and at a level 25% slower, each
summarised once (kernels.base.Summary.from_samples, 1 ms each: a year's 3.65 million trials summarised
one by one would take an hour); a job takes one draw per trial, the slower one for the points that
regress from a day on. Baselines, findings, drafts and the queue's rows are written through the Store's
own methods (or, for the queue's history, its tables' columns), one job at a time.
"""

from __future__ import annotations

import hashlib
import itertools
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select, update

from jobs.judge.baselines import env_class, point_key
from jobs.spec.sweep import loads_spec
from jobs.store import (
    AnomalyRecord,
    BaselinePoint,
    DraftRecord,
    DraftRunRecord,
    FailureRecord,
    Job,
    JobEvent,
    QueuedJob,
    Sample,
    Store,
    TrialRow,
)
from jobs.store.results import result_of
from jobs.store.tables import Baseline, BaselineMove
from jobs.store.trial_store import pending_row, result_row, sample_row

JOBS_PER_DAY = 20
SAMPLES = 100
DRAWS = 4  # noise draws per trial and level in the pool
START = datetime(2026, 1, 1, 22, 0)
ENV = {
    "host": "gpu-node-1", "device_kind": "gpu", "device_name": "NVIDIA H100 80GB HBM3",
    "torch": "2.13.0", "triton": "3.7.1", "cuda": "13.0", "driver": "580.65",
}  # fmt: skip

GEMM = """
name: {name}
family: gemm
backends: [{{name: torch_fp32, baseline: true}}, {{name: torch_bf16}}]
shapes: {{grid: {{m: [1, 16, 64, 256, 1024], n: [256, 512, 1024, 2048, 4096], k: {k}}}}}
dtypes: [float32]
card: gemm
"""
PROBE = """
name: {name}
family: probe
backends:
  - {{name: noop, baseline: true}}
  - {{name: spin, configs: {{grid: {{ms: [1, 2, 3, 4]}}}}}}
  - {{name: wait, configs: {{grid: {{ms: [1, 2, 3, 4, 5]}}}}}}
shapes: {{grid: {{n: {n}}}}}
card: probe
"""
K_NIGHTLY = [256, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192]
K_SKINNY = [128, 320, 640, 1280, 2560, 5120, 7168, 9216, 10240, 12288]
SPECS = {
    "gemm-nightly": GEMM.format(name="gemm-nightly", k=K_NIGHTLY),
    "gemm-skinny": GEMM.format(name="gemm-skinny", k=K_SKINNY),
    "probe-loop": PROBE.format(name="probe-loop", n=list(range(50))),
    "probe-io": PROBE.format(name="probe-io", n=list(range(100, 150))),
}  # fmt: skip
# the example series `farm history` is timed on (one point of gemm-nightly)
SERIES = ("gemm", "torch_bf16", "m=64,n=256,k=256")


def days_of(fraction: float) -> int:
    return max(1, round(365 * fraction))


@dataclass
class Pool:
    """A spec's trials and, per trial, DRAWS results at its level and DRAWS 25% slower: the rows
    (result_row, sample_row) made once, copied per job."""

    points: list
    level: np.ndarray  # ns, per trial
    draws: int = DRAWS
    # [slow][seq * draws + draw]: (result_row, sample_row)
    rows: list[list[tuple[dict[str, Any], dict[str, Any]]]] = field(default_factory=list)


def _level(t: Any) -> float:
    """A plausible median (ns) for the point: a GEMM's flops at ~50 TFLOP/s, a probe's ms."""
    if t.family == "gemm":
        s = t.shape
        return 2e3 + 2 * s["m"] * s["n"] * s["k"] / 50e3 * (0.5 if t.backend == "torch_bf16" else 1.0)
    return 1e4 + 1e6 * float(t.config.get("ms", 0))


def make_pool(text: str, env_id: int, seed: int, draws: int = DRAWS) -> Pool:
    spec = loads_spec(text)
    points = list(spec.trials())
    level = np.array([_level(t) for t in points])
    rng = np.random.default_rng(seed)
    pool = Pool(points, level, draws)
    for slow in (1.0, 1.25):
        noise = rng.lognormal(0.0, 0.03, (len(points), draws, SAMPLES))
        values = np.rint(level[:, None, None] * slow * noise).astype(np.int64)
        made = []
        for seq, d in itertools.product(range(len(points)), range(draws)):
            samples = values[seq, d].tolist()
            r = result_of(0, samples)
            made.append((result_row(r, env_id), sample_row(0, samples)))
        pool.rows.append(made)
    return pool


@dataclass
class JobPlan:
    """One job of the year: its spec, when, which draw, whether (and which of) its points regress."""

    spec: str
    number: int  # 0-based, over the year
    created_at: datetime
    draw: int
    regressed: frozenset[int]  # trial seqs that ran 25% slower


def plan(days: int, seed: int = 0) -> list[JobPlan]:
    """The year's jobs in creation order: every spec 5 times a night; from a third of the way on, a few
    points of one spec regress (and stay regressed), as a kernel change would make them."""
    rng = np.random.default_rng(seed)
    out = []
    per_spec = JOBS_PER_DAY // len(SPECS)
    regress_from = days // 3
    regressed = frozenset(int(x) for x in rng.choice(500, 12, replace=False))
    for day in range(days):
        for rnd in range(per_spec):
            for i, name in enumerate(SPECS):
                at = START + timedelta(days=day, minutes=rnd * 40 + i * 9)
                slow = regressed if (name == "gemm-nightly" and day >= regress_from) else frozenset()
                out.append(JobPlan(name, len(out), at, int(rng.integers(DRAWS)), slow))
    return out


def commit_of(number: int) -> str:
    return hashlib.sha1(f"commit {number}".encode()).hexdigest()


def _job_row(store_id: int, p: JobPlan) -> dict[str, Any]:
    spec = loads_spec(SPECS[p.spec])
    return {
        "id": store_id, "name": spec.name, "family": spec.family, "spec": SPECS[p.spec],
        "spec_hash": spec.spec_hash(), "status": "completed", "created_at": p.created_at,
        "started_at": p.created_at + timedelta(minutes=1),
        "finished_at": p.created_at + timedelta(minutes=30),
        "git_commit": commit_of(p.number), "cluster": None, "message": None,
    }  # fmt: skip


def job_rows(pool: Pool, job_id: int, first_trial_id: int, p: JobPlan) -> tuple[list[dict], list[dict]]:
    """The trial rows and sample rows of one finished job, as the Store's write paths make them."""
    trials, samples = [], []
    finished = p.created_at + timedelta(minutes=29)
    for seq, t in enumerate(pool.points):
        tid = first_trial_id + seq
        result, sample = pool.rows[seq in p.regressed][seq * pool.draws + p.draw % pool.draws]
        trials.append(pending_row(job_id, seq, t) | result | {"id": tid, "finished_at": finished})
        samples.append(sample | {"trial_id": tid})
    return trials, samples


def _findings(store: Store, job_id: int, p: JobPlan, trial_ids: list[int]) -> None:
    """The judge's and the drafter's rows of the job, through the Store's methods."""
    anomalies = [
        AnomalyRecord(trial_ids[seq], "regression", "warning", _fp("anomaly", p.spec, seq), "25% slower",
                      {"ratio": 1.25})
        for seq in sorted(p.regressed)
    ]  # fmt: skip
    failures = [
        FailureRecord(trial_ids[seq], p.spec, "max_slowdown", "fail", _fp("failure", p.spec, seq), f"#{seq}",
                      "slower than the baseline", {"ratio": 1.25}, commit_of(p.number))
        for seq in sorted(p.regressed)[:3]
    ]  # fmt: skip
    if p.number % 7 == 0:  # a flaky correctness check now and then, on one of 20 points
        seq = p.number % 20
        failures.append(
            FailureRecord(trial_ids[seq], p.spec, "correct", "fail", _fp("flaky", p.spec, seq), f"#{seq}",
                          "max abs error 3e-2", {"max_abs": 0.03}, commit_of(p.number))
        )  # fmt: skip
    store.record_verdict(job_id, anomalies, failures)
    if anomalies:
        run = DraftRunRecord("checklist", len(anomalies), len(anomalies), 9000, 1800, model="offline",
                             offline=True)  # fmt: skip
        drafts = [
            DraftRecord(f"{a.message} at {a.fingerprint[:8]}", "rerun A/B", "slower", False, [a.fingerprint],
                        offline=True)
            for a in anomalies[:3]
        ]  # fmt: skip
        store.replace_drafts(job_id, run, drafts)


def _fp(*parts: Any) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:32]


def _queue_rows(conn: Any, job_id: int, p: JobPlan) -> None:
    at = p.created_at
    conn.execute(
        insert(QueuedJob.__table__).values(
            job_id=job_id, priority=0, owner="nightly", submitted_at=at, source=commit_of(p.number)
        )
    )
    lines = [
        (at, "queued by nightly at priority 0"),
        (at + timedelta(minutes=1), "taken by pool gpu-node-1"),
        (at + timedelta(minutes=30), "completed: 500 trials"),
    ]
    conn.execute(insert(JobEvent.__table__), [{"job_id": job_id, "at": t, "line": line} for t, line in lines])


def _move_baseline(store: Store, job_id: int, name: str) -> None:
    job = store.get_job(job_id)
    env = store.environments(job_id)[0]
    points = [BaselinePoint(point_key(t, env), env_class(env), t.id) for t in store.trials(job_id)]
    current = store.get_baseline(name)
    row, _previous = store.set_baseline(name, job, points, expect_job_id=current.job_id if current else None)
    # set when the team set it, a minute after the job ended (the store's clock is today's): a job's report
    # compares it with the baseline as it stood when the job ended (jobs.report.job_view.stored_baseline)
    at = job.finished_at + timedelta(minutes=1)
    with store.engine.begin() as conn:
        conn.execute(update(Baseline).where(Baseline.id == row.id).values(created_at=at))
        newest = select(func.max(BaselineMove.id)).where(BaselineMove.name == name).scalar_subquery()
        conn.execute(update(BaselineMove).where(BaselineMove.id == newest).values(set_at=at))


def environment_id(store: Store) -> int:
    """The team's GPU environment row (written as a sweep's first result writes it)."""
    with store.engine.begin() as conn:
        return store._environment_id(conn, dict(ENV))  # noqa: SLF001 - the write path's own dedup


def next_ids(store: Store) -> tuple[int, int]:
    with store.engine.connect() as conn:
        job = conn.scalar(select(func.coalesce(func.max(Job.id), 0)))
        trial = conn.scalar(select(func.coalesce(func.max(TrialRow.id), 0)))
    return job + 1, trial + 1


def write_jobs(
    store: Store, plans: list[JobPlan], pools: dict[str, Pool], *, batch_jobs: int = 8
) -> list[int]:
    """The planned jobs, a batch of jobs per transaction; their ids."""
    job_id, trial_id = next_ids(store)
    ids: list[int] = []
    for start in range(0, len(plans), batch_jobs):
        chunk = plans[start : start + batch_jobs]
        made = []
        with store.engine.begin() as conn:
            for p in chunk:
                conn.execute(insert(Job.__table__), [_job_row(job_id, p)])
                trials, samples = job_rows(pools[p.spec], job_id, trial_id, p)
                conn.execute(insert(TrialRow.__table__), trials)
                conn.execute(insert(Sample.__table__), samples)
                _queue_rows(conn, job_id, p)
                made.append((job_id, p, [t["id"] for t in trials]))
                job_id, trial_id = job_id + 1, trial_id + len(trials)
        for jid, p, trial_ids in made:
            _findings(store, jid, p, trial_ids)
            if p.number % (7 * JOBS_PER_DAY) < len(SPECS):  # weekly, each spec's baseline moves
                _move_baseline(store, jid, f"{p.spec}-main")
            ids.append(jid)
    _advance_sequences(store)
    return ids


def _advance_sequences(store: Store) -> None:
    """PostgreSQL: the id sequences past the ids given explicitly, so the write paths' own inserts (a
    queued job, a confirmation) take new ids."""
    if store.engine.dialect.name != "postgresql":
        return
    with store.engine.begin() as conn:
        for table in ("jobs", "trials"):
            conn.exec_driver_sql(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
            )


def make_pools(store: Store, seed: int = 0, draws: int = DRAWS) -> dict[str, Pool]:
    env_id = environment_id(store)
    return {name: make_pool(text, env_id, seed + i, draws) for i, (name, text) in enumerate(SPECS.items())}


def build(store: Store, days: int, *, seed: int = 0, pools: dict[str, Pool] | None = None) -> list[int]:
    """`days` more of the team's year in `store` (which may hold earlier days); the new jobs' ids."""
    pools = pools or make_pools(store, seed)
    done = _days_done(store)
    plans = [p for p in plan(done + days, seed) if p.created_at >= START + timedelta(days=done)]
    return write_jobs(store, plans, pools)


def _days_done(store: Store) -> int:
    with store.engine.connect() as conn:
        last = conn.scalar(select(func.max(Job.created_at)).where(Job.name.in_(list(SPECS))))
    return 0 if last is None else (last - START).days + 1


def write_through_store(store: Store, p: JobPlan, pool: Pool) -> int:
    """One planned job written through the Store API (create_job, record_results), as a sweep writes it:
    what the bulk rows are checked against."""
    spec = loads_spec(SPECS[p.spec])
    job_id = store.create_job(
        name=spec.name, family=spec.family, spec_yaml=SPECS[p.spec], spec_hash=spec.spec_hash(),
        trials=pool.points, git_commit=commit_of(p.number),
    )  # fmt: skip
    results = []
    finished = p.created_at + timedelta(minutes=29)
    for seq, t in enumerate(store.trials(job_id)):
        _result, sample = pool.rows[seq in p.regressed][seq * pool.draws + p.draw % pool.draws]
        results.append(result_of(t.id, _unpacked(sample), environment=ENV, finished_at=finished))
    store.record_results(results)
    row = _job_row(job_id, p)
    with store.engine.begin() as conn:
        conn.execute(update(Job.__table__).where(Job.id == job_id).values(**row))
    return job_id


def _unpacked(sample: dict[str, Any]) -> list[int]:
    from jobs.store.sample_codec import unpack

    return unpack(sample["codec"], sample["data"])
