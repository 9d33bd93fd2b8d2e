"""What a point of `farm history` keeps of its trial's stored summary: p10, p90, iqr, mad, n and flags,
picked out by the database (`SummaryStats`, one column) and typed as Summary.from_stored types them
(`stats_of`): a point reads six of the summary's twenty values, and json.loads of the whole summary in
Python cost a read of a family's year more than the rest of it."""

from __future__ import annotations

import json
import math

from sqlalchemy import String
from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement

from jobs.store import TrialRow
from kernels.base import Summary

_STATS = ("p10", "p90", "iqr", "mad", "n", "flags")  # what a point keeps of its trial's summary


class SummaryStats(FunctionElement):
    """A trial's stored summary's p10, p90, iqr, mad, n and flags as a JSON list, picked out by the
    database (one json_extract of six paths on SQLite, one json_to_record on PostgreSQL: a point reads six of
    the summary's twenty values, and json.loads of the whole summary in Python cost a read of a family's
    year more than the rest of it). Where SQLite cannot read the summary as JSON (its json functions take
    no NaN or Infinity, which Python writes) the summary's own text (an object, `{`): that trial's values
    are read in Python (`_unread`). One column: the summary is tested once a trial."""

    inherit_cache = True
    name = "summary_stats"
    type = String()

    def __init__(self) -> None:
        super().__init__(TrialRow.summary)


@compiles(SummaryStats, "sqlite")
def _summary_stats_sqlite(element: SummaryStats, compiler, **kw) -> str:
    col = compiler.process(element.clauses.clauses[0], **kw)
    paths = ", ".join(f"'$.{k}'" for k in _STATS)
    return f"CASE WHEN json_valid({col}) THEN json_extract({col}, {paths}) ELSE {col} END"


@compiles(SummaryStats, "postgresql")
def _summary_stats_postgresql(element: SummaryStats, compiler, **kw) -> str:
    """The six values of one json_to_record of the summary (PostgreSQL's json is valid JSON, kept as its
    text): six `summary -> 'key'` parsed it six times, 480 of a family's 520 ms on the server at a year;
    one parse a trial halves it. A summary that is not an object (json_to_record refuses it) has none of
    the values, as `->` found none (the same text: tests/jobs/test_history_query.py)."""
    col = compiler.process(element.clauses.clauses[0], **kw)
    values = ", ".join(f"summary_stats.{k}" for k in _STATS)
    fields = ", ".join(f"{k} json" for k in _STATS)
    nulls = ", ".join("NULL" for _ in _STATS)
    return (
        f"CASE WHEN json_typeof({col}) = 'object' THEN (SELECT CAST(json_build_array({values}) AS TEXT) "
        f"FROM json_to_record({col}) AS summary_stats({fields})) "
        f"ELSE CAST(json_build_array({nulls}) AS TEXT) END"
    )


@compiles(SummaryStats)
def _summary_stats_other(element: SummaryStats, compiler, **kw) -> str:
    raise CompileError(f"a summary is read on SQLite and PostgreSQL only, not {compiler.dialect.name}")


_NO_STATS = (None, None, None, None, 0, ())
_INF = math.inf


def stats_of(texts: list[str | None]) -> list[tuple]:
    """Each trial's (p10, p90, iqr, mad, n, flags) from the database's column (`SummaryStats`): the JSON
    lists decoded in one json.loads (a call a trial cost more than the decoding); a list of four floats, a
    count and flags that are strings (or none) taken as it is (the sum of four floats is finite only when
    each is), any other typed by Summary.from_stored; a summary the database could not read by `_unread`;
    none (NULL): no statistics."""
    lists = [t for t in texts if t and t[0] == "["]
    decoded = iter(json.loads(f"[{','.join(lists)}]"))
    out = []
    for text in texts:
        if not text:
            out.append(_NO_STATS)
        elif text[0] != "[":
            out.append(_unread(text))
        else:
            p10, p90, iqr, mad, n, flags = v = next(decoded)
            if (
                type(p10) is float and type(p90) is float and type(iqr) is float and type(mad) is float
                and type(n) is int and n >= 0 and -_INF < p10 + p90 + iqr + mad < _INF
                and (not flags or type(flags) is list and all(type(f) is str for f in flags))
            ):  # fmt: skip
                out.append((p10, p90, iqr, mad, n, tuple(flags) if flags else ()))
            else:
                out.append(_stats(Summary.from_stored(dict(zip(_STATS, v, strict=True)))))
    return out


def _unread(text: str) -> tuple:
    """(p10, p90, iqr, mad, n, flags) of a summary the database could not read (its JSON text)."""
    return _stats(Summary.from_stored(json.loads(text)))


def _stats(d: Summary) -> tuple[float | None, float | None, float | None, float | None, int, tuple[str, ...]]:
    return d.p10, d.p90, d.iqr, d.mad, d.n, d.flags
