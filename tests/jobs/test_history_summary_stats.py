"""A point's statistics from the database's column of them (jobs.history.summary_stats.stats_of, issue 46):
each JSON list typed as Summary.from_stored types the summary's own values, the lists decoded together;
a summary the database could not read (NaN, Infinity: its text, an object) read by Summary.from_stored;
none (NULL or empty): no statistics. The database's side, on SQLite and PostgreSQL, is
tests/jobs/test_history_query.py's test_a_points_statistics_are_read_as_the_stored_summary_reads."""

from __future__ import annotations

import json

from jobs.history.summary_stats import stats_of
from kernels.base import Summary

STATS = ("p10", "p90", "iqr", "mad", "n", "flags")
SUMMARIES = [
    {"p10": 1.5, "p90": 3.0, "iqr": 0.25, "mad": 0.1, "n": 100, "flags": []},  # the common case
    {"p10": 1.5, "p90": 3.0, "iqr": 0.25, "mad": 0.1, "n": 100, "flags": ["contended", 3, None]},
    {"p10": 1, "p90": 3, "iqr": 0, "mad": 2, "n": 7},  # ints where floats are read; no flags
    {"p10": True, "p90": "1.5", "iqr": None, "mad": [1], "n": 7.0, "flags": None},  # wrong types
    {"p10": 1e308, "p90": 1e308, "iqr": 1e308, "mad": 1e308, "n": -3, "flags": []},  # a sum past finite
    {"p10": -0.0, "p90": 5e-324, "iqr": 0.0, "mad": 0.0, "n": 0, "flags": {}},
    {},
]


def _column(summary: dict) -> str:
    """What the database's column holds for a summary it can read: the six values' JSON list."""
    return json.dumps([summary.get(k) for k in STATS])


def _expected(summary: dict) -> tuple:
    s = Summary.from_stored(summary)
    return s.p10, s.p90, s.iqr, s.mad, s.n, s.flags


def test_each_trials_statistics_are_typed_as_the_stored_summary_reads():
    unread = '{"n": 5, "p10": NaN, "p90": 2.0, "mad": Infinity, "flags": ["throttled"]}'
    texts = [_column(s) for s in SUMMARIES] + [unread, None, ""]
    found = stats_of(texts)
    want = (
        [_expected(s) for s in SUMMARIES]
        + [_expected(json.loads(unread))]
        + [(None, None, None, None, 0, ())] * 2
    )
    assert found == want
    for got, expected in zip(found, want, strict=True):  # the same types: 1.0, not 1; (), not []
        assert [type(v) for v in got] == [type(v) for v in expected]
    assert repr(found[5][0]) == "-0.0"  # a sign kept
    assert stats_of([]) == []
