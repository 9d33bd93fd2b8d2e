"""The column types' bind processors, applied to a batch a column at a time
(gateway.store.ledger_rows.LedgerInsert.params_many).

SQLAlchemy's processors are Python functions called once per value: the ledger's ten (a DATETIME, three
Booleans, six Floats) were about 40k instructions a row in the writer's flush, the DATETIME's ``%`` of a
dict of seven fields 13k of it. Here each column of a batch is converted in one pass, with the same text or
number the processor gives (checked on samples when the writer is made; a processor that differs keeps being
called as it is):

- a Boolean column of bools and None: ``True``/``False`` as the processor gives them (1/0 on SQLite), looked
  up, no call; anything else goes through the processor (which refuses what is no boolean);
- a Float column of floats and None: as it is (the processor returns the same float); else the processor;
- SQLite's DATETIME: the text of a UTC or naive datetime from the processor's text of its second, made once
  per second, and its microseconds; anything else through the processor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Boolean, DateTime, Float
from sqlalchemy.types import TypeEngine

Convert = Callable[[Sequence[Any]], Sequence[Any]]  # a column's values -> what the driver binds

_NONE = type(None)
_SECOND = timedelta(seconds=1)
_BOOLS = frozenset({bool, _NONE})
_FLOATS = frozenset({float, _NONE})
_DATETIMES = (
    datetime(2026, 12, 6, 7, 8, 9, 123456, tzinfo=UTC),
    datetime(2026, 12, 6, 7, 8, 9, 0),
    datetime(1, 2, 3),
    datetime(999, 1, 1, 0, 0, 1, 7),
    datetime(999, 1, 1, 0, 0, 1, 999999),
    datetime(9999, 12, 31, 23, 59, 59, 5, tzinfo=UTC),
)


def _each(process: Callable[[Any], Any]) -> Convert:
    """The processor on each value but None (as the writer always applied it)."""

    def convert(col: Sequence[Any]) -> Sequence[Any]:
        return [None if v is None else process(v) for v in col]

    return convert


def _booleans(process: Callable[[Any], Any]) -> Convert | None:
    try:
        table = {True: process(True), False: process(False), None: None}
    except Exception:
        return None
    each = _each(process)

    def convert(col: Sequence[Any]) -> Sequence[Any]:
        if _BOOLS.issuperset(map(type, col)):
            return list(map(table.__getitem__, col))
        return each(col)

    return convert


def _floats(process: Callable[[Any], Any]) -> Convert | None:
    try:
        if process(1.5) != 1.5 or type(process(1.5)) is not float:
            return None
    except Exception:
        return None
    each = _each(process)

    def convert(col: Sequence[Any]) -> Sequence[Any]:
        if _FLOATS.issuperset(map(type, col)):
            return col
        return each(col)

    return convert


def _datetimes(process: Callable[[Any], Any]) -> Convert | None:
    # the second of the latest value: [its start, the next second's start, its tzinfo, the processor's
    # text of it up to the "."] (compared, not rebuilt: a datetime's replace() costs 8k instructions)
    last: list[Any] = [None, None, _NONE, ""]

    def text(v: Any) -> Any:
        if v.__class__ is not datetime or (v.tzinfo is not UTC and v.tzinfo is not None):
            return process(v)
        if v.tzinfo is not last[2] or not last[0] <= v < last[1]:
            second = v.replace(microsecond=0)
            prefix = process(second)
            if len(prefix) != 26 or prefix[19] != "." or second.year == 9999:  # (9999: no next second)
                return process(v)
            last[:] = second, second + _SECOND, v.tzinfo, prefix[:20]
        return f"{last[3]}{v.microsecond:06d}"

    try:
        if any(text(d) != process(d) for d in _DATETIMES):
            return None
    except Exception:
        return None
    last[2] = _NONE  # the samples' second is not kept

    def convert(col: Sequence[Any]) -> Sequence[Any]:
        return [None if v is None else text(v) for v in col]

    return convert


def column_converter(type_: TypeEngine, process: Callable[[Any], Any], dialect_name: str) -> Convert:
    """How a column of ``type_`` with the bind processor ``process`` is converted a batch at a time."""
    fast: Convert | None = None
    if isinstance(type_, Boolean):
        fast = _booleans(process)
    elif isinstance(type_, Float):
        fast = _floats(process)
    elif isinstance(type_, DateTime) and dialect_name == "sqlite":
        fast = _datetimes(process)
    return fast if fast is not None else _each(process)
