"""The gateway ledger at a year of a team's data (issue 46): a synthetic ledger (benchmarks/ledger_data.py,
about 20 million rows a year) loaded at fractions of a year into PostgreSQL and SQLite, and every ledger
read a person or a gateway waits on timed BEFORE revision 0005 (the schema at 0004: `farm gateway usage`
summed the ledger's rows) and AFTER it (the daily usage, gateway.store.ledger_daily; the project index
dropped): `farm gateway usage` by task, key and session (the whole ledger, a window, one task, one session,
the top sessions), the rows of 100 request ids (``POST /v1/usage/requests``' read), today's usage per
project (what a start seeds the budgets with), and the budget rebuild when Redis comes back empty
(gateway.limits.redis.SharedLimits.ensure_seeded against a real redis-server). The ledger writer's
throughput (gateway.store.ledger.LedgerWriter, batches of 500 as the request path fills them) is measured on
the loaded table before and after too, and the time the migration took (filling the daily usage);
``--writes-ab`` measures the writer alone on two stores in turns, and their size on disk.

Each read: one run, then the median of ``--repeat`` more when the first took under 3 s; the usage reads
time the query as `farm gateway usage` runs it (gateway.store.ledger_queries.usage_table), without the
interpreter's start. PostgreSQL plans (EXPLAIN) name the index each read uses. The servers are the tests'
own (tests/pgserver.py: fsync off, shared_buffers 32 MB, the rest from the OS page cache;
tests/gateway/redis_server.py).

    .venv/bin/python -m benchmarks.scale_ledger            # 1/64 of a year (short)
    .venv/bin/python -m benchmarks.scale_ledger --full     # 1/64, 1/16, 1/4 and a whole year
    .venv/bin/python -m benchmarks.scale_ledger --sizes 1/16,1/4 --backends postgresql

``ledger_part(size_fraction, args)`` is the same for one size, for benchmarks/scale_bench.py's table.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy import Select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from benchmarks.ledger_data import (
    PROJECTS,
    Team,
    described,
    explain,
    ledger_access,
    ledger_usage_select,
    load,
)
from gateway.store.db import create_engine, upgrade_schema
from gateway.store.ledger import LedgerWriter
from gateway.store.ledger_queries import (
    UsageQuery,
    request_rows,
    request_rows_select,
    usage_select,
    usage_since_select,
    usage_table,
    usage_today,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BEFORE, AFTER = "0004", "0005"  # the schema without and with the daily usage
TARGET_S = 1.0
SHORT, FULL = ("1/64",), ("1/64", "1/16", "1/4", "1")


def _options(args: Any) -> argparse.Namespace:
    if isinstance(args, argparse.Namespace):
        return args
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.scale_ledger", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--full", action="store_true", help="the whole curve: 1/64, 1/16, 1/4 and 1 year")
    ap.add_argument("--sizes", default=None, help="fractions of a year, comma-separated (1/64,1/4)")
    ap.add_argument("--backends", default="postgresql,sqlite")
    ap.add_argument("--sqlite-max", default="1/4", help="the largest fraction loaded into SQLite")
    ap.add_argument("--write-rows", type=int, default=10_000, help="rows the writer writes, per phase")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--writes-ab", type=int, default=0, metavar="ROUNDS",
        help="only the writer: two stores of the first size (0004 and 0005) written in turns, ROUNDS each",
    )  # fmt: skip
    known, _ = ap.parse_known_args(list(args or []))  # the scale benchmark's own options are not ours
    return known


# --- the servers: one PostgreSQL and one Redis per process, as the tests start them ----------------------
@dataclass
class _Servers:
    pg: Any
    redis: Any
    workdir: Path


_SERVERS: _Servers | None = None


def _servers() -> _Servers:
    global _SERVERS
    if _SERVERS is None:
        sys.path.insert(0, str(REPO / "tests"))  # pgserver, as pytest finds it
        from pgserver import start_server as start_pg

        from tests.gateway.redis_server import start_server as start_redis

        workdir = Path(tempfile.mkdtemp(prefix="kf-scale-ledger-"))
        pg = start_pg()
        atexit.register(pg.stop)
        redis = start_redis(workdir)
        atexit.register(redis.stop)
        _SERVERS = _Servers(pg, redis, workdir)
    return _SERVERS


# --- the reads ---------------------------------------------------------------------------------------------
@dataclass
class _Ctx:
    engine: AsyncEngine
    team: Team
    redis_url: str


@dataclass(frozen=True)
class Read:
    """One read: ``run(ctx, after)`` and its statement ``statement(ctx, after)`` (``after``: at revision
    0005; before it, `farm gateway usage` summed the ledger's rows: ledger_data.ledger_usage_select)."""

    name: str
    run: Callable[[_Ctx, bool], Awaitable[Any]]
    statement: Callable[[_Ctx, bool], Select]


def _usage(name: str, **kw: Any) -> Read:
    def query(ctx: _Ctx) -> UsageQuery:
        since = kw.get("since")
        return UsageQuery(**{**kw, "since": ctx.team.now - since if since else None})

    def statement(ctx: _Ctx, after: bool) -> Select:
        return usage_select(query(ctx)) if after else ledger_usage_select(query(ctx))

    async def run(ctx: _Ctx, after: bool) -> Any:
        if after:
            return await usage_table(ctx.engine, query(ctx))
        async with ctx.engine.connect() as conn:
            return (await conn.execute(statement(ctx, after))).all()

    return Read(name, run, statement)


def _ids(team: Team, n: int = 100) -> tuple[str, list[str]]:
    """One project's ``n`` request ids spread over the ledger (a token account's draft runs)."""
    project = PROJECTS[1]
    step = max(1, team.rows // (n * 8))
    ids = [team.request_id(i) for i in range(0, team.rows, step) if team.owner(i)[0] == project]
    stride = max(1, len(ids) // n)
    return project, ids[::stride][:n]


def _request_rows(ctx: _Ctx, _after: bool):
    project, ids = _ids(ctx.team)
    return request_rows(ctx.engine, project, ids)


async def _rebuild(ctx: _Ctx, _after: bool) -> float:
    """SharedLimits.ensure_seeded with Redis emptied (FLUSHDB): the day's counters rebuilt from the ledger."""
    from redis.asyncio import Redis

    from gateway.config import GatewaySettings
    from gateway.limits.redis import SharedLimits
    from gateway.limits.redis_scripts import utc_day
    from gateway.redis.state import SharedState

    project = {"models": ["m"], "daily_token_budget": 10**13, "daily_cost_budget_usd": 10**7}
    settings = GatewaySettings(
        providers={"oa": {"kind": "openai", "base_url": "http://127.0.0.1:9"}},
        models={"m": {"provider": "oa", "upstream_model": "m"}},
        projects=dict.fromkeys(PROJECTS, project),
        redis_url=ctx.redis_url,
        redis_key_prefix=f"scale{uuid.uuid4().hex[:8]}",
    )
    r = Redis.from_url(ctx.redis_url)
    await r.flushdb()
    shared = SharedState(settings)
    limits = SharedLimits(shared, settings.projects, seed_source=lambda: usage_today(ctx.engine))
    await shared.start()  # seeds the day on connecting
    try:
        assert shared.up, shared.status()
        await r.flushdb()  # Redis back empty: the next call rebuilds
        t0 = time.perf_counter()
        rebuilt = await limits.ensure_seeded(utc_day())
        elapsed = time.perf_counter() - t0
        assert rebuilt, "the budgets were not rebuilt"
        return elapsed
    finally:
        await shared.stop()
        await r.aclose()


def _today(ctx: _Ctx, _after: bool) -> Select:
    return usage_since_select(ctx.team.midnight)


def _reads(team: Team) -> list[Read]:
    task, session = team.latest()  # a task and a session of today
    return [
        _usage("usage --by task", by="task"),
        _usage("usage --by key", by="key"),
        _usage("usage --by session", by="session"),
        _usage("usage --by task --since 7d", by="task", since=timedelta(days=7)),
        _usage("usage --by key --since 7d", by="key", since=timedelta(days=7)),
        _usage("usage --by session --since 1d", by="session", since=timedelta(days=1)),
        _usage("usage --task T --by session", by="session", task=task),
        _usage("usage --session S", session=session),
        _usage("usage --top 10 --by session --since 7d", by="session", top=10, since=timedelta(days=7)),
        Read(
            "POST /v1/usage/requests (100 ids)",
            _request_rows,
            lambda ctx, _after: request_rows_select(*_ids(ctx.team)),
        ),
        Read("today's usage (start seed)", lambda ctx, _after: usage_today(ctx.engine), _today),
        Read("budget rebuild, Redis back empty", _rebuild, _today),
    ]


async def _time(read: Read, ctx: _Ctx, after: bool, repeat: int) -> float:
    async def once() -> float:
        t0 = time.perf_counter()
        inner = await read.run(ctx, after)
        elapsed = time.perf_counter() - t0
        return inner if isinstance(inner, float) else elapsed  # the rebuild times itself

    first = await once()
    if first >= 3.0 or repeat < 1:
        return first
    return statistics.median([await once() for _ in range(repeat)])


async def _plan(read: Read, ctx: _Ctx, after: bool) -> str:
    async with ctx.engine.connect() as conn:
        if ctx.engine.dialect.name == "postgresql":
            return described(ledger_access(await explain(conn, read.statement(ctx, after))))
        compiled = read.statement(ctx, after).compile(
            dialect=conn.dialect, compile_kwargs={"render_postcompile": True}
        )
        params = tuple(compiled.params[k] for k in compiled.positiontup or ())
        found = await conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled.string}", params)
        steps = [row[-1] for row in found if "gateway_" in row[-1]]
        return "; ".join(s.replace("gateway_", "") for s in steps)


@contextlib.contextmanager
def _writer_before_0005():
    """The ledger writer as it was before revision 0005: no daily usage."""
    import gateway.store.ledger as writer_module
    from gateway.store.ledger_daily import DailyUpsert

    saved = DailyUpsert.add, writer_module.daily_sums

    async def nothing(_self, _conn, _sums) -> None:
        return None

    DailyUpsert.add, writer_module.daily_sums = nothing, lambda _rows: []
    try:
        yield
    finally:
        DailyUpsert.add, writer_module.daily_sums = saved


async def _write_rate(engine: AsyncEngine, team: Team, n: int, after: bool) -> float:
    """Rows a second of the ledger writer (batches of 500, as the request path fills them) writing ``n``
    of today's rows into the loaded table, the median of 3 runs; the rows are deleted after each."""
    rates = []
    for _ in range(3):
        extra = Team(days=1, now=team.now, prefix="77a17e00", rows_per_day=max(n, 1))
        writer = LedgerWriter(engine, batch_size=500)
        with contextlib.nullcontext() if after else _writer_before_0005():
            t0 = time.perf_counter()
            for start in range(0, n, 500):
                for row in extra.rows_of(start, min(n, start + 500)):
                    writer.submit(row, owned=True)
                await writer.flush()
            rates.append(n / (time.perf_counter() - t0))
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM gateway_ledger WHERE request_id LIKE '77a17e00%'"))
    return statistics.median(rates)


# --- one size ----------------------------------------------------------------------------------------------
async def _database(backend: str, servers: _Servers) -> tuple[str, Callable[[], None]]:
    if backend == "postgresql":
        import psycopg

        name = servers.pg.create_database("scale")

        def drop() -> None:
            with psycopg.connect(servers.pg.admin_dsn, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')

        return servers.pg.url(name, driver="asyncpg"), drop
    path = servers.workdir / f"ledger-{uuid.uuid4().hex[:8]}.db"

    def remove() -> None:
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                Path(f"{path}{suffix}").unlink()

    return f"sqlite+aiosqlite:///{path}", remove


async def _analyze(engine: AsyncEngine) -> None:
    if engine.dialect.name == "postgresql":  # autovacuum's ANALYZE, done now (the tests' server has none)
        async with engine.connect() as conn:
            await conn.execute(text("ANALYZE gateway_ledger"))


async def _measure_size(fraction: str, backend: str, opts: argparse.Namespace) -> list[dict]:
    servers = _servers()
    team = Team.of_year(float(Fraction(fraction)))
    url, cleanup = await _database(backend, servers)
    engine = create_engine(url)
    ctx = _Ctx(engine, team, servers.redis.url)
    base = {"size": fraction, "rows": team.rows, "backend": backend}
    out: list[dict] = []
    try:
        await upgrade_schema(engine, BEFORE)
        t0 = time.perf_counter()
        loaded = await load(engine, team, daily=False)
        load_s = time.perf_counter() - t0
        assert loaded == team.rows, (loaded, team.rows)
        await _analyze(engine)
        reads = _reads(team)
        before = {r.name: await _time(r, ctx, False, opts.repeat) for r in reads}
        plans_before = {r.name: await _plan(r, ctx, False) for r in reads}
        write_before = await _write_rate(engine, team, opts.write_rows, False)
        t0 = time.perf_counter()
        await upgrade_schema(engine, AFTER)
        build_s = time.perf_counter() - t0
        await _analyze(engine)
        after = {r.name: await _time(r, ctx, True, opts.repeat) for r in reads}
        plans_after = {r.name: await _plan(r, ctx, True) for r in reads}
        write_after = await _write_rate(engine, team, opts.write_rows, True)
    finally:
        await engine.dispose()
        cleanup()
    out.append({**base, "what": "bulk load (rows/s)", "before": round(team.rows / load_s), "after": None})
    out.append({**base, "what": "migration 0005 (s)", "before": None, "after": round(build_s, 2)})
    out.append(
        {**base, "what": "ledger writer (rows/s)", "before": round(write_before), "after": round(write_after)}
    )
    for r in reads:
        out.append(
            {**base, "what": r.name, "before": round(before[r.name], 4), "after": round(after[r.name], 4),
             "plan_before": plans_before[r.name], "plan_after": plans_after[r.name]}
        )  # fmt: skip
    return out


async def _writes_ab(fraction: str, backend: str, opts: argparse.Namespace) -> dict:
    """The writer's rows a second on a store at 0004 (its writer) and one at 0005 (with the daily usage),
    both loaded alike, measured in turns so that the machine's load falls on both alike."""
    servers = _servers()
    team = Team.of_year(float(Fraction(fraction)))
    stores = []
    try:
        for after in (False, True):
            url, cleanup = await _database(backend, servers)
            engine = create_engine(url)
            stores.append((engine, cleanup))
            await upgrade_schema(engine, AFTER if after else BEFORE)
            await load(engine, team, daily=after)
            await _analyze(engine)
        sizes = await _store_mb(stores[1][0])
        print(
            f"store at {AFTER}, {team.rows:,} rows: " + ", ".join(f"{k} {v:.0f} MB" for k, v in sizes.items())
        )
        rates: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(opts.writes_ab):
            for after in (False, True):
                rates[after].append(await _write_rate(stores[after][0], team, opts.write_rows, after))
    finally:
        for engine, cleanup in stores:
            await engine.dispose()
            cleanup()
    before, after_ = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"writer on {backend}, {fraction} of a year, {opts.writes_ab} rounds in turns: "
          f"{before:.0f} rows/s at {BEFORE}, {after_:.0f} at {AFTER} ({after_ / before:.2f}x)")  # fmt: skip
    return {
        "size": fraction,
        "backend": backend,
        "before": before,
        "after": after_,
        "rates": rates,
        "mb": sizes,
    }


async def _store_mb(engine: AsyncEngine) -> dict[str, float]:
    """The ledger's and the daily usage's size on disk, indexes included (SQLite: the whole file)."""
    async with engine.connect() as conn:
        if engine.dialect.name != "postgresql":
            pages = (await conn.execute(text("PRAGMA page_count"))).scalar_one()
            size = (await conn.execute(text("PRAGMA page_size"))).scalar_one()
            return {"database file": pages * size / 2**20}
        out = {}
        for table in ("gateway_ledger", "gateway_usage_daily"):
            found = await conn.execute(text(f"SELECT pg_total_relation_size('{table}')"))
            out[table] = found.scalar_one() / 2**20
        return out


def _sizes(opts: argparse.Namespace) -> list[str]:
    if opts.sizes:
        return [s.strip() for s in opts.sizes.split(",") if s.strip()]
    return list(FULL if opts.full else SHORT)


def _backends(fraction: str, opts: argparse.Namespace) -> list[str]:
    wanted = [b.strip() for b in opts.backends.split(",") if b.strip()]
    unknown = set(wanted) - {"postgresql", "sqlite"}
    if unknown:
        raise SystemExit(f"--backends: unknown {sorted(unknown)}; postgresql, sqlite")
    return [b for b in wanted if b != "sqlite" or Fraction(fraction) <= Fraction(opts.sqlite_max)]


def ledger_part(size_fraction: float | str, args: Any = None) -> list[dict]:
    """The ledger's rows at one size (a fraction of a year: 1/64, or "1/64"), on each backend: one row per
    measure, with ``before`` and ``after`` (the figures without and with revision 0005's indexes)."""
    opts = _options(args)
    fraction = str(Fraction(size_fraction).limit_denominator(4096))
    rows: list[dict] = []
    for backend in _backends(fraction, opts):
        print(f"ledger {fraction} of a year on {backend} ...", flush=True)
        rows += asyncio.run(_measure_size(fraction, backend, opts))
    return rows


# --- the table ---------------------------------------------------------------------------------------------
def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.0f}"
    return str(v)


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table; a PostgreSQL read over TARGET_S after the indexes is marked."""
    head = "| size | rows | backend | measure | before | after | plan after |\n"
    head += "|---|---:|---|---|---:|---:|---|\n"
    lines = []
    for r in rows:
        late = r["backend"] == "postgresql" and "(" not in r["what"] and (r["after"] or 0) > TARGET_S
        mark = " **over 1 s**" if late else ""
        lines.append(
            f"| {r['size']} | {r['rows']:,} | {r['backend']} | {r['what']} | {_cell(r['before'])} | "
            f"{_cell(r['after'])}{mark} | {r.get('plan_after', '')} |"
        )
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    opts = _options(argv if argv is not None else sys.argv[1:])
    if opts.writes_ab:
        fraction = _sizes(opts)[0]
        return {"writes_ab": [asyncio.run(_writes_ab(fraction, b, opts)) for b in _backends(fraction, opts)]}
    rows: list[dict] = []
    for fraction in _sizes(opts):
        part = ledger_part(fraction, opts)
        rows += part
        print(table(part), flush=True)
    text_ = table(rows)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M")
    path = RESULTS / f"scale-ledger-{platform.node()}-{stamp}.md"
    RESULTS.mkdir(exist_ok=True)
    path.write_text(
        f"# The gateway ledger at scale ({datetime.now(UTC):%Y-%m-%d}, {platform.node()})\n\n"
        f"`python -m benchmarks.scale_ledger {' '.join(argv or [])}`; seconds unless named; before: schema "
        f"{BEFORE}, after: {AFTER} (the daily usage, the project index dropped).\n\n{text_}"
    )
    print(f"(table written to {path})")
    return {"rows": rows, "note": str(path)}


if __name__ == "__main__":
    main()
