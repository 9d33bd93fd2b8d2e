"""One point's history across jobs: its median and spread per job, in commit order, with change points.

A point is what jobs.judge.baselines matches across jobs: family, backend, shape, config (without
variant keys) and dtype, plus the environment class (a GPU model, or the CPU model for CPU timings), so
CPU and GPU numbers never share a series. Jobs are taken in the order they were created, which is the
order of the commits they measured (each job stores its kernels' commit, jobs.run.runner.kernels_commit).
Only trials that finished `ok` with a median count.

Each job's point is its level (`HistoryPoint.level_ns`): the median of the trial's kept samples, with
its uncertainty, the standard error of a median for normal noise of the samples' spread (1.2533 x
1.4826 MAD / sqrt(n)). The fastest samples (p10) were tried as the level and measured worse on a loaded
machine (benchmarks/history_noise_bench.py, two busy loops beside the sweeps, three runs: the 1.6x step
found in 10 of 10 series on the median each time with no false change; on the p10 in 7 and 3 of 10, with
one false change): under sustained load every sample is slowed alike, and a low quantile of ten samples
is the noisier estimate. A trial the measurement
flagged as run under contention (or drifting, or throttled) is kept in the series but left out of
change detection as long as at least `min_jobs()` clean points remain: it is not averaged in.

The change points are E-divisive means (jobs.history.changepoints) over the levels; each is attributed
to the first job after it. With its significance (p <= 0.01 over 199 permutations) and at least 3 points
on either side, a series needs `min_jobs()` points before any change can be called: `farm history` says
so for a shorter one.

Each point keeps the environment its trial ran in. Where two consecutive points' environments differ in a
component that changes performance (jobs.judge.environment: torch, triton, CUDA, driver, GPU, CPU,
governor, clocks policy, threads) the series has an `EnvMark` on the later one; a change point that falls on
a mark carries its changes (`Change.environment`): "environment changed there", not only the commit.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cache, cached_property
from typing import Any

from sqlalchemy import Connection, Row, Select, String, cast, select, tuple_
from sqlalchemy.orm import Session

from jobs.history.changepoints import ChangePoint, e_divisive, e_divisive_many
from jobs.history.summary_stats import SummaryStats, stats_of
from jobs.judge.baselines import env_class, point_config
from jobs.judge.environment import Difference, changed_text, changes, performance
from jobs.store import Environment, Job, Store, TrialRow
from jobs.store.tables.trials import shape_key
from kernels.base import TrialStatus

MEDIAN_SE_FACTOR = 1.2533  # sd of the median of n normal samples / (sd / sqrt(n)), large n
CONTAMINATED_FLAGS = frozenset({"contended", "drift", "throttled"})
# A change point whose level moves less than this (relative) is not a change a farm reports: with the
# run-queue-corrected CPU level a flat series' points differ by ~0.01%, which e-divisive can call
# significant (issue 45: 2 such points in 10 unchanged series of python -m benchmarks history-noise --fresh).
MIN_CHANGE = 0.01
# The newest jobs of a point that `farm history` and a site's kernel page show (unless --last or --all): a
# year of a nightly spec is 1,825, and what a page shows is what it costs to build
DEFAULT_LAST = 100


@dataclass(frozen=True)
class PointKey:
    family: str
    backend: str
    shape: tuple[tuple[str, Any], ...]
    config: tuple[tuple[str, Any], ...]
    dtype: str
    env: str

    @cached_property  # a site's night asks each of 2,000 points' label and slug a few times
    def label(self) -> str:
        shape = " ".join(f"{k}={v}" for k, v in self.shape) or "-"
        config = " ".join(f"{k}={v}" for k, v in self.config)
        return " ".join(p for p in (self.family, self.backend, shape, config, self.dtype) if p)

    @cached_property
    def slug(self) -> str:
        """A file name for the point (the site's kernel pages)."""
        raw = f"{self.label} {self.env}"
        return "".join(c if c.isalnum() or c in "=-." else "_" for c in raw).strip("_")[:180]


@dataclass(slots=True)  # a family's read holds 50,000: a third of the memory of a dict each
class HistoryPoint:
    job_id: int
    job_name: str
    commit: str | None
    created_at: datetime
    trial_id: int
    median_ns: float
    p10_ns: float | None
    p90_ns: float | None
    iqr_ns: float | None
    n: int | None
    mad_ns: float | None = None
    flags: tuple[str, ...] = ()  # the measurement's (kernels.base.Summary.flags)
    env: Mapping[str, Any] | None = None  # the environment its trial ran in (cluster.environment.collect)

    @property
    def level_ns(self) -> float:
        """What change detection reads: the median of the kept samples (see the module docstring)."""
        return self.median_ns

    @property
    def uncertainty_ns(self) -> float | None:
        """The standard error of the level for normal noise of the samples' spread; None without one."""
        if self.mad_ns is None or not self.n:
            return None
        return MEDIAN_SE_FACTOR * 1.4826 * self.mad_ns / self.n**0.5

    @property
    def contended(self) -> bool:
        """Measured while other processes had the cores, drifting, or throttled: kept, not detected on."""
        return bool(self.flags) and not CONTAMINATED_FLAGS.isdisjoint(self.flags)

    @property
    def spread_pct(self) -> float | None:
        return 100 * self.iqr_ns / self.median_ns if self.iqr_ns is not None and self.median_ns else None


@dataclass
class Change:
    job_id: int  # the first job after the change
    commit: str | None
    index: int
    before_ns: float
    after_ns: float
    magnitude: float  # after / before - 1 (+0.2: 20% slower)
    p_value: float
    environment: list[Difference] = field(default_factory=list)  # changed at the same job (performance)


@dataclass
class EnvMark:
    """A job whose environment differs from the previous job's in a component that changes performance."""

    job_id: int
    commit: str | None
    index: int
    changes: list[Difference]

    @property
    def text(self) -> str:
        return changed_text(self.changes)


@dataclass
class Series:
    key: PointKey
    points: list[HistoryPoint] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    marks: list[EnvMark] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return self._dict([_job_dict(p) for p in self.points])

    def _dict(self, jobs: Any) -> dict[str, Any]:
        """`to_dict` with `jobs` for its jobs."""
        return {
            "point": {
                "family": self.key.family,
                "backend": self.key.backend,
                "shape": dict(self.key.shape),
                "config": dict(self.key.config),
                "dtype": self.key.dtype,
                "environment": self.key.env,
            },
            "jobs": jobs,
            "min_jobs": min_jobs(),
            "changes": [
                {
                    "job": c.job_id,
                    "commit": c.commit,
                    "before_ms": c.before_ns / 1e6,
                    "after_ms": c.after_ns / 1e6,
                    "magnitude": c.magnitude,
                    "p_value": c.p_value,
                    "environment": [d.to_list() for d in c.environment],
                }
                for c in self.changes
            ],
            "environment_changes": [
                {"job": m.job_id, "commit": m.commit, "changes": [d.to_list() for d in m.changes]}
                for m in self.marks
            ],
        }


def _job_dict(p: HistoryPoint) -> dict[str, Any]:
    """A point as `Series.to_dict` lists it among the series' jobs."""
    return {
        "job": p.job_id,
        "commit": p.commit,
        "created_at": p.created_at.isoformat(),
        "median_ms": p.median_ns / 1e6,
        "level_ms": p.level_ns / 1e6,
        "level_se_ms": se / 1e6 if (se := p.uncertainty_ns) is not None else None,
        "contended": p.contended,
        "spread_pct": p.spread_pct,
        "n": p.n,
    }


@dataclass(frozen=True)
class Selection:
    """Which points: any field left None matches every value. `spec` is a job (spec) name."""

    family: str | None = None
    backend: str | None = None
    shape: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    dtype: str | None = None
    spec: str | None = None
    jobs: frozenset[int] | None = None  # only these jobs' trials (a report's recent history)
    # only these (family, backend, shape key) series (the kernel pages a site rebuild touches)
    series: frozenset[tuple[str, str, str | None]] | None = None
    last: int | None = None  # only the newest this many jobs that ran the selected points (None: all)

    def matches(self, key: PointKey) -> bool:
        return (
            (self.family is None or key.family == self.family)
            and (self.backend is None or key.backend == self.backend)
            and (self.shape is None or dict(key.shape) == self.shape)
            and (self.config is None or dict(key.config) == self.config)
            and (self.dtype is None or key.dtype == self.dtype)
        )


def _key(t: Row, env: Environment | None) -> PointKey:
    return PointKey(
        family=t.family,
        backend=t.backend,
        shape=tuple(sorted(t.shape.items())),
        config=tuple(sorted(point_config(t).items())),  # type: ignore[arg-type]  # its family, backend, config
        dtype=t.dtype,
        env=env_class(env),
    )


@dataclass(frozen=True)
class _Point:
    """What _key reads of a trial."""

    family: str
    backend: str
    shape: dict[str, Any]
    config: dict[str, Any]
    dtype: str


def _point_key(keys: dict[tuple, PointKey], raw: tuple, envs: dict[int, Environment]) -> PointKey:
    """The point key of a trial's (family, backend, shape, config, dtype, environment id), its shape and
    config their stored JSON text: each distinct one decoded and keyed once, in `keys` (a family's year is
    a million trials of a thousand points)."""
    key = keys.get(raw)
    if key is None:
        family, backend, shape, config, dtype, env_id = raw
        point = _Point(family, backend, json.loads(shape), json.loads(config), dtype)
        env = envs.get(env_id) if env_id is not None else None
        key = keys[raw] = _key(point, env)  # type: ignore[arg-type]  # what _key reads of a trial
    return key


# What a point of a series needs of its trial: no metrics, correctness, memory or resources; the shape and
# config as their stored JSON text (decoded once a point), of the summary only the values a point keeps
# (`SummaryStats`). Its job's name, commit and date are read once a job (`_jobs_of`), not once a trial.
_COLUMNS = (
    TrialRow.id,
    TrialRow.job_id,
    TrialRow.family,
    TrialRow.backend,
    cast(TrialRow.shape, String).label("shape"),
    cast(TrialRow.config, String).label("config"),
    TrialRow.dtype,
    TrialRow.median_ns,
    TrialRow.environment_id,
    SummaryStats().label("stats"),
)


def series_query(selection: Selection) -> Select:
    """The selected points' trials, by job (id) and each job's in order (`_in_commit_order` puts the jobs
    in the order they were created: the database sorted rows of the jobs table it had joined, a tenth of a
    family's read): family, backend, shape (by its stored key, the index ix_trials_series), dtype and spec
    filtered by the database; the config (which a backend's variant keys leave out of the point) and the
    environment class are matched after."""
    q = (
        select(*_COLUMNS)
        .join(Job, Job.id == TrialRow.job_id)
        .where(TrialRow.status == TrialStatus.OK, TrialRow.median_ns.is_not(None))
        .order_by(TrialRow.job_id, TrialRow.seq)
    )
    if selection.last is not None and _whole_jobs(selection):
        # a family's newest jobs: their trials by the job's index (with the family in the statement, the
        # planner walks the family's whole series index: a year's million trials); the family is matched
        # after, as the config is
        newest = TrialRow.job_id.in_(_newest_jobs(selection))
        return _selected(q, replace(selection, family=None)).where(newest)
    q = _selected(q, selection)
    if selection.last is not None:
        q = q.where(TrialRow.job_id.in_(_newest_jobs(selection)))
    return q


def _whole_jobs(selection: Selection) -> bool:
    """Whether the selection is a family's or a spec's every point (its jobs' whole trials)."""
    narrower = (selection.backend, selection.shape, selection.dtype, selection.jobs, selection.series)
    return all(v is None for v in narrower)


def _selected(q: Select, selection: Selection) -> Select:
    """`q` (of trials joined to their jobs) narrowed to what the database filters of `selection`."""
    if selection.family is not None:
        q = q.where(TrialRow.family == selection.family)
    if selection.backend is not None:
        q = q.where(TrialRow.backend == selection.backend)
    if selection.shape is not None:
        q = q.where(TrialRow.shape_key == shape_key(selection.shape))
    if selection.dtype is not None:
        q = q.where(TrialRow.dtype == selection.dtype)
    if selection.spec is not None:
        q = q.where(Job.name == selection.spec)
    if selection.jobs is not None:
        q = q.where(TrialRow.job_id.in_(sorted(selection.jobs)))
    if selection.series is not None:
        keys = sorted(selection.series, key=repr)
        q = q.where(tuple_(TrialRow.family, TrialRow.backend, TrialRow.shape_key).in_(keys))
    return q


def _newest_jobs(selection: Selection) -> Select:
    """The ids of the newest `selection.last` jobs that ran the selected points: a family's or a spec's
    newest jobs from the jobs table (a family's year is a million trials, its jobs a few thousand);
    narrower, the newest jobs among the selected trials' (one series': by its indexed key)."""
    newest = (Job.created_at.desc(), Job.id.desc())
    if _whole_jobs(selection):
        q = select(Job.id)
        if selection.family is not None:
            q = q.where(Job.family == selection.family)
        if selection.spec is not None:
            q = q.where(Job.name == selection.spec)
        return q.order_by(*newest).limit(selection.last)
    ran = (
        select(TrialRow.job_id).join(Job, Job.id == TrialRow.job_id).where(TrialRow.status == TrialStatus.OK)
    )
    ran = _selected(ran, selection).group_by(TrialRow.job_id, Job.created_at, Job.id)
    return ran.order_by(*newest).limit(selection.last)


def _environments(s: Session, ids: set[int]) -> dict[int, Environment]:
    """The environments the points ran in, each read once (one object per environment: a series compares
    consecutive points' environments by identity first)."""
    if not ids:
        return {}
    return {e.id: e for e in s.scalars(select(Environment).where(Environment.id.in_(ids)))}


_UNSEEN = object()


def _jobs_of(conn: Connection, ids: set[int]) -> dict[int, tuple[str, str | None, datetime]]:
    """(name, git_commit, created_at) of each job in `ids`, read once a job, a thousand ids a statement."""
    ordered = sorted(ids)
    out: dict[int, tuple[str, str | None, datetime]] = {}
    for start in range(0, len(ordered), 1000):
        q = select(Job.id, Job.name, Job.git_commit, Job.created_at).where(
            Job.id.in_(ordered[start : start + 1000])
        )
        out.update((r.id, (r.name, r.git_commit, r.created_at)) for r in conn.execute(q))
    return out


@contextmanager
def paused_gc() -> Iterator[None]:
    """Python's cyclic collector paused while a read builds its points (and while `farm history` writes
    them, and while `farm site` builds its pages): tens of thousands of objects, none of them in a cycle,
    that made it scan the whole heap again and again (a quarter of a family's read), freed by their counts
    once the command drops them; set back as it was after (inside another pause: left paused)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _in_commit_order(rows: list[Row], jobs: dict[int, tuple[str, str | None, datetime]]) -> list[Row]:
    """`rows` (trials by job id, then seq) with their jobs in the order they were created (then by id), each
    job's trials in their order; as they are where no job was created before one of a lower id."""
    ids = sorted(jobs)
    order = sorted(ids, key=lambda j: (jobs[j][2], j))
    if order == ids:
        return rows
    rank = {j: i for i, j in enumerate(order)}
    return sorted(rows, key=lambda r: rank[r[1]])  # stable: a job's trials stay in their order


def collect(store: Store, selection: Selection | None = None, *, detect: bool = True) -> list[Series]:
    """Every selected point's series (one query, reading only the selected points' trials, then their
    jobs and the environments they ran in), with its change points when `detect`."""
    selection = selection or Selection()
    with paused_gc():
        out = _read(store, selection)
        for series in out:
            series.marks = environment_marks(series.points)
        if detect:
            for series, found in zip(out, changes_of_many([s.points for s in out]), strict=True):
                series.changes = found
    return out


def _read(store: Store, selection: Selection) -> list[Series]:
    """The selected points' series, their points in commit order (no change points, no marks)."""
    by_key: dict[PointKey, Series] = {}
    keys: dict[tuple, PointKey] = {}
    of_raw: dict[tuple, Series | None] = {}  # a trial's stored point -> its series (None: not selected)
    with store.engine.connect() as conn:
        rows = conn.execute(series_query(selection)).all()
        jobs = _jobs_of(conn, {r[1] for r in rows})
    rows = _in_commit_order(rows, jobs)
    with Session(store.engine, expire_on_commit=False) as s:
        envs = _environments(s, {r[8] for r in rows if r[8] is not None})
    env_data = {i: e.data for i, e in envs.items()}
    stats = stats_of([r[9] for r in rows])
    for (tid, job_id, fam, backend, shape, config, dtype, median, env_id, _), values in zip(
        rows, stats, strict=True
    ):
        raw = (fam, backend, shape, config, dtype, env_id)
        series = of_raw.get(raw, _UNSEEN)
        if series is _UNSEEN:
            key = _point_key(keys, raw, envs)
            series = of_raw[raw] = by_key.setdefault(key, Series(key)) if selection.matches(key) else None
        if series is None:
            continue
        points = series.points
        if points and points[-1].job_id == job_id:
            continue  # the same point twice in one job (it differs only in variant keys): the first counts
        name, commit, created = jobs[job_id]
        p10, p90, iqr, mad, n, flags = values
        points.append(
            HistoryPoint(
                job_id,
                name,
                commit,
                created,
                tid,
                float(median),
                p10,
                p90,
                iqr,
                n,
                mad,
                flags,
                env_data.get(env_id) if env_id is not None else None,
            )  # fmt: skip
        )
    return list(by_key.values())


def _env_change(points: list[HistoryPoint], i: int) -> list[Difference]:
    """What changed that changes performance, from the point before `i` to point `i`."""
    if not i or points[i - 1].env is points[i].env:  # one stored environment: one object per read
        return []
    return performance(changes(points[i - 1].env, points[i].env))


def environment_marks(points: list[HistoryPoint]) -> list[EnvMark]:
    """The points whose environment differs from the previous point's in a performance component."""
    out = []
    for i in range(1, len(points)):
        if points[i].env is not points[i - 1].env and (found := _env_change(points, i)):
            out.append(EnvMark(points[i].job_id, points[i].commit, i, found))
    return out


def changes_of(points: list[HistoryPoint]) -> list[Change]:
    """The change points of a series, on the points' levels. Contended points are left out of the search
    while at least min_jobs() clean ones remain; a change found between two clean points is attributed to
    the first job between them whose level is nearer the new level than the old (the clean one after, if
    none is); one that moves the level less than MIN_CHANGE is none. A change at a job whose environment
    changed (a performance component) names the change."""
    return changes_of_many([points])[0]


def changes_of_many(many: list[list[HistoryPoint]]) -> list[list[Change]]:
    """`changes_of` of each series, the searches' first steps taken together (e_divisive_many)."""
    used = []
    for points in many:
        clean = [p for p in points if not p.contended]
        used.append(clean if len(clean) >= min_jobs() else points)
    found = e_divisive_many([[p.level_ns for p in u] for u in used])
    return [_attributed(p, u, f) for p, u, f in zip(many, used, found, strict=True)]


def _attributed(
    points: list[HistoryPoint], used: list[HistoryPoint], found: list[ChangePoint]
) -> list[Change]:
    """The change points `found` in the levels of `used` (of `points`), each on its job (changes_of)."""
    out = []
    for c in found:
        if abs(c.magnitude) < MIN_CHANGE:
            continue
        at = points.index(used[c.index])
        start = points.index(used[c.index - 1]) + 1 if c.index else 0
        for i in range(start, at):
            if abs(math.log(points[i].level_ns / c.after)) < abs(math.log(points[i].level_ns / c.before)):
                at = i
                break
        first = points[at]
        env = _env_change(points, at)
        out.append(Change(first.job_id, first.commit, at, c.before, c.after, c.magnitude, c.p_value, env))
    return out


@cache
def min_jobs() -> int:
    """The fewest points of a series in which E-divisive means (at its settings) can call a change: the
    length of the shortest clean step it finds, a step of twice the level with no noise at all."""
    for n in range(6, 64):
        step = [1.0] * (n // 2) + [2.0] * (n - n // 2)
        if e_divisive(step):
            return n
    return 64
