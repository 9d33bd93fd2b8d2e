"""A kernel page's series as the site keeps it (issue 46): the newest `last` points of the point's history
(jobs.history.series.DEFAULT_LAST, what `farm history` shows), written beside the page as
kernels/<slug>.json. A rebuild after a night reads only the trials of the jobs that ran since, merges
their points into the kept windows, and finds the change points and environment marks again on each
window it touched: its cost is the night's, not the store's (a year of a nightly spec is 1,825 points a
series; reading the whole of each touched series took 615 s at a year on PostgreSQL).

What a rebuild keeps is what a full build makes from the store, the newest `last` points of every series
(tests/jobs/test_site_incremental.py compares them byte for byte); where that cannot be told from the kept
window (a full window lost a point and the one before it is not kept) `merged` says so and the site reads
that series from the store again.

The file is the page's data for a reader too: the point, the environments its jobs ran in (each once) and
a row per job, oldest first: job id, spec, commit, created (ISO 8601), trial id, median, p10, p90, IQR (ns),
n, MAD (ns), the measurement's flags and the environment (its index in `environments`)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

from jobs.history.series import HistoryPoint, PointKey, Series, changes_of_many, environment_marks

FORMAT = 1


def window(series: Series, last: int) -> Series:
    """`series` cut to its newest `last` points (no change points or marks: `found` gives those)."""
    return Series(series.key, series.points[-last:])


def found(windows: list[Series]) -> None:
    """Each window's environment marks and change points, on its own points."""
    for s in windows:
        s.marks = environment_marks(s.points)
    for s, changes in zip(windows, changes_of_many([s.points for s in windows]), strict=True):
        s.changes = changes


def _order(p: HistoryPoint) -> tuple[datetime, int]:
    return p.created_at, p.job_id  # the order jobs.history.series puts points in (commit order)


def merged(kept: Series | None, fresh: Series | None, ran: set[int], last: int) -> Series | None:
    """The window once the jobs `ran` (new ones, or ones whose results moved) were read again: `kept`
    without their points, with their points now (`fresh`), the newest `last`. None where the store must
    be read: `kept` was full (older points may exist beyond it) and fewer than `last` points are left from
    its oldest one on (a point of a job older than the window is no fill: one between may be newer)."""
    if kept is None and fresh is None:
        return None
    key = (kept or fresh).key  # type: ignore[union-attr]  # one of them is there
    old = [p for p in kept.points if p.job_id not in ran] if kept is not None else []
    points = old + (fresh.points if fresh is not None else [])
    if kept is not None and kept.points and len(kept.points) >= last:
        oldest = _order(kept.points[0])
        if sum(_order(p) >= oldest for p in points) < last:
            return None
    points.sort(key=_order)
    return Series(key, points[-last:])


def dumps(series: Series) -> str:
    """The window as kernels/<slug>.json holds it (see the module docstring)."""
    envs: dict[str, int] = {}  # each environment once, by its content, in the order the jobs met them
    of_object: dict[int, int | None] = {}  # a read's points share an environment's mapping: each read once
    rows = []
    for p in series.points:
        env = of_object.get(id(p.env), -1)
        if env == -1:
            env = None if p.env is None else envs.setdefault(json.dumps(p.env, sort_keys=True), len(envs))
            of_object[id(p.env)] = env
        rows.append(
            [
                p.job_id,
                p.job_name,
                p.commit,
                _iso(p.created_at),
                p.trial_id,
                p.median_ns,
                p.p10_ns,
                p.p90_ns,
                p.iqr_ns,
                p.n,
                p.mad_ns,
                p.flags,  # a tuple: a JSON array
                env,
            ]  # fmt: skip
        )
    k = series.key
    point = {
        "family": k.family,
        "backend": k.backend,
        "shape": [list(kv) for kv in k.shape],
        "config": [list(kv) for kv in k.config],
        "dtype": k.dtype,
        "environment": k.env,
    }
    head = json.dumps({"format": FORMAT, "point": point})[:-1]
    return f'{head}, "environments": [{", ".join(envs)}], "jobs": {json.dumps(rows)}}}'


def loads(text: str) -> Series | None:
    """A window `dumps` wrote; None for anything else (another format, a damaged file)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        return _series(data)
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def _series(data: dict[str, Any]) -> Series:
    p = data["point"]
    key = PointKey(
        p["family"],
        p["backend"],
        tuple((k, v) for k, v in p["shape"]),
        tuple((k, v) for k, v in p["config"]),
        p["dtype"],
        p["environment"],
    )
    envs = data["environments"]
    points = [
        HistoryPoint(
            job,
            name,
            commit,
            _when(created),
            trial,
            median,
            p10,
            p90,
            iqr,
            n,
            mad,
            tuple(flags) if flags else (),
            envs[env] if env is not None else None,
        )  # fmt: skip
        for job, name, commit, created, trial, median, p10, p90, iqr, n, mad, flags, env in data["jobs"]
    ]
    return Series(key, points)


@lru_cache(maxsize=8192)
def _iso(created: datetime) -> str:
    """A job's creation time as ISO text: written once for all the series it is on."""
    return created.isoformat()


@lru_cache(maxsize=8192)
def _when(created: str) -> datetime:
    """A job's creation time from its ISO text: a night's site reads each job's on a thousand series."""
    return datetime.fromisoformat(created)
