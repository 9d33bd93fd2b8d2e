"""Read queries on the token ledger: what each project used since 00:00 UTC, in tokens and in US dollars
(to seed the daily budgets when a gateway starts, and the shared counters when Redis comes back empty); and
the rows of given request ids within one project (``POST /v1/usage/requests``, the farm's token account)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import case, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import DayUsage
from gateway.errors import StoreUnavailable
from gateway.store.db import ledger

# what a row of ``request_rows`` carries (gateway.summaries.schema.RequestUsage names them for the client)
_REQUEST_COLUMNS = (
    "request_id", "ts", "project", "key_id", "endpoint", "task", "public_model", "upstream_model",
    "provider", "status", "http_status", "input_tokens", "output_tokens", "tokens_estimated", "cost_usd",
    "retries", "rate_limited", "retry_wait_ms", "max_tokens", "batch_size",
)  # fmt: skip


async def usage_today(engine: AsyncEngine) -> DayUsage:
    """Per project, the tokens and US dollars recorded since 00:00 UTC (rows without a cost count none),
    and the ids of today's ``shared_pending`` rows, in one statement, so all three come from one snapshot
    of the ledger: grouped by project and, for a flagged row only, its request id."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    flagged = case((ledger.c.shared_pending.is_(True), ledger.c.request_id), else_=None)
    q = (
        select(
            ledger.c.project,
            flagged,
            func.sum(ledger.c.input_tokens + ledger.c.output_tokens),
            func.sum(ledger.c.cost_usd),
        )
        .where(ledger.c.ts >= midnight, ledger.c.project.is_not(None))
        .group_by(ledger.c.project, flagged)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    out = DayUsage({}, {}, [])
    for project, request_id, tokens, usd in rows:
        out.tokens[project] = out.tokens.get(project, 0) + int(tokens or 0)
        out.cost[project] = out.cost.get(project, 0.0) + float(usd or 0.0)
        if request_id is not None:
            out.shared_pending.append(request_id)
    return out


async def request_rows(
    engine: AsyncEngine, project: str, request_ids: Sequence[str], *, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """The ledger rows of ``request_ids`` that belong to ``project`` (no other project's row is ever read),
    oldest first, as plain dicts: ``ts`` in UTC, ``date`` its day (YYYY-MM-DD), ``model`` the public model,
    the counts of rows from before revision 0004 as 0. The database failing or silent for ``timeout_s`` is
    StoreUnavailable."""
    ids = sorted(set(request_ids))
    if not ids:
        return []
    cols = [ledger.c[name] for name in _REQUEST_COLUMNS]
    q = (
        select(*cols)
        .where(ledger.c.project == project, ledger.c.request_id.in_(ids))
        .order_by(ledger.c.ts, ledger.c.request_id)
    )
    try:
        async with asyncio.timeout(timeout_s), engine.connect() as conn:
            found = (await conn.execute(q)).mappings().all()
    except (SQLAlchemyError, OSError, TimeoutError) as e:
        why = f"the ledger could not be read ({e.__class__.__name__}); try again"
        raise StoreUnavailable(why, error_class="ledger_unavailable") from None
    out = []
    for r in found:
        row = dict(r)
        ts = row["ts"] if row["ts"].tzinfo is not None else row["ts"].replace(tzinfo=UTC)  # SQLite: naive UTC
        ts = ts.astimezone(UTC)
        row.update(ts=ts.isoformat(), date=ts.date().isoformat(), model=row.pop("public_model"))
        for name in ("retries", "rate_limited", "input_tokens", "output_tokens"):
            row[name] = row[name] or 0
        row["retry_wait_ms"] = row["retry_wait_ms"] or 0.0
        row["tokens_estimated"] = bool(row["tokens_estimated"])
        out.append(row)
    return out
