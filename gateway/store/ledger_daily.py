"""The ledger summed per UTC day and group (``gateway_usage_daily``, revision 0005), kept by its writer:
each batch of rows it writes adds its sums to the day's groups in the same transaction (``add_daily``), so
the sums are the ledger's whatever fails (a refused batch, split to find its bad rows, adds only what is
written; a replayed spool adds only the rows the database lacked).

A group is a project, task, key, public model and agent session, '' where the row has none. `farm gateway
usage` reads these (gateway.store.ledger_queries.usage_select): a year of a team's ledger is some hundreds
of thousands of groups where it is twenty million requests (benchmarks/scale_ledger.py). Each batch's
groups are written in key order, so writers of several processes take the rows' locks in one order.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import case
from sqlalchemy.dialects import postgresql, sqlite
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


def daily_sums(rows: Iterable[dict]) -> list[dict]:
    """The sums of ``rows`` (clean ledger rows) per day and group, in key order. A count or cost that is
    no number (SQLite would store one) raises TypeError: the writer drops that row as one it cannot bind."""
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        key = (utc_day(r["ts"]), *(_text(r[c]) for c in GROUP))
        g = groups.get(key)
        if g is None:
            g = groups[key] = dict(zip(KEY, key, strict=True))
            g.update(dict.fromkeys(("requests", *SUMS, *STATUSES), 0), cost_usd=None)
        g["requests"] += 1
        for c in SUMS:
            v = r[c]
            if v:
                if v.__class__ not in _NUMBERS:
                    raise TypeError(f"{c} must be a number, not {type(v).__name__}")
                g[c] += v
        cost = r["cost_usd"]
        if cost is not None:
            if cost.__class__ not in _NUMBERS:
                raise TypeError(f"cost_usd must be a number, not {type(cost).__name__}")
            g["cost_usd"] = (g["cost_usd"] or 0.0) + cost
        if r["status"] in STATUSES:
            g[r["status"]] += 1
    return [groups[k] for k in sorted(groups)]


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


_UPSERTS: dict[str, Any] = {}


async def add_daily(conn: AsyncConnection, sums: list[dict]) -> None:
    """Add ``sums`` (``daily_sums`` of the rows written) to their days' groups, within the caller's
    transaction."""
    if not sums:
        return
    name = conn.dialect.name
    stmt = _UPSERTS.get(name)
    if stmt is None:
        stmt = _UPSERTS[name] = _upsert(name)
    await conn.execute(stmt, sums)
