"""A job's report's recent history: for each of its points that earlier jobs also measured, the point's
median over the last HISTORY_JOBS jobs (a sparkline, this job the last dot) and the change from the
previous job, with what changed in the environment between them when a performance component did.

The points are the series `farm history` draws (jobs.history.series: the same point keys, the first of a
point's trials in a job, commit order), read from the family's newest RECENT_JOBS x HISTORY_JOBS jobs up
to this one (several specs of a family interleave), not its whole history: a report's cost does not grow
with the store. Only what the table shows is read: a trial's id, job, median and environment, each
distinct shape, config and environment decoded once (jobs.history.series.collect decodes every trial's
summary, 0.1 ms a trial: 2 s for a job of 500 points among 80 jobs).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any

from sqlalchemy import String, cast, select

from jobs.history.series import HistoryPoint, PointKey, _key, environment_marks
from jobs.report.views import Table, spark
from jobs.store import Environment, Job, Store, TrialRow
from kernels.base import TrialStatus

HISTORY_JOBS = 20  # how many recent jobs a point's history in a job's report shows
RECENT_JOBS = 4  # ... found among the family's newest RECENT_JOBS x HISTORY_JOBS jobs up to the job


@dataclass(frozen=True)
class _Point:
    """What _key reads of a trial."""

    family: str
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    dtype: str


def _series_of_job(store: Store, job_id: int) -> list[tuple[str, str, str]]:
    """(family, backend, shape key) of the job's timed trials: the series its points are on."""
    q = select(TrialRow.family, TrialRow.backend, TrialRow.shape_key).where(
        TrialRow.job_id == job_id, TrialRow.status == TrialStatus.OK, TrialRow.median_ns.is_not(None)
    )
    with store.engine.connect() as conn:
        return sorted(set(map(tuple, conn.execute(q))))


def _environments(store: Store, ids: set[int]) -> dict[int, Environment]:
    """One object per environment (a series compares consecutive points' environments by identity)."""
    if not ids:
        return {}
    from sqlalchemy.orm import Session

    with Session(store.engine) as s:
        return {e.id: e for e in s.scalars(select(Environment).where(Environment.id.in_(sorted(ids))))}


def _group(row: Any) -> tuple:
    """What a row's point is counted by: backend, shape key, dtype, config, environment."""
    return row[3], row[4], row[7], row[6], row[9]


class _JobsPerGroup:
    """The jobs read so far of each of one job's points (groups), newest first."""

    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        self.jobs: dict[tuple, set[int]] | None = None  # None until the job's own rows are read

    def complete(self, rows: list, last: int) -> bool:
        """Count these rows; whether each of the job's points has `last` jobs now (or the job had none)."""
        if self.jobs is None:
            self.jobs = {_group(r): set() for r in rows if r[1] == self.job_id}
        for r in rows:
            jobs = self.jobs.get(_group(r))
            if jobs is not None:
                jobs.add(r[1])
        return all(len(jobs) >= last for jobs in self.jobs.values())


def recent_series(
    store: Store, job_id: int, family: str, jobs: Iterable[int], last: int = HISTORY_JOBS
) -> dict[PointKey, list[HistoryPoint]]:
    """The series (point key -> its last `last` points, in commit order) of `jobs`' trials on the job's
    series (`jobs`: none after the job)."""
    series = _series_of_job(store, job_id)
    if not series:
        return {}
    ids = sorted(set(jobs))
    q = select(
        *(TrialRow.id, TrialRow.job_id, TrialRow.family, TrialRow.backend, TrialRow.shape_key),
        *(cast(TrialRow.shape, String), cast(TrialRow.config, String), TrialRow.dtype),
        *(TrialRow.median_ns, TrialRow.environment_id, TrialRow.seq),
    ).where(
        TrialRow.status == TrialStatus.OK,
        TrialRow.median_ns.is_not(None),
        # the series as one value: one IN that PostgreSQL hashes (a tuple IN is an OR of a term per series,
        # tried on each of the jobs' trials: 0.35-0.55 s of 500 series); exact unless a family or backend
        # name has a "/" in it (then the exact series are kept below)
        (TrialRow.family + "/" + TrialRow.backend + "/" + TrialRow.shape_key).in_(
            sorted({"/".join(s) for s in series})
        ),
    )
    wanted = set(series) if any("/" in f + b for f, b, _k in series) else None  # names the IN may confuse
    with store.engine.connect() as conn:
        found = conn.execute(select(Job.id, Job.created_at, Job.git_commit).where(Job.id.in_(ids))).all()
        order = {job: (created, job) for job, created, _commit in found}  # commit order
        newest = sorted(order, key=order.__getitem__, reverse=True)
        # `last` jobs at a time from the newest, until each of the job's points has its `last` jobs (the
        # table shows those only): a nightly spec's points are all in its last `last` runs, a quarter of
        # what the family's newest jobs hold
        read: list = []
        seen = _JobsPerGroup(job_id)
        for start in range(0, len(newest), last):
            chunk = sorted(newest[start : start + last])
            # a job's rows in grid order (SQLite reads them so off the job's index; no sort of its own)
            rows = conn.execute(
                q.where(TrialRow.job_id.in_(chunk)).order_by(TrialRow.job_id, TrialRow.seq)
            ).all()
            rows = [r for r in rows if (r[2], r[3], r[4]) in wanted] if wanted is not None else rows
            read += rows
            if seen.complete(rows, last):
                break
    commits = {job: commit for job, _created, commit in found}
    blocks = {job: list(rows) for job, rows in groupby(read, key=itemgetter(1))}
    timed = [r for job in sorted(blocks, key=order.__getitem__) for r in blocks[job]]
    # each point's last `last` jobs (or a finer group's: a point key is a function of these columns),
    # counted from the newest: rows of one job are next to each other in this order
    rows = []
    counted: dict[tuple, tuple[int, int]] = {}  # group -> (the job counted last, how many jobs)
    for r in reversed(timed):
        group = _group(r)
        job, n = counted.get(group, (-1, 0))
        if job != r[1]:
            counted[group] = job, n = r[1], n + 1
        if n <= last:
            rows.append(r)
    rows.reverse()
    envs = _environments(store, {r[9] for r in rows if r[9] is not None})
    env_data = {i: e.data for i, e in envs.items()}
    lists: dict[tuple, list[HistoryPoint]] = {}  # a row's columns -> its point key's points
    out: dict[PointKey, list[HistoryPoint]] = {}
    for trial, job, _family, backend, _shape_key, shape, config, dtype, median, env_id, _seq in rows:
        raw = (backend, shape, config, dtype, env_id)
        points = lists.get(raw)
        if points is None:
            point = _Point(family, backend, json.loads(shape), json.loads(config), dtype)
            key = _key(point, envs.get(env_id))  # type: ignore[arg-type]
            points = lists[raw] = out.setdefault(key, [])
        if points and points[-1].job_id == job:
            continue  # the same point twice in one job (it differs only in variant keys): the first counts
        points.append(
            HistoryPoint(
                job_id=job,
                job_name="",
                commit=commits[job],
                created_at=None,  # type: ignore[arg-type]
                trial_id=trial,
                median_ns=float(median),
                p10_ns=None,
                p90_ns=None,
                iqr_ns=None,
                n=None,
                env=env_data.get(env_id),
            )
        )
    return out


def recent_history(store: Store, job_id: int, family: str, last: int = HISTORY_JOBS) -> Table | None:
    """The table of the job's points that earlier jobs also measured (see the module's docstring)."""
    rows = []
    recent = store.recent_jobs(family, job_id, RECENT_JOBS * last)
    for key, points in recent_series(store, job_id, family, recent, last).items():
        at = next((i for i, p in enumerate(points) if p.job_id == job_id), None)
        if at is None or at == 0:
            continue
        window = points[max(0, at - last + 1) : at + 1]
        prev, this = window[-2], window[-1]
        cells = [
            key.label,
            len(window),
            spark([p.median_ns for p in window], marks=(len(window) - 1,)),
            f"{this.median_ns / 1e6:.4f}",
            f"{this.median_ns / prev.median_ns - 1:+.1%} (job {prev.job_id})"
            + "".join(f"; environment changed: {m.text}" for m in environment_marks(window[-2:])),
        ]
        rows.append((this.trial_id, cells))
    if not rows:
        return None
    rows.sort(key=lambda r: r[0])
    head = ["point", "jobs", f"median, last {last} jobs (red: this job)", "median ms", "vs previous job"]
    return Table(head, [cells for _, cells in rows], left=1)
