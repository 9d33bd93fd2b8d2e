"""Read queries on the token ledger: what each project used since 00:00 UTC, in tokens and in US dollars
(to seed the daily budgets when a gateway starts)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.db import ledger


async def tokens_used_today(engine: AsyncEngine) -> dict[str, int]:
    """Per project, tokens recorded since 00:00 UTC (to seed the daily budgets at start)."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    q = (
        select(ledger.c.project, func.sum(ledger.c.input_tokens + ledger.c.output_tokens))
        .where(ledger.c.ts >= midnight, ledger.c.project.is_not(None))
        .group_by(ledger.c.project)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return {p: int(n or 0) for p, n in rows}


async def cost_used_today(engine: AsyncEngine) -> dict[str, float]:
    """Per project, US dollars recorded since 00:00 UTC (to seed the daily cost budgets at start). Rows
    without a cost (a model without a price, rows from before costs) count nothing."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    q = (
        select(ledger.c.project, func.sum(ledger.c.cost_usd))
        .where(ledger.c.ts >= midnight, ledger.c.project.is_not(None), ledger.c.cost_usd.is_not(None))
        .group_by(ledger.c.project)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return {p: float(c or 0.0) for p, c in rows}
