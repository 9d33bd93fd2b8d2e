"""Read queries on the token ledger: what each project used since 00:00 UTC, in tokens and in US dollars
(to seed the daily budgets when a gateway starts, and the shared counters when Redis comes back empty)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import case, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import DayUsage
from gateway.store.db import ledger


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
