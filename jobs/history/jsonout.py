"""`farm history --json`: the series as a JSON list of their `Series.to_dict()`, indented, each job of a
series on a line of its own, written a series at a time (a family's newest 100 jobs are 1,000 series of
50 points: 13 MB). A job's line is made from a template where its numbers allow, else by json.dumps of
its dict (`_job_dict`): the same bytes either way (tests/jobs/test_history_jsonout.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from jobs.history.series import HistoryPoint, Series, _job_dict

_INF = float("inf")


def _json(v: Any) -> str:
    """`v` as `farm history --json` writes a value."""
    return json.dumps(v, default=str)


# A job of a series as _json writes `_job_dict(p)`, where its numbers are finite floats and n an int: json
# writes such a float as its repr and an int as its repr; the job, commit and date (`_JobJson`) are written
# once a job, a level that is its median (HistoryPoint.level_ns) once (a float's repr is most of a line's
# cost). The values are those of _job_dict, checked against it (tests/jobs/test_history.py).
_JOB_LINE = (
    '%s"median_ms": %s, "level_ms": %s, "level_se_ms": %r, "contended": %s, "spread_pct": %r, "n": %r}'
)


class _JobJson(dict):
    """The opening of a job's line, `{"job": ..., "commit": ..., "created_at": ..., `, made once a job
    (a family's series share their jobs) by _json, keyed by (job, commit, date)."""

    def __missing__(self, key: tuple[Any, str | None, datetime]) -> str:
        job, commit, created = key
        head = _json({"job": job, "commit": commit, "created_at": created.isoformat()})[:-1] + ", "
        self[key] = head
        return head


def _jobs_json(points: list[HistoryPoint], heads: _JobJson) -> list[str]:
    """Each point as _json writes `_job_dict(p)`: by `_JOB_LINE` where its numbers allow (the values of
    the dict, without the dict), else by _json of the dict."""
    out = []
    append, line, inf = out.append, _JOB_LINE, _INF
    for p in points:
        median_ns, level_ns = p.median_ns, p.level_ns
        median, se, spread, n = median_ns / 1e6, p.uncertainty_ns, p.spread_pct, p.n
        level = median if level_ns is median_ns else level_ns / 1e6
        if se is not None:
            se = se / 1e6
        if (
            type(median) is float and type(level) is float and type(se) is float and type(spread) is float
            and type(n) is int and -inf < median + level + se + spread < inf
        ):  # fmt: skip
            head = heads[p.job_id, p.commit, p.created_at]
            median_text = repr(median)
            level_text = median_text if level is median else repr(level)
            append(line % (head, median_text, level_text, se, "true" if p.contended else "false", spread, n))
        else:
            append(_json(_job_dict(p)))
    return out


def series_json(found: list[Series]) -> str:
    """The series as `farm history --json` prints them: a JSON list of `Series.to_dict()`, indented, each
    job of a series on a line of its own (`series_json_parts` joined)."""
    return "".join(series_json_parts(found))


def series_json_parts(found: list[Series]) -> Iterator[str]:
    """`series_json` a series at a time (a family's is 13 MB: written as it is made, not held whole). Made
    by the json module's C encoder (with `indent` json is pure Python: 1,000 series of 30 points took 0.4
    s), a job's line by `_jobs_json`: 1,000 series of 50 points are 50,000 lines, and a dict a line cost
    more than the rest of the command."""
    if not found:
        yield "[]"
        return
    heads = _JobJson()
    for i, s in enumerate(found):
        fields = []
        for name, v in s._dict(None).items():
            if name != "jobs":
                v = _json(v)
            elif s.points:
                v = "[\n      " + ",\n      ".join(_jobs_json(s.points, heads)) + "\n    ]"
            else:
                v = "[]"
            fields.append(f"    {_json(name)}: {v}")
        yield ("[\n" if i == 0 else ",\n") + "  {\n" + ",\n".join(fields) + "\n  }"
    yield "\n]"
