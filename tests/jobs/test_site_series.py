"""jobs.report.site_series: a kernel page's kept series (kernels/<slug>.json) reads back as the series it
was, and a window merged with the jobs read again is the window of the whole series, or None where the kept
window cannot tell it."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest

from benchmarks import history_store as hs
from jobs.history.series import HistoryPoint, PointKey, Series, collect
from jobs.report.site_series import dumps, found, loads, merged, window
from jobs.store import Store

KEY = PointKey("probe", "spin", (("n", 0),), (("ms", 3),), "float32", "cpu: Synthetic CPU")
T0 = datetime(2026, 1, 1)
ENV = {"torch": "2.13.0", "device_kind": "cpu"}


def _point(job: int, median: float = 1e6, env: dict | None = ENV) -> HistoryPoint:
    return HistoryPoint(
        job, "spec", f"c{job}", T0 + timedelta(hours=job), 100 + job, median, 0.9e6, 1.1e6, 1e4, 7, 5e3,
        ("contended",) if job % 5 == 0 else (), env,
    )  # fmt: skip


def _series(jobs) -> Series:
    return Series(KEY, [_point(j) for j in jobs])


def test_a_stored_series_reads_back_as_it_was(tmp_path):
    store = Store(str(tmp_path / "farm.db"))
    try:
        hs.build_history_store(store, jobs=8, slow_from=5)
        for s in collect(store, detect=False):
            back = loads(dumps(s))
            assert back is not None and back.key == s.key and back.key.slug == s.key.slug
            assert back.points == s.points  # every field, the environment's mapping included
            assert dumps(back) == dumps(s)
    finally:
        store.close()


def test_environments_are_kept_once_and_read_back_as_one_object():
    s = Series(
        KEY,
        [_point(1), _point(2, env=dict(ENV)), _point(3, env={**ENV, "torch": "2.14.0"}), _point(4, env=None)],
    )
    text = dumps(s)
    assert text.count('"torch"') == 2
    back = loads(text)
    assert back.points[0].env is back.points[1].env and back.points[3].env is None
    found([back])
    assert [m.job_id for m in back.marks] == [3]


@pytest.mark.parametrize(
    "text", ["", "[]", '{"format": 2}', '{"format": 1, "point": {}}', '{"format": 1, "jobs": [[1]]}']
)
def test_anything_else_reads_as_none(text):
    assert loads(text) is None


def test_a_merged_window_is_the_whole_series_newest_points():
    whole = _series(range(1, 11))
    kept = window(_series(range(1, 9)), 5)  # jobs 4..8 kept
    fresh = Series(KEY, [_point(9), _point(10)])
    assert [p.job_id for p in merged(kept, fresh, {9, 10}, 5).points] == [
        p.job_id for p in window(whole, 5).points
    ]
    # a shown job read again with a new value replaces its point in place
    again = Series(KEY, [_point(7, median=2e6)])
    w = merged(kept, again, {7}, 5)
    assert [p.job_id for p in w.points] == [4, 5, 6, 7, 8] and w.points[3].median_ns == 2e6
    # a new series, and one not yet full that loses a point: the kept points are all there are
    assert [p.job_id for p in merged(None, fresh, {9, 10}, 5).points] == [9, 10]
    assert [p.job_id for p in merged(_series([1, 2]), None, {2}, 5).points] == [1]


def test_a_full_window_that_loses_a_point_asks_for_the_store():
    kept = window(_series(range(1, 9)), 5)
    assert merged(kept, None, {8}, 5) is None  # job 3 would slide in: not kept
    assert merged(None, None, {8}, 5) is None
    # points ordered by creation, then job id, as the store's read orders them
    late = replace(_point(2), created_at=T0 + timedelta(days=30))
    assert [p.job_id for p in merged(kept, Series(KEY, [late]), {2}, 5).points] == [5, 6, 7, 8, 2]


def test_a_job_older_than_a_full_window_is_no_fill_for_a_point_it_lost():
    """Jobs 4..8 kept (full, 5); job 6 lost its point and job 1, older than the window, gained one: job 3,
    which the window does not keep, may be newer than 1 and belong: the store must say."""
    kept = window(_series(range(1, 9)), 5)
    assert merged(kept, Series(KEY, [_point(1)]), {1, 6}, 5) is None
    # a point gained at or after the window's oldest fills it
    assert [p.job_id for p in merged(kept, Series(KEY, [_point(9)]), {6, 9}, 5).points] == [4, 5, 7, 8, 9]
