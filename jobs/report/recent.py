"""A job's report's recent history: for each of its points that earlier jobs also measured, the point's
median over the last HISTORY_JOBS jobs (a sparkline, this job the last dot) and the change from the
previous job, with what changed in the environment between them when a performance component did.

The points are the series `farm history` draws (jobs.history.series: the same point keys, the first of a
point's trials in a job, commit order), read from the family's newest RECENT_JOBS x HISTORY_JOBS jobs up
to this one (several specs of a family interleave), HISTORY_JOBS of them at a time from the newest until
each of the job's points has its HISTORY_JOBS: a report's cost does not grow with the store. Only what the
table shows is read: a trial's id, job, median and environment, each distinct shape, config and
environment decoded once (jobs.history.series.collect decodes every trial's summary, 0.1 ms a trial: 2 s
for a job of 500 points among 80 jobs).

`RecentReads` keeps what it read: each job's rows are read and keyed once, however many pages show them.
A site's night (`farm site`: 20 job pages, a nightly spec's 5 runs sharing their last 20 jobs) reads each
of those jobs once, for the series of all its pages, instead of once a page.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
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


@dataclass
class _JobRows:
    """A job's timed rows as the history uses them: the groups its points are counted by (family, backend,
    shape key, dtype, config, environment) and, per point key, its rows (trial, median, environment id,
    group) in grid order; keys and groups by their number in RecentReads (a PointKey hashes its nested
    tuples each time: 1 us, a page's 20,000 lookups)."""

    groups: frozenset[int]
    by_key: dict[int, list[tuple]]


def _series_text(series: Iterable[tuple[str, str, str]]) -> list[str]:
    return sorted({"/".join(s) for s in series})


class RecentReads:
    """The recent history's reads, each job's rows read and keyed once: for one page (recent_history's
    own), or for the pages of `pages` (a site's night), whose series it reads in one statement and whose
    jobs' rows it reads for all of them at once."""

    def __init__(self, store: Store, pages: Iterable[int] = ()) -> None:
        self.store = store
        self._series: dict[int, set[tuple[str, str, str]]] = {}  # a page's job -> its series
        self._selected: set[tuple[str, str, str]] = set()  # the series the rows read are of
        self._jobs: dict[int, _JobRows] = {}
        self._order: dict[int, tuple[Any, int]] = {}  # job -> (created, id): commit order
        self._commits: dict[int, str | None] = {}
        self._keys: dict[
            tuple, int
        ] = {}  # a row's (family, backend, shape, config, dtype, env) -> key number
        self._key: list[PointKey] = []  # a key's number -> the key
        self._key_of: dict[PointKey, int] = {}
        self._key_series: list[tuple[str, str, str]] = []  # a key's number -> its series
        self._key_groups: list[set[int]] = []  # a key's number -> its groups
        self._groups: dict[tuple, int] = {}  # a group -> its number
        self._group_keys: list[set[int]] = []  # a group's number -> its keys
        self._envs: dict[int, Environment | None] = {}
        pages = sorted(set(pages))
        if pages:
            self._read_series(pages)

    # ---- reads -------------------------------------------------------------------------------------
    def _read_series(self, jobs: list[int]) -> None:
        """(family, backend, shape key) of the jobs' timed trials: the series their points are on."""
        q = select(TrialRow.job_id, TrialRow.family, TrialRow.backend, TrialRow.shape_key).where(
            TrialRow.job_id.in_(jobs) if len(jobs) > 1 else TrialRow.job_id == jobs[0],
            TrialRow.status == TrialStatus.OK,
            TrialRow.median_ns.is_not(None),
        )
        found: dict[int, set[tuple[str, str, str]]] = {j: set() for j in jobs}
        with self.store.engine.connect() as conn:
            for job, *series in conn.execute(q):
                found[job].add(tuple(series))
        self._series.update(found)
        wanted = set().union(*found.values())
        if not wanted <= self._selected:
            self._selected |= wanted
            self._jobs.clear()  # read for fewer series: read again when needed

    def _series_of(self, job_id: int) -> set[tuple[str, str, str]]:
        if job_id not in self._series:
            self._read_series([job_id])
        return self._series[job_id]

    def _read_order(self, jobs: list[int]) -> None:
        missing = [j for j in jobs if j not in self._order]
        if not missing:
            return
        q = select(Job.id, Job.created_at, Job.git_commit).where(Job.id.in_(missing))
        with self.store.engine.connect() as conn:
            for job, created, commit in conn.execute(q):
                self._order[job] = (created, job)
                self._commits[job] = commit

    def _read_rows(self, jobs: list[int]) -> None:
        """The timed rows of these jobs (those not read yet) on the selected series, in one statement."""
        missing = sorted(j for j in jobs if j not in self._jobs)
        if not missing:
            return
        q = select(
            *(TrialRow.id, TrialRow.job_id, TrialRow.family, TrialRow.backend, TrialRow.shape_key),
            *(cast(TrialRow.shape, String), cast(TrialRow.config, String), TrialRow.dtype),
            *(TrialRow.median_ns, TrialRow.environment_id, TrialRow.seq),
        ).where(
            TrialRow.job_id.in_(missing),
            TrialRow.status == TrialStatus.OK,
            TrialRow.median_ns.is_not(None),
            # the series as one value: one IN that PostgreSQL hashes (a tuple IN is an OR of a term per
            # series, tried on each of the jobs' trials: 0.35-0.55 s of 500 series); exact unless a family
            # or backend name has a "/" in it (then the exact series are kept below)
            (TrialRow.family + "/" + TrialRow.backend + "/" + TrialRow.shape_key).in_(
                _series_text(self._selected)
            ),
        )
        selected = self._selected
        exact = any("/" in f + b for f, b, _k in selected)  # names the IN may confuse
        with self.store.engine.connect() as conn:
            # a job's rows in grid order (SQLite reads them so off the job's index; no sort of its own)
            rows = conn.execute(q.order_by(TrialRow.job_id, TrialRow.seq)).all()
        if exact:
            rows = [r for r in rows if (r[2], r[3], r[4]) in selected]
        self._read_envs({r[9] for r in rows if r[9] is not None})
        groups: dict[int, set[int]] = {j: set() for j in missing}
        by_key: dict[int, dict[int, list[tuple]]] = {j: {} for j in missing}
        keys, numbered = self._keys, self._groups
        for trial, job, family, backend, shape_key, shape, config, dtype, median, env_id, _seq in rows:
            raw = (family, backend, shape, config, dtype, env_id)
            key = keys.get(raw)
            if key is None:
                point = _Point(family, backend, json.loads(shape), json.loads(config), dtype)
                key = keys[raw] = self._number(
                    _key(point, self._envs.get(env_id)), (family, backend, shape_key)
                )  # type: ignore[arg-type]
            group = numbered.get(raw_group := (family, backend, shape_key, dtype, config, env_id))
            if group is None:
                group = numbered[raw_group] = len(self._group_keys)
                self._group_keys.append(set())
            groups[job].add(group)
            self._key_groups[key].add(group)
            self._group_keys[group].add(key)
            by_key[job].setdefault(key, []).append((trial, float(median), env_id, group))
        for job in missing:
            self._jobs[job] = _JobRows(frozenset(groups[job]), by_key[job])

    def _number(self, key: PointKey, series: tuple[str, str, str]) -> int:
        """A point key's number (a new one for a key not seen)."""
        found = self._key_of.get(key)
        if found is None:
            found = self._key_of[key] = len(self._key)
            self._key.append(key)
            self._key_series.append(series)
            self._key_groups.append(set())
        return found

    def _read_envs(self, ids: set[int]) -> None:
        """One object per environment (a series compares consecutive points' environments by identity)."""
        missing = sorted(ids - set(self._envs))
        if not missing:
            return
        from sqlalchemy.orm import Session

        with Session(self.store.engine) as s:
            for e in s.scalars(select(Environment).where(Environment.id.in_(missing))):
                self._envs[e.id] = e

    # ---- a page's series ---------------------------------------------------------------------------
    def _read_for(self, job_id: int, jobs: Iterable[int], last: int) -> list[int]:
        """The jobs whose rows the page's history takes, in commit order: `jobs`' newest `last` at a time
        until each of the job's points (groups) is in `last` of them."""
        ids = sorted(set(jobs))
        self._read_order(ids)
        order = self._order
        newest = sorted((j for j in ids if j in order), key=order.__getitem__, reverse=True)
        read: list[int] = []
        mine: frozenset[int] | None = None
        counts: Counter[int] = Counter()
        for start in range(0, len(newest), last):
            chunk = newest[start : start + last]
            self._read_rows(chunk)
            if mine is None:
                mine = self._jobs[job_id].groups if job_id in chunk else frozenset()
            for job in chunk:
                counts.update(mine & self._jobs[job].groups)
            read += chunk
            if all(counts[g] >= last for g in mine):
                break
        return sorted(read, key=order.__getitem__)

    def points(
        self, job_id: int, jobs: Iterable[int], last: int, *, own: bool = False
    ) -> dict[PointKey, list[tuple[int, tuple]]]:
        """Point key -> its points, each (job, (trial, median, environment id, group)), in commit order:
        of every key on the job's series (`own`: of the job's own points only), each of a point's groups
        from its newest `last` jobs, a job's first trial of the point."""
        series = self._series_of(job_id)
        if not series:
            return {}
        read = self._read_for(job_id, jobs, last)
        rows = self._jobs
        if own:
            wanted = set(rows[job_id].by_key) if job_id in rows and job_id in read else set()
        else:
            wanted = {k for j in read for k in rows[j].by_key if self._key_series[k] in series}
        having: dict[int, list[int]] = {k: [] for k in wanted}
        for j in read:
            for k in rows[j].by_key:
                if k in having:
                    having[k].append(j)
        out: dict[PointKey, list[tuple[int, tuple]]] = {}
        for key, jobs_of in having.items():
            groups = self._key_groups[key]
            if len(groups) == 1 and len(self._group_keys[next(iter(groups))]) == 1:
                # one group, only this key's: the jobs that have the key are the group's
                out[self._key[key]] = [(j, rows[j].by_key[key][0]) for j in jobs_of[-last:]]
                continue
            kept: dict[int, set[int]] = {}
            for group in {r[3] for j in jobs_of for r in rows[j].by_key[key]}:
                kept[group] = set([j for j in read if group in rows[j].groups][-last:])
            found = []
            for j in jobs_of:
                first = next((r for r in rows[j].by_key[key] if j in kept[r[3]]), None)
                if first is not None:
                    found.append((j, first))
            if found:
                out[self._key[key]] = found
        return out

    def history_point(self, job: int, row: tuple) -> HistoryPoint:
        """A point as jobs.history.series makes it, with what the recent history reads of it."""
        trial, median, env_id, _group = row
        env = self._envs.get(env_id) if env_id is not None else None
        return HistoryPoint(
            job_id=job,
            job_name="",
            commit=self._commits[job],
            created_at=None,  # type: ignore[arg-type]
            trial_id=trial,
            median_ns=median,
            p10_ns=None,
            p90_ns=None,
            iqr_ns=None,
            n=None,
            env=env.data if env is not None else None,
        )


def recent_series(
    store: Store,
    job_id: int,
    family: str,
    jobs: Iterable[int],
    last: int = HISTORY_JOBS,
    reads: RecentReads | None = None,
) -> dict[PointKey, list[HistoryPoint]]:
    """The series (point key -> its last `last` points, in commit order) of `jobs`' trials on the job's
    series (`jobs`: none after the job); `reads`: the reads to take them from (a site's night)."""
    reads = reads or RecentReads(store)
    found = reads.points(job_id, jobs, last)
    return {key: [reads.history_point(j, row) for j, row in points] for key, points in found.items()}


def recent_history(
    store: Store, job_id: int, family: str, last: int = HISTORY_JOBS, reads: RecentReads | None = None
) -> Table | None:
    """The table of the job's points that earlier jobs also measured (see the module's docstring);
    `reads`: the reads shared by several pages (a site's night)."""
    reads = reads or RecentReads(store)
    rows = []
    recent = store.recent_jobs(family, job_id, RECENT_JOBS * last)
    for key, points in reads.points(job_id, recent, last, own=True).items():
        at = next((i for i, (j, _row) in enumerate(points) if j == job_id), None)
        if at is None or at == 0:
            continue
        window = points[max(0, at - last + 1) : at + 1]
        (prev_job, prev), (_job, this) = window[-2], window[-1]
        pair = [reads.history_point(j, row) for j, row in window[-2:]]
        cells = [
            key.label,
            len(window),
            spark([row[1] for _j, row in window], marks=(len(window) - 1,)),
            f"{this[1] / 1e6:.4f}",
            f"{this[1] / prev[1] - 1:+.1%} (job {prev_job})"
            + "".join(f"; environment changed: {m.text}" for m in environment_marks(pair)),
        ]
        rows.append((this[0], cells))
    if not rows:
        return None
    rows.sort(key=lambda r: r[0])
    head = ["point", "jobs", f"median, last {last} jobs (red: this job)", "median ms", "vs previous job"]
    return Table(head, [cells for _, cells in rows], left=1)
