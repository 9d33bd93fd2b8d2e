"""Read queries on the token ledger: what each project used since 00:00 UTC, in tokens and in US dollars
(to seed the daily budgets when a gateway starts, and the shared counters when Redis comes back empty); the
rows of given request ids within one project (``POST /v1/usage/requests``, the farm's token account); and
the usage table of ``farm gateway usage`` (per day and task, model, key, project or agent session, or the
top groups by cost).

Each is served by an index at a year of a team's ledger (tests/gateway/store/test_ledger_plans.py checks
the plans on PostgreSQL): today's usage and the rebuild by ``ts``; request ids by the primary key within
the project; one task's or one session's usage by ``(task, ts)`` / ``(session_id, ts)`` (revision 0005); a
window (``--since``) by ``ts``. A table of the whole ledger, with no window, reads the whole ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, case, func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import DayUsage
from gateway.errors import StoreUnavailable
from gateway.store.db import ledger

# what a row of ``request_rows`` carries (gateway.summaries.schema.RequestUsage names them for the client)
_REQUEST_COLUMNS = (
    "request_id", "ts", "project", "key_id", "endpoint", "task", "session_id", "public_model",
    "upstream_model", "provider", "status", "http_status", "input_tokens", "output_tokens",
    "tokens_estimated", "cost_usd", "retries", "rate_limited", "retry_wait_ms", "max_tokens", "batch_size",
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


# ``farm gateway usage --by``: the dimensions a usage table groups by
USAGE_DIMENSIONS = {
    "task": ledger.c.task,
    "project": ledger.c.project,
    "model": ledger.c.public_model,
    "key": ledger.c.key_id,
    "session": ledger.c.session_id,  # Claude Code's session id, or the ``session-id`` header
}
_DEFAULT_DIMENSIONS = ("task", "model", "key")
_MEASURES = ("requests", "input", "output", "total", "cost_usd", "retries", "429s", "retry_wait_s")
_STATUSES = ("ok", "error", "rejected", "cancelled")


@dataclass(frozen=True)
class UsageQuery:
    """What a usage table shows. ``by``: one dimension of USAGE_DIMENSIONS (None: task, model and key);
    ``since``: rows from then on (None: the whole ledger); ``task`` / ``session``: only that task's or
    that session's rows; ``top``: the ``top`` groups of ``by`` with the highest cost over the window (then
    tokens), without a date column, instead of one row per date and group."""

    by: str | None = None
    since: datetime | None = None
    task: str | None = None
    session: str | None = None
    top: int | None = None

    def __post_init__(self) -> None:
        if self.by is not None and self.by not in USAGE_DIMENSIONS:
            raise ValueError(
                f"cannot group usage by {self.by!r}: one of {', '.join(sorted(USAGE_DIMENSIONS))}"
            )
        if self.top is not None and (self.by is None or self.top < 1):
            raise ValueError("--top needs --by (the dimension to rank) and a count of at least 1")

    @property
    def dimensions(self) -> list[str]:
        return [self.by] if self.by else list(_DEFAULT_DIMENSIONS)

    @property
    def names(self) -> list[str]:
        """The table's column names, in order."""
        return [*([] if self.top else ["date"]), *self.dimensions, *_MEASURES, *_STATUSES]


def usage_select(q: UsageQuery) -> Select:
    """The statement of ``q``'s table (its columns are ``q.names``)."""
    date = func.date(ledger.c.ts).label("date")
    dims = [USAGE_DIMENSIONS[d].label(d) for d in q.dimensions]
    groups = dims if q.top else [date, *dims]
    cost = func.sum(ledger.c.cost_usd)
    total = func.sum(ledger.c.input_tokens + ledger.c.output_tokens)
    stmt = select(
        *groups,
        func.count().label("requests"),
        func.sum(ledger.c.input_tokens),
        func.sum(ledger.c.output_tokens),
        total,
        cost,
        func.sum(ledger.c.retries),
        func.sum(func.coalesce(ledger.c.rate_limited, 0)),  # NULL: a row from before revision 0004
        func.sum(func.coalesce(ledger.c.retry_wait_ms, 0.0)) / 1000.0,
        *(func.sum(case((ledger.c.status == s, 1), else_=0)) for s in _STATUSES),
    ).group_by(*groups)
    if q.since is not None:
        stmt = stmt.where(ledger.c.ts >= q.since)
    if q.task is not None:
        stmt = stmt.where(ledger.c.task == q.task)
    if q.session is not None:
        stmt = stmt.where(ledger.c.session_id == q.session)
    if q.top:
        return stmt.order_by(cost.desc().nulls_last(), total.desc(), *dims).limit(q.top)
    return stmt.order_by(date, *dims)


async def usage_table(engine: AsyncEngine, q: UsageQuery) -> list[list]:
    """The rows of ``q``'s table, as lists in the order of ``q.names``."""
    async with engine.connect() as conn:
        return [list(r) for r in await conn.execute(usage_select(q))]
