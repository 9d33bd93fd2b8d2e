"""The ledger summed per UTC day and group (``gateway_usage_daily``, revision 0005), kept by its writer:
each batch of rows it writes adds its sums to the day's groups in the same transaction (``DailyUpsert``), so
the sums are the ledger's whatever fails (a refused batch, split to find its bad rows, adds only what is
written; a replayed spool adds only the rows the database lacked).

A group is a project, task, key, public model and agent session, '' where the row has none. `farm gateway
usage` reads these (gateway.store.ledger_queries.usage_select): a year of a team's ledger is some hundreds
of thousands of groups where it is twenty million requests (benchmarks/scale_ledger.py). Each batch's
groups are written in key order, so writers of several processes take the rows' locks in one order.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import case
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.store.db import usage_daily

GROUP = ("project", "task", "key_id", "public_model", "session_id")  # the ledger's columns; '' for None
KEY = ("day", *GROUP)
# the ledger columns summed as they are (NULL as 0); cost_usd is summed apart: None while no row has one
SUMS = ("input_tokens", "output_tokens", "retries", "rate_limited", "retry_wait_ms")
STATUSES = ("ok", "error", "rejected", "cancelled")
_NUMBERS = (int, float, bool)


def utc_day(ts: datetime) -> date:
    """The UTC day of a ledger time (SQLite gives back naive UTC)."""
    return (ts.astimezone(UTC) if ts.tzinfo is not None else ts).date()


def _text(v: Any) -> str:
    """A group's value: '' for None, a value SQLite stored in a text column as its text."""
    if v.__class__ is str:
        return v
    return "" if v is None else str(v)


_ROW_KEY = operator.itemgetter("ts", *GROUP)
_STATUS_AT = {s: 7 + i for i, s in enumerate(STATUSES)}  # where a status is counted in an accumulator


def daily_sums(rows: Iterable[dict]) -> list[dict]:
    """The sums of ``rows`` (clean ledger rows) per day and group, in key order. A count or cost that is
    no number (SQLite would store one) raises TypeError: the writer drops that row as one it cannot bind.
    (About 2 us a row: the writer runs it on every batch.)"""
    # per (ts's day, group as in the row): [requests, *SUMS, cost, *STATUSES]
    acc: dict[tuple, list] = {}
    for r in rows:
        ts, *group = _ROW_KEY(r)
        key = (ts.date() if ts.tzinfo is UTC or ts.tzinfo is None else utc_day(ts), *group)
        try:
            a = acc.get(key)
        except TypeError:  # a group's value no column takes (a dict, a list): named, as the insert does
            name, value = next((n, v) for n, v in zip(GROUP, group, strict=True) if v.__hash__ is None)
            raise TypeError(f"column {name}: cannot store a {type(value).__name__}") from None
        if a is None:
            a = acc[key] = [0, 0, 0, 0, 0, 0.0, None, 0, 0, 0, 0]
        a[0] += 1
        a[1] += r["input_tokens"] or 0
        a[2] += r["output_tokens"] or 0
        a[3] += r["retries"] or 0
        a[4] += r["rate_limited"] or 0
        a[5] += r["retry_wait_ms"] or 0
        cost = r["cost_usd"]
        if cost is not None:
            a[6] = (a[6] or 0.0) + cost
        at = _STATUS_AT.get(r["status"])
        if at is not None:
            a[at] += 1
    groups: dict[tuple, list] = {}  # the same groups with None as '' (None and '' are one group)
    for (day, *group), a in acc.items():
        key = (day, *map(_text, group))
        seen = groups.get(key)
        if seen is None:
            groups[key] = a
            continue
        for k in range(len(a)):
            if k == 6:
                seen[6] = a[6] if seen[6] is None else seen[6] if a[6] is None else seen[6] + a[6]
            else:
                seen[k] += a[k]
    names = ("requests", *SUMS, "cost_usd", *STATUSES)
    out = []
    for key in sorted(groups):
        a = groups[key]
        for k in (1, 2, 3, 4, 5, 6):  # a number that is no number (a text SQLite took) is refused here
            if a[k] is not None and a[k].__class__ not in _NUMBERS:
                raise TypeError(f"{names[k]} must be a number, not {type(a[k]).__name__}")
        out.append({**dict(zip(KEY, key, strict=True)), **dict(zip(names, a, strict=True))})
    return out


def _upsert(dialect_name: str):
    insert = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
    stmt = insert(usage_daily)
    new, old = stmt.excluded, usage_daily.c
    added = {c: old[c] + new[c] for c in ("requests", *SUMS, *STATUSES)}
    added["cost_usd"] = case(  # NULL while no row had a price
        (new.cost_usd.is_(None), old.cost_usd),
        (old.cost_usd.is_(None), new.cost_usd),
        else_=old.cost_usd + new.cost_usd,
    )
    return stmt.on_conflict_do_update(index_elements=list(KEY), set_=added)


class DailyUpsert:
    """The upsert compiled once, when the writer is made (as gateway.store.ledger_rows.LedgerInsert is):
    on a dialect with positional parameters (SQLite, asyncpg) each batch's sums go to the driver's
    executemany as tuples, with the column types' bind processors applied here; elsewhere through the Core
    statement."""

    def __init__(self, dialect: Dialect) -> None:
        self.statement = _upsert(dialect.name)
        self.sql: str | None = None
        if dialect.positional:
            compiled = self.statement.compile(
                dialect=dialect, column_keys=[c.name for c in usage_daily.columns]
            )
            self.sql = compiled.string
            self.order = list(compiled.positiontup or ())
            processors = [
                usage_daily.c[name].type.dialect_impl(dialect).bind_processor(dialect) for name in self.order
            ]
            self.processors = [(i, p) for i, p in enumerate(processors) if p is not None]

    async def add(self, conn: AsyncConnection, sums: list[dict]) -> None:
        """Add ``sums`` (``daily_sums`` of the rows written) to their days' groups, within the caller's
        transaction."""
        if not sums:
            return
        if self.sql is None:
            await conn.execute(self.statement, sums)
            return
        params = []
        for group in sums:
            values = [group[name] for name in self.order]
            for i, process in self.processors:
                if values[i] is not None:
                    values[i] = process(values[i])
            params.append(tuple(values))
        await conn.exec_driver_sql(self.sql, params)
