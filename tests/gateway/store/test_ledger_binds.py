"""The ledger's INSERT parameters made a batch's column at a time (gateway.store.ledger_binds) are those the
column types' own bind processors give row by row: the same values of the same types, the same refusals; and
the string columns' all-at-once check cleans what the column-by-column loop cleans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy.dialects import postgresql, sqlite

from gateway.core.record import Record
from gateway.store.ledger_binds import column_converter
from gateway.store.ledger_rows import LedgerInsert, clean_row


class _Engine:
    def __init__(self, dialect) -> None:
        self.dialect = dialect


def _insert(name: str) -> LedgerInsert:
    dialect = sqlite.dialect(paramstyle="qmark") if name == "sqlite" else postgresql.asyncpg.dialect()
    return LedgerInsert(_Engine(dialect))  # type: ignore[arg-type]


def _rows(n: int) -> list[dict]:
    start = datetime(2026, 12, 6, 23, 59, 58, 1, tzinfo=UTC)
    rows = []
    for i in range(n):
        rec = Record("chat")
        rec.ts = start + timedelta(microseconds=i * 77_777)  # across seconds and a day
        if i % 9 == 0:
            rec.ts = rec.ts.replace(tzinfo=None)
        if i % 13 == 0:
            rec.ts = rec.ts.astimezone(timezone(timedelta(hours=5)))  # another offset: its wall clock
        if i % 7 == 0:
            rec.ts = rec.ts.replace(microsecond=0)
        if i == 5:
            rec.ts = datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)
        row = clean_row(rec.row(0.25, None if i % 2 else 0.125), owned=True)
        if i % 5 == 0:
            row["stream"] = 1  # an int where a bool goes: the processor takes it
        if i % 6 == 0:
            row["latency_ms"] = 3  # an int where a float goes
        if i % 4 == 0:
            row["cost_usd"] = 0.001
        rows.append(row)
    return rows


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        len(x) == len(y) and all(type(u) is type(v) and u == v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_a_batch_a_column_at_a_time_is_each_row_through_the_processors(dialect: str) -> None:
    ins = _insert(dialect)
    rows = _rows(300)
    assert _same(ins.params_many(rows), [ins.params(r) for r in rows])
    assert ins.params_many([]) == []


def test_the_sqlite_datetime_text_is_the_processors_on_every_second() -> None:
    ins = _insert("sqlite")
    (convert,) = [c for i, c in ins.converters if ins.defaults[i][0] == "ts"]
    (process,) = [p for i, p in ins.processors if ins.defaults[i][0] == "ts"]
    assert convert.__qualname__.startswith("_datetimes")  # the fast one: its samples matched
    values = [datetime(2026, 1, 1, tzinfo=UTC) + timedelta(microseconds=k * 333_333) for k in range(40)]
    values += [None, datetime(1, 1, 1), datetime(2026, 3, 4, 5, 6, 7, 8)]
    assert list(convert(values)) == [None if v is None else process(v) for v in values]
    assert process(values[1]) == "2026-01-01 00:00:00.333333"  # the default storage format, as stored


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_a_value_no_column_takes_is_refused_as_row_by_row(dialect: str) -> None:
    ins = _insert(dialect)
    rows = _rows(20)
    bad = dict(rows[3], task={"a": 1})
    with pytest.raises(ValueError, match="column task: cannot store a dict"):
        ins.params_many([*rows, bad])
    if dialect == "sqlite":  # SQLAlchemy's Boolean processor refuses what is no boolean, in a batch too
        with pytest.raises(TypeError, match="Not a boolean value"):
            ins.params_many([*rows, dict(rows[3], stream="yes")])


def test_a_processor_that_does_not_match_is_kept() -> None:
    """A processor the fast paths do not reproduce (another storage format) is called as it is."""
    from sqlalchemy import Boolean, DateTime

    def odd_datetime(v):
        return v.strftime("%d/%m/%Y %H:%M:%S")

    convert = column_converter(DateTime(), odd_datetime, "sqlite")
    v = datetime(2026, 12, 6, 7, 8, 9, 10)
    assert list(convert([v, None])) == ["06/12/2026 07:08:09", None]
    convert = column_converter(Boolean(), lambda b: "T" if b else "F", "sqlite")
    assert list(convert([True, False, None])) == ["T", "F", None]


@pytest.mark.parametrize(
    "field, value, cleaned",
    [
        ("task", "café\udce9", "café\ufffd"),  # a byte that was not UTF-8
        ("task", "a\x00b", "a\ufffdb"),
        ("status", "x" * 40, "x" * 16),  # cut to the column
        ("session_id", "s" * 129, "s" * 128),
        ("task", 7, 7),  # no str: left for the writer to refuse
        ("task", "", ""),
    ],
)
def test_the_strings_checked_at_once_clean_as_column_by_column(field: str, value, cleaned) -> None:
    row = Record("chat").row(0.1, None)
    row[field] = value
    out = clean_row(row, owned=True)
    assert out[field] == cleaned
    assert all(
        out[k] == v for k, v in Record("chat").row(0.1, None).items() if k not in (field, "request_id", "ts")
    )
