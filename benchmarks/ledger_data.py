"""A team's synthetic gateway ledger (issue 46), for benchmarks/scale_ledger.py and the plan tests
(tests/gateway/store/test_ledger_plans.py): rows in the shape the gateway's request path writes
(gateway.core.record.Record.row), bulk-loaded through the writer's own parameter building
(gateway.store.ledger_rows: clean_row, LedgerInsert.params), so the stored values are the writer's.

The team: about 20 million requests a year (``ROWS_PER_YEAR``), spread evenly over the days, today's rows
between 00:00 UTC and now; four projects of eight tasks and three keys each; agent sessions of about 60
requests, 24 at a time, a quarter of the requests without a session (scripts, the farm's drafts); four
models at their list prices; 96.5% of the requests ok, the rest errors, refusals and cancellations. Row
``i`` is a function of ``i`` alone (``make_row``), so any row (its request id, its project) can be named
without reading the store: row ``j`` of every day is row ``j`` of yesterday moved by whole days, with the
day in its request id and session id.

``load`` writes today and yesterday through ``bulk_load`` (the writer's parameter building, then COPY on
PostgreSQL or the writer's INSERTs on SQLite) and every older day as a copy of yesterday made by the
database itself (INSERT ... SELECT), oldest first, then moves yesterday and today after them (the table in
time order, as a ledger's is), which gives those rows (tests/gateway/store/test_ledger_plans.py
checks both against ``make_row``, and against rows the gateway wrote for real requests).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Select, bindparam, case, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.store.db import ledger, usage_daily
from gateway.store.ledger_daily import DailyUpsert, daily_sums
from gateway.store.ledger_queries import USAGE_DIMENSIONS, UsageQuery
from gateway.store.ledger_rows import LedgerInsert, clean_row

ROWS_PER_YEAR = 20_000_000
DAYS_PER_YEAR = 365
_MASK = (1 << 64) - 1
# (public model, upstream model, provider, endpoint, input and output US dollars per million tokens)
MODELS = (
    ("claude-sonnet", "claude-sonnet-4-5", "anthropic", "messages", 3.0, 15.0),
    ("claude-haiku", "claude-haiku-4-5", "anthropic", "messages", 1.0, 5.0),
    ("gpt-5", "gpt-5", "openai", "responses", 1.25, 10.0),
    ("gpt-5-mini", "gpt-5-mini", "openai", "chat", 0.25, 2.0),
)
PROJECTS = ("agents", "farm", "research", "platform")


def _mix(x: int) -> int:
    """splitmix64: a well-spread 64-bit number from ``x`` (the row's randomness, by its index)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


@dataclass(frozen=True)
class Team:
    """The synthetic team's ledger: ``days`` days ending today (``now``), ``rows_per_day`` each."""

    days: int
    now: datetime
    rows_per_day: int = ROWS_PER_YEAR // DAYS_PER_YEAR
    tasks_per_project: int = 8
    keys_per_project: int = 3
    session_len: int = 60
    concurrent_sessions: int = 24
    prefix: str = "5ca1ed1e"  # request ids: 24 hex characters as Record's: this, the day, the row of the day

    @staticmethod
    def of_year(fraction: float, now: datetime | None = None, **kw: Any) -> Team:
        """``fraction`` of a year of the team's ledger (at least one day)."""
        return Team(days=max(1, round(DAYS_PER_YEAR * fraction)), now=now or datetime.now(UTC), **kw)

    @property
    def rows(self) -> int:
        return self.days * self.rows_per_day

    @property
    def midnight(self) -> datetime:
        return self.now.replace(hour=0, minute=0, second=0, microsecond=0)

    def request_id(self, i: int) -> str:
        day, j = divmod(i, self.rows_per_day)
        return f"{self.prefix}{day:04x}{j:012x}"

    def ts(self, i: int) -> datetime:
        """Row ``i``'s time: day ``i // rows_per_day`` (the last one is today, up to now), evenly spread."""
        day, j = divmod(i, self.rows_per_day)
        start = self.midnight - timedelta(days=self.days - 1 - day)
        span = (self.now - start) if day == self.days - 1 else timedelta(days=1)
        return start + span * ((j + 0.5) / self.rows_per_day)

    def session_of(self, i: int) -> int:
        """The number of row ``i``'s session within its day."""
        k, j = self.concurrent_sessions, i % self.rows_per_day
        return (j // (self.session_len * k)) * k + j % k

    def owner(self, i: int) -> tuple[str, str, str, str | None, int]:
        """Row ``i``'s (project, task, key id, session id, model index): those of its session."""
        s = self.session_of(i)
        h = _mix(s)
        day = i // self.rows_per_day
        p = h % len(PROJECTS)
        project = PROJECTS[p]
        task = f"{project}-task-{(h >> 8) % self.tasks_per_project}"
        key_id = f"{p:02x}{(h >> 16) % self.keys_per_project:02x}{'0' * 8}"
        session = None if (h >> 24) % 4 == 0 else f"{day:04x}{s:04x}-5e55-4000-8000-{h & 0xFFFFFFFFFFFF:012x}"
        return project, task, key_id, session, (h >> 32) % len(MODELS)

    def latest(self) -> tuple[str, str]:
        """A task and an agent session of today's last rows (the newest row that has a session)."""
        i = self.rows - 1
        while self.owner(i)[3] is None:
            i -= 1
        return self.owner(i)[1], self.owner(i)[3] or ""

    def make_row(self, i: int) -> dict:
        """Row ``i``, as gateway.core.record.Record.row makes one (every ledger column)."""
        project, task, key_id, session, m = self.owner(i)
        public, upstream, provider, endpoint, in_price, out_price = MODELS[m]
        r = _mix(i % self.rows_per_day ^ 0x5EED)
        u = (r & 0xFFFF) / 65536
        input_tokens = 500 + (r >> 16) % 60_000
        output_tokens = 20 + (r >> 32) % 4_000
        cached = input_tokens // 2 if (r >> 48) % 3 else 0
        status, http, error = "ok", 200, None
        if u >= 0.965:
            status, http, error = (
                ("error", 502, "upstream_error")
                if u < 0.985
                else ("rejected", 429, "rate_limited")
                if u < 0.995
                else ("cancelled", 499, "client_closed")
            )
        upstream_called = status != "rejected"
        if not upstream_called or status == "error":
            input_tokens = output_tokens = cached = 0
        latency = 300.0 + (r >> 40) % 20_000
        cost = (input_tokens * in_price + output_tokens * out_price) / 1e6 if upstream_called else None
        return {
            "request_id": self.request_id(i),
            "ts": self.ts(i),
            "endpoint": endpoint,
            "upstream_request_id": f"req_{r:016x}" if upstream_called else None,
            "project": project,
            "key_id": key_id,
            "public_model": public,
            "upstream_model": upstream if upstream_called else None,
            "provider": provider if upstream_called else None,
            "task": task,
            "session_id": session,
            "stream": bool(r & 1),
            "status": status,
            "http_status": http,
            "error_class": error,
            "retries": 1 if (r >> 20) % 50 == 0 else 0,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "tokens_estimated": False,
            "cached_input_tokens": cached,
            "cache_write_tokens": 0,
            "latency_ms": latency,
            "upstream_ms": latency - 2.0 if upstream_called else None,
            "ttft_ms": 250.0 + (r >> 24) % 2000 if upstream_called and r & 1 else None,
            "queue_wait_ms": 0.0,
            "batch_size": None,
            "deployment": f"{public}-0" if upstream_called else None,
            "fallback_from": None,
            "translation": None,
            "cost_usd": cost,
            "shared_pending": None,
            "dropped_fields": None,
            "rate_limited": 1 if status == "rejected" else 0,
            "retry_wait_ms": 0.0,
            "max_tokens": 8192 if endpoint == "messages" else None,
        }

    def rows_of(self, start: int, stop: int) -> Iterator[dict]:
        return (self.make_row(i) for i in range(start, stop))


async def bulk_load(
    engine: AsyncEngine, rows: Iterator[dict], *, batch: int = 20_000, daily: bool = True
) -> int:
    """Write ``rows`` as the ledger writer would store them (clean_row, then LedgerInsert.params: the
    same values), in large batches: PostgreSQL (asyncpg) by COPY, SQLite by the writer's INSERTs in one
    transaction per batch; ``daily``: their sums added to the daily usage as the writer adds them (False:
    a schema from before revision 0005). Returns the number of rows."""
    ins, upsert = LedgerInsert(engine), DailyUpsert(engine.dialect)
    names = [name for name, _ in ins.defaults]
    n = 0
    while True:
        clean = [clean_row(r, owned=True) for r in itertools.islice(rows, batch)]
        if not clean:
            return n
        chunk = [ins.params(r) for r in clean]
        async with engine.begin() as conn:
            if engine.dialect.name == "postgresql":
                raw = (await conn.get_raw_connection()).driver_connection
                await raw.copy_records_to_table("gateway_ledger", records=chunk, columns=names)
            else:
                for sql, params in ins.statements(chunk):
                    await conn.exec_driver_sql(sql, params)
            if daily:
                await upsert.add(conn, daily_sums(clean))
        n += len(chunk)


def _shifted_ts(dialect: str, back: int) -> str:
    """SQL for a row's ``ts`` moved ``back`` whole days earlier (SQLite: its text, microseconds kept)."""
    if dialect == "postgresql":
        return f"ts - make_interval(days => {back})"
    return f"strftime('%Y-%m-%d %H:%M:%S', ts, '-{back} days') || substr(ts, 20)"


def _shifted_day(dialect: str, back: int) -> str:
    if dialect == "postgresql":
        return f"day - {back}"
    return f"date(day, '-{back} days')"


async def load(engine: AsyncEngine, team: Team, *, daily: bool = True) -> int:
    """The team's ledger into an empty ledger table: today and yesterday by ``bulk_load``, every older
    day copied from yesterday by the database (with its daily usage, when ``daily``). Returns the number
    of rows."""
    rpd = team.rows_per_day
    n = await bulk_load(engine, team.rows_of(max(0, team.days - 2) * rpd, team.rows), daily=daily)
    template = team.days - 2
    names = [c.name for c in ledger.columns]
    daily_names = [c.name for c in usage_daily.columns]
    dialect = engine.dialect.name
    for day in range(team.days - 2):  # oldest first, as a ledger grows
        back = template - day
        exprs = {
            "request_id": ":rid || substr(request_id, 13)",
            "session_id": "CASE WHEN session_id IS NULL THEN NULL ELSE :sid || substr(session_id, 5) END",
            "ts": _shifted_ts(dialect, back),
        }
        rows = text(
            f"INSERT INTO gateway_ledger ({', '.join(names)}) "
            f"SELECT {', '.join(exprs.get(c, c) for c in names)} FROM gateway_ledger "
            "WHERE request_id >= :lo AND request_id < :hi"
        )
        params = {"rid": f"{team.prefix}{day:04x}", "sid": f"{day:04x}"}
        params |= {"lo": team.request_id(template * rpd), "hi": team.request_id((template + 1) * rpd)}
        async with engine.begin() as conn:
            n += (await conn.execute(rows, params)).rowcount
            if daily:
                dexprs = {
                    "day": _shifted_day(dialect, back),
                    "session_id": "CASE WHEN session_id = '' THEN '' ELSE :sid || substr(session_id, 5) END",
                }
                sums = text(
                    f"INSERT INTO gateway_usage_daily ({', '.join(daily_names)}) "
                    f"SELECT {', '.join(dexprs.get(c, c) for c in daily_names)} FROM gateway_usage_daily "
                    "WHERE day = :template"
                ).bindparams(bindparam("template", type_=usage_daily.c.day.type))
                await conn.execute(sums, {"sid": params["sid"], "template": team.ts(template * rpd).date()})
    if team.days > 2:
        await _move_to_the_end(engine, team.request_id(template * rpd), f"{team.prefix}{team.days:04x}")
    return n


async def _move_to_the_end(engine: AsyncEngine, lo: str, hi: str) -> None:
    """Rewrite the rows of ids ``lo`` .. ``hi`` (yesterday's and today's, loaded first as the template)
    after the older days, so the table is in time order as a ledger written day after day is (PostgreSQL's
    planner weighs that order when it reads a range of ``ts``); PostgreSQL then vacuums and analyzes."""
    async with engine.begin() as conn:
        where = "WHERE request_id >= :lo AND request_id < :hi"
        await conn.execute(
            text(f"CREATE TEMPORARY TABLE ledger_recent AS SELECT * FROM gateway_ledger {where}"),
            {"lo": lo, "hi": hi},
        )
        await conn.execute(text(f"DELETE FROM gateway_ledger {where}"), {"lo": lo, "hi": hi})
        await conn.execute(text("INSERT INTO gateway_ledger SELECT * FROM ledger_recent"))
        await conn.execute(text("DROP TABLE ledger_recent"))
    if engine.dialect.name == "postgresql":
        async with engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(text("VACUUM ANALYZE gateway_ledger"))


def ledger_usage_select(q: UsageQuery) -> Select:
    """`farm gateway usage`'s statement before revision 0005 (every ledger row of the window summed), the
    baseline the daily usage is measured against."""
    date = func.date(ledger.c.ts).label("date")
    dims = [ledger.c[USAGE_DIMENSIONS[d]].label(d) for d in q.dimensions]
    groups = dims if q.top else [date, *dims]
    cost = func.sum(ledger.c.cost_usd)
    total = func.sum(ledger.c.input_tokens + ledger.c.output_tokens)
    stmt = select(
        *groups,
        func.count(),
        func.sum(ledger.c.input_tokens),
        func.sum(ledger.c.output_tokens),
        total,
        cost,
        func.sum(ledger.c.retries),
        func.sum(func.coalesce(ledger.c.rate_limited, 0)),
        func.sum(func.coalesce(ledger.c.retry_wait_ms, 0.0)) / 1000.0,
        *(
            func.sum(case((ledger.c.status == s, 1), else_=0))
            for s in ("ok", "error", "rejected", "cancelled")
        ),
    ).group_by(*groups)
    if q.since is not None:
        stmt = stmt.where(ledger.c.ts >= q.since)
    if q.task is not None:
        stmt = stmt.where(ledger.c.task == q.task)
    if q.session is not None:
        stmt = stmt.where(ledger.c.session_id == q.session)
    if q.top:
        return stmt.order_by(cost.desc().nulls_last(), total.desc(), *dims).limit(q.top)
    return stmt.order_by(*groups)


# --- plans (PostgreSQL) ------------------------------------------------------------------------------------
async def explain(conn, stmt: Select) -> dict:
    """PostgreSQL's plan of ``stmt`` (EXPLAIN, FORMAT JSON), its top node."""
    compiled = stmt.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = tuple(compiled.params[k] for k in compiled.positiontup or ())
    found = (await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {compiled.string}", params)).scalar_one()
    if isinstance(found, str):
        found = json.loads(found)
    return found[0]["Plan"]


def plan_nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from plan_nodes(child)


_INDEX_SCANS = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
_TABLES = {"gateway_ledger": "ledger", "gateway_usage_daily": "daily"}


def ledger_access(plan: dict) -> list[str]:
    """How a plan reads the ledger and the daily usage: one entry per scan, the index's name, or "Seq Scan
    of" the table ("ledger", "daily")."""
    out = []
    for node in plan_nodes(plan):
        kind = node["Node Type"]
        if kind == "Seq Scan" and node.get("Relation Name") in _TABLES:
            out.append(f"Seq Scan of {_TABLES[node['Relation Name']]}")
        elif kind in _INDEX_SCANS and any(t in node.get("Index Name", "") for t in _TABLES):
            out.append(node["Index Name"])
    return out


def described(access: Sequence[str]) -> str:
    return ", ".join(access) if access else "-"
