"""Read queries on the token ledger: what each project used since 00:00 UTC, in tokens and in US dollars
(to seed the daily budgets when a gateway starts, and the shared counters when Redis comes back empty); the
rows of given request ids within one project (``POST /v1/usage/requests``, the farm's token account); and
the usage table of ``farm gateway usage`` (per day and task, model, key, project or agent session, or the
top groups by cost).

Each is index-backed at a year of a team's ledger (tests/gateway/store/test_ledger_plans.py checks the
plans on PostgreSQL; benchmarks/scale_ledger.py times them): today's usage and the rebuild read the ledger
by ``ts``, request ids by its primary key; the usage table reads the daily usage (gateway_usage_daily,
gateway.store.ledger_daily: a row per day and group, not every request), one task's or one session's by
their indexes, a window by its key (day first), and the ledger by ``ts`` for a window that starts within
a day.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta
from datetime import date as date_type
from typing import Any

from sqlalchemy import BigInteger, RowMapping, Select, case, cast, func, select, union_all
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import DayUsage
from gateway.errors import StoreUnavailable
from gateway.store.db import ledger, usage_daily, within_deadline

# what a row of ``request_rows`` carries (gateway.summaries.schema.RequestUsage names them for the client)
_REQUEST_COLUMNS = (
    "request_id", "ts", "project", "key_id", "endpoint", "task", "session_id", "public_model",
    "upstream_model", "provider", "status", "http_status", "input_tokens", "output_tokens",
    "tokens_estimated", "cost_usd", "retries", "rate_limited", "retry_wait_ms", "max_tokens", "batch_size",
)  # fmt: skip


def usage_since_select(since: datetime) -> Select:
    """Per project (and flagged row), tokens and US dollars since ``since``: ``usage_today``'s statement."""
    flagged = case((ledger.c.shared_pending.is_(True), ledger.c.request_id), else_=None)
    return (
        select(
            ledger.c.project,
            flagged,
            func.sum(ledger.c.input_tokens + ledger.c.output_tokens),
            func.sum(ledger.c.cost_usd),
        )
        .where(ledger.c.ts >= since, ledger.c.project.is_not(None))
        .group_by(ledger.c.project, flagged)
    )


async def usage_today(engine: AsyncEngine) -> DayUsage:
    """Per project, the tokens and US dollars recorded since 00:00 UTC (rows without a cost count none),
    and the ids of today's ``shared_pending`` rows, in one statement, so all three come from one snapshot
    of the ledger: grouped by project and, for a flagged row only, its request id."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    async with engine.connect() as conn:
        rows = (await conn.execute(usage_since_select(midnight))).all()
    out = DayUsage({}, {}, [])
    for project, request_id, tokens, usd in rows:
        out.tokens[project] = out.tokens.get(project, 0) + int(tokens or 0)
        out.cost[project] = out.cost.get(project, 0.0) + float(usd or 0.0)
        if request_id is not None:
            out.shared_pending.append(request_id)
    return out


def request_rows_select(project: str, ids: Sequence[str]) -> Select:
    """``request_rows``' statement: the rows of ``ids`` within ``project``, oldest first."""
    return (
        select(*(ledger.c[name] for name in _REQUEST_COLUMNS))
        .where(ledger.c.project == project, ledger.c.request_id.in_(ids))
        .order_by(ledger.c.ts, ledger.c.request_id)
    )


async def _read_rows(engine: AsyncEngine, project: str, ids: list[str]) -> Sequence[RowMapping]:
    async with engine.connect() as conn:
        return (await conn.execute(request_rows_select(project, ids))).mappings().all()


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
    try:
        found = await within_deadline(timeout_s, lambda: _read_rows(engine, project, ids))
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


# ``farm gateway usage --by``: the dimensions a usage table groups by, and their ledger columns
USAGE_DIMENSIONS = {
    "task": "task",
    "project": "project",
    "model": "public_model",
    "key": "key_id",
    "session": "session_id",  # Claude Code's session id, or the ``session-id`` header
}
_DEFAULT_DIMENSIONS = ("task", "model", "key")
_MEASURES = ("requests", "input", "output", "total", "cost_usd", "retries", "429s", "retry_wait_s")
_STATUSES = ("ok", "error", "rejected", "cancelled")
_SUMMED = (
    "requests",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "retries",
    "rate_limited",
    "retry_wait_ms",
)


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


def _whole_days(q: UsageQuery) -> Select:
    """The daily usage's groups of ``q``'s whole days, in the columns ``usage_select`` sums."""
    d = usage_daily.c
    stmt = select(
        d.day.label("date"),
        *(d[USAGE_DIMENSIONS[n]].label(n) for n in q.dimensions),
        *(d[c].label(c) for c in _SUMMED),
        *(d[s].label(s) for s in _STATUSES),
    )
    if q.since is not None:
        stmt = stmt.where(d.day >= _first_whole_day(q.since))
    if q.task is not None:
        stmt = stmt.where(d.task == q.task)
    if q.session is not None:
        stmt = stmt.where(d.session_id == q.session)
    return stmt


def _part_day(q: UsageQuery, since: datetime) -> Select:
    """The ledger's rows from ``since`` to the end of its day (a window that starts within a day), summed
    per group as the daily usage is ('' for a dimension a row has none of), by the index on ``ts``."""
    end = datetime.combine(_first_whole_day(since), time.min, UTC)
    l = ledger.c  # noqa: E741
    dims = [func.coalesce(l[USAGE_DIMENSIONS[n]], "").label(n) for n in q.dimensions]
    date = func.date(l.ts).label("date")
    stmt = (
        select(
            date,
            *dims,
            func.count().label("requests"),
            func.sum(l.input_tokens).label("input_tokens"),
            func.sum(l.output_tokens).label("output_tokens"),
            func.sum(l.cost_usd).label("cost_usd"),
            func.sum(l.retries).label("retries"),
            func.sum(func.coalesce(l.rate_limited, 0)).label("rate_limited"),  # NULL: before revision 0004
            func.sum(func.coalesce(l.retry_wait_ms, 0.0)).label("retry_wait_ms"),
            *(func.sum(case((l.status == s, 1), else_=0)).label(s) for s in _STATUSES),
        )
        .where(l.ts >= since, l.ts < end)
        .group_by(date, *dims)
    )
    if q.task is not None:
        stmt = stmt.where(l.task == q.task)
    if q.session is not None:
        stmt = stmt.where(l.session_id == q.session)
    return stmt


def _first_whole_day(since: datetime) -> date_type:
    """The first UTC day wholly after ``since`` (its own day when it is a midnight)."""
    since = since.astimezone(UTC)
    day = since.date()
    return day if since.time() == time.min else day + timedelta(days=1)


def usage_select(q: UsageQuery) -> Select:
    """The statement of ``q``'s table (its columns are ``q.names``): the daily usage's whole days (none of
    the ledger's rows), and, for a window that starts within a day, that day's rows from the ledger."""
    parts = [_whole_days(q)]
    if q.since is not None and q.since.astimezone(UTC).time() != time.min:
        parts.append(_part_day(q, q.since))
    src = (parts[0] if len(parts) == 1 else union_all(*parts)).subquery("usage")
    dims = [src.c[n] for n in q.dimensions]
    groups = dims if q.top else [src.c.date, *dims]
    cost = func.sum(src.c.cost_usd)

    def count(c):  # a whole number as the driver gives back a BIGINT (PostgreSQL sums one as NUMERIC)
        return cast(func.sum(c), BigInteger)

    total = count(src.c.input_tokens) + count(src.c.output_tokens)
    stmt = select(
        *groups,
        count(src.c.requests),
        count(src.c.input_tokens),
        count(src.c.output_tokens),
        total,
        cost,
        count(src.c.retries),
        count(src.c.rate_limited),
        func.sum(src.c.retry_wait_ms) / 1000.0,
        *(count(src.c[s]) for s in _STATUSES),
    ).group_by(*groups)
    if q.top:
        return stmt.order_by(cost.desc().nulls_last(), total.desc(), *dims).limit(q.top)
    return stmt.order_by(*groups)


async def usage_table(engine: AsyncEngine, q: UsageQuery) -> list[list]:
    """The rows of ``q``'s table, as lists in the order of ``q.names`` (a dimension a request had none of
    is None; the date a ``datetime.date``)."""
    first = 0 if q.top else 1
    span = range(first, first + len(q.dimensions))
    async with engine.connect() as conn:
        out = [list(r) for r in await conn.execute(usage_select(q))]
    for row in out:
        if not q.top and row[0].__class__ is str:  # SQLite, the day from the ledger's rows: as text
            row[0] = date_type.fromisoformat(row[0])
        for i in span:
            if row[i] == "":
                row[i] = None
    return out
