"""`farm history --json` (jobs.history.jsonout, issue 46): the series' to_dict() as json.dumps writes
them, each job on a line of its own; a job's line made from a template where its numbers allow, the same
bytes as json.dumps either way."""

from __future__ import annotations

import json

import numpy as np
from test_history import _points


def test_the_json_of_series_is_their_dicts_a_job_a_line():
    """`farm history --json` (series_json, issue 46): the series' to_dict() as json.dumps writes them, each
    job on a line of its own; no series: an empty list."""
    from dataclasses import replace

    from jobs.history.jsonout import series_json
    from jobs.history.series import PointKey, Series, changes_of, environment_marks

    rng = np.random.default_rng(7)
    levels = [20e6 * (1.6 if i >= 8 else 1.0) * rng.normal(1, 0.02) for i in range(16)]
    points = _points(levels, levels, contended=(3,))
    points[2] = replace(points[2], commit='a"b\\c\n', iqr_ns=None)  # what JSON escapes
    key = PointKey("probe", "wait", (("n", 64),), (("ms", 1),), "float32", "cpu:CPU A")
    found = [Series(key, points, changes_of(points), environment_marks(points)), Series(key, [], [], [])]
    text = series_json(found)
    assert json.loads(text) == json.loads(json.dumps([s.to_dict() for s in found], default=str))
    lines = text.splitlines()
    assert sum(line.lstrip().startswith('{"job": ') for line in lines) == len(points)
    assert json.loads(series_json([])) == []


def _one_job_a_line(found) -> str:
    """series_json as it was written before its lines were made by a template (issue 46): json.dumps of
    each field of to_dict(), the jobs' list broken between its jobs; the reference for its bytes."""

    def value(v):
        return json.dumps(v, default=str)

    out = []
    for s in found:
        fields = []
        for name, v in s.to_dict().items():
            if name == "jobs" and v:
                v = "[\n      " + value(v)[1:-1].replace('}, {"job": ', '},\n      {"job": ') + "\n    ]"
            else:
                v = value(v)
            fields.append(f"    {value(name)}: {v}")
        out.append("  {\n" + ",\n".join(fields) + "\n  }")
    return "[\n" + ",\n".join(out) + "\n]" if out else "[]"


def test_the_json_of_every_kind_of_job_is_the_bytes_json_dumps_writes():
    """A job's line is written from a template where its numbers are finite floats and its n an int, else
    by json.dumps: the same bytes either way, for values with no standard error or spread, not finite,
    numpy's floats and ints, huge and tiny numbers, n of 0 or None, a commit JSON escapes, no commit, and
    the jobs several series share."""
    from dataclasses import replace
    from datetime import datetime

    from jobs.history.jsonout import series_json
    from jobs.history.series import PointKey, Series, changes_of, environment_marks

    rng = np.random.default_rng(11)
    levels = [20e6 * (1.6 if i >= 8 else 1.0) * rng.normal(1, 0.02) for i in range(16)]
    base = _points(levels, levels, contended=(3, 4))
    odd = [
        {"mad_ns": None},
        {"iqr_ns": None},
        {"n": 0},
        {"n": None},
        {"median_ns": float("nan")},
        {"median_ns": float("inf")},
        {"median_ns": -float("inf"), "iqr_ns": 1.0},
        {"median_ns": np.float64(3.5e6)},
        {"median_ns": 1e308, "iqr_ns": 1e308},
        {"median_ns": 5e-324, "mad_ns": 5e-324},
        {"n": np.int64(20)},
        {"n": True},
        {"median_ns": 7, "mad_ns": 3},  # ints where floats are read
        {"commit": 'a"b\\c\n\u00e9\u2028'},
        {"commit": None, "created_at": datetime(2026, 2, 3, 4, 5, 6, 789)},
        {"flags": ("drift",)},
    ]
    points = [replace(p, **change) for p, change in zip(base, odd, strict=False)] + base[len(odd) :]
    key = PointKey("probe", "wait", (("n", 64),), (("ms", 1),), "float32", "cpu:CPU A")
    other = replace(key, backend="spin")
    found = [
        Series(key, points, changes_of(base), environment_marks(points)),
        Series(other, base, [], []),  # the same jobs as the first's: their openings made once
        Series(key, [], [], []),
    ]
    assert series_json(found) == _one_job_a_line(found)
    assert series_json(found[1:2]) == _one_job_a_line(found[1:2])
    assert series_json([]) == _one_job_a_line([]) == "[]"
