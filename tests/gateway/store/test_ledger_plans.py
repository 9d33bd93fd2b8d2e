"""The ledger's reads at scale (issue 46): each hot read's PostgreSQL plan uses its index (and stops using
it when the index is dropped inside the test, so the check can fail); the daily usage the writer keeps
(gateway.store.ledger_daily) answers `farm gateway usage` exactly as summing the ledger's rows does, through
refused rows and a replayed spool, on SQLite and PostgreSQL; revision 0005 fills it from a store at 0004
with its rows intact; and the benchmark's synthetic rows (benchmarks/ledger_data.py) are the rows the
gateway writes.

The plans are read with ``enable_seqscan`` off: a test's table is a few thousand rows, where a sequential
scan is rightly the cheapest; what is checked is that an index serves the read (benchmarks/scale_ledger.py
shows the planner choosing them itself at millions of rows)."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime, timedelta

import pytest
from pg import DB_BACKENDS
from sqlalchemy import func, select, text

from benchmarks.ledger_data import Team, explain, ledger_access, ledger_usage_select, load
from gateway.store.db import create_engine, ledger, upgrade_schema
from gateway.store.ledger import LedgerWriter
from gateway.store.ledger_queries import (
    UsageQuery,
    request_rows_select,
    usage_select,
    usage_since_select,
    usage_table,
)

pytestmark = pytest.mark.asyncio
NOW = datetime.now(UTC)


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


@pytest.fixture
async def engine(db_url):
    e = create_engine(db_url)
    yield e
    await e.dispose()


@pytest.fixture
async def empty_engine(db_backend, tmp_path, request):
    if db_backend == "postgresql":
        url = await request.getfixturevalue("pg_server").create_database(template=None)
    else:
        url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    e = create_engine(url)
    yield e
    await e.dispose()


def _team(days: int = 20, per_day: int = 240) -> Team:
    return Team(days=days, now=NOW, rows_per_day=per_day, session_len=6, concurrent_sessions=4)


def _queries(team: Team) -> list[UsageQuery]:
    task, session = team.latest()
    mid_day = NOW - timedelta(days=3, hours=5)
    out = [UsageQuery(by=by) for by in ("task", "key", "model", "project", "session")]
    out += [
        UsageQuery(),
        UsageQuery(by="task", since=mid_day),
        UsageQuery(by="session", since=NOW - timedelta(days=1)),
        UsageQuery(by="key", since=team.midnight - timedelta(days=2)),  # whole days only
        UsageQuery(by="session", task=task),
        UsageQuery(by="task", session=session, since=mid_day),
        # every group ranked (the synthetic days repeat one another: a shorter list would cut among ties
        # that float sums in another order break either way)
        UsageQuery(by="session", top=10_000),
        UsageQuery(by="session", top=10_000, since=mid_day, task=task),
    ]
    return out


def _same(a: list, b: list) -> bool:
    """Two usage tables alike: the same groups in the same order, the same counts, costs to 1e-9."""
    if len(a) != len(b):
        return False
    for ra, rb in zip(a, b, strict=True):
        for va, vb in zip(ra, rb, strict=True):
            if isinstance(va, float) or isinstance(vb, float):
                if not math.isclose(va, vb, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif va != vb:
                return False
    return True


async def _baseline(engine, q: UsageQuery) -> list[list]:
    """``q``'s table summed from the ledger's rows, as `farm gateway usage` did before revision 0005."""
    async with engine.connect() as conn:
        rows = [list(r) for r in await conn.execute(ledger_usage_select(q))]
    first = 0 if q.top else 1
    for r in rows:
        if not q.top and isinstance(r[0], str):
            r[0] = datetime.fromisoformat(r[0]).date()
        for i in range(first + len(q.dimensions), len(r)):
            r[i] = int(r[i]) if r[i] is not None and not isinstance(r[i], float) else r[i]
    return rows


def _ranked(q: UsageQuery, rows: list[list]) -> list[list]:
    """The rows in one order whatever the database: a group without a session (None) sorts first (SQLite
    puts NULL first, PostgreSQL last); a top list by cost to 1e-9 (float noise), then the group."""
    if not q.top:
        n = 1 + len(q.dimensions)
        return sorted(rows, key=lambda r: [v if v is not None else "" for v in r[:n]])
    cost = 1 + 4  # the group, requests, input, output, total, then cost
    return sorted(rows, key=lambda r: (-round(r[cost] or 0.0, 9), r[0] or ""))


async def _check_against_ledger(engine, team: Team) -> None:
    for q in _queries(team):
        got, want = _ranked(q, await usage_table(engine, q)), _ranked(q, await _baseline(engine, q))
        assert want, q  # every query of the list shows something
        assert _same(got, want), (q, got[:3], want[:3])


# --- the daily usage: the ledger's sums ----------------------------------------------------------------
async def test_daily_usage_is_the_ledgers_sums_through_refused_rows_and_a_replay(engine, tmp_path, caplog):
    team = _team(days=4, per_day=300)
    writer = LedgerWriter(engine, batch_size=64, spool_dir=tmp_path / "spool")
    await writer.start()
    rows = list(team.rows_of(0, team.rows))
    for i, row in enumerate(rows[: team.rows // 2]):
        writer.submit(row)
        if i % 97 == 0:  # a row the database refuses (a dict for a string): dropped alone, sums unharmed
            writer.submit({**team.make_row(i), "request_id": f"bad-{i}", "task": {"not": "text"}})
        if i % 64 == 0:
            await writer.flush()
    await writer.flush()
    assert writer.dropped > 0
    # a process dies with rows in its spool: the next start replays them (the ones the database lacks)
    await writer.stop()
    dead = LedgerWriter(engine, interval_s=60, spool_dir=tmp_path / "spool")
    await dead.start()
    for row in rows[team.rows // 2 - 50 :]:  # 50 already written
        dead.submit(row)
    dead._stopping = True  # SIGKILL: no flush, no clean-up (as tests/gateway/store/test_spool.py's _crash)
    dead._task.cancel()
    dead._spool.close(delete=False)
    again = LedgerWriter(engine, spool_dir=tmp_path / "spool")
    await again.start()
    await again.stop()
    assert again.replayed == len(rows) - team.rows // 2
    async with engine.connect() as conn:
        assert (await conn.execute(select(func.count()).select_from(ledger))).scalar() == len(rows)
    await _check_against_ledger(engine, team)


async def test_writers_of_several_processes_add_to_the_same_groups_exactly(engine, db_url):
    """Four writers, each with its own engine (as four gateway processes), write rows of the same days and
    groups at once: every group's sums are the ledger's (no lost update, no deadlock)."""
    team = _team(days=2, per_day=400)
    rows = list(team.rows_of(0, team.rows))
    engines = [create_engine(db_url) for _ in range(4)]
    try:

        async def write(k: int) -> None:
            writer = LedgerWriter(engines[k], batch_size=25)
            for n, row in enumerate(rows[k::4]):
                writer.submit(row)
                if n % 25 == 24:
                    await writer.flush()
            await writer.flush()
            assert writer.dropped == 0 and writer.failed_flushes == 0

        await asyncio.gather(*(write(k) for k in range(4)))
    finally:
        for e in engines:
            await e.dispose()
    await _check_against_ledger(engine, team)


async def test_revision_0005_fills_the_daily_usage_and_keeps_every_row(empty_engine):
    await upgrade_schema(empty_engine, "0004")
    team = _team()
    assert await load(empty_engine, team, daily=False) == team.rows
    async with empty_engine.connect() as conn:
        before = [tuple(r) for r in await conn.execute(select(ledger).order_by(ledger.c.request_id))]
    await upgrade_schema(empty_engine)
    async with empty_engine.connect() as conn:
        after = [tuple(r) for r in await conn.execute(select(ledger).order_by(ledger.c.request_id))]
    assert after == before and len(after) == team.rows
    await _check_against_ledger(empty_engine, team)


# --- the synthetic ledger is the gateway's -------------------------------------------------------------
async def test_synthetic_rows_bulk_loaded_are_what_the_writer_and_the_gateway_write(
    engine, empty_engine, gateway, oai
):
    team = _team(days=3, per_day=200)
    writer = LedgerWriter(engine, batch_size=100)
    for row in team.rows_of(0, team.rows):
        writer.submit(row)
    await writer.flush()
    await upgrade_schema(empty_engine)
    assert await load(empty_engine, team) == team.rows  # two days bulk-loaded, one copied by SQL

    async def everything(e) -> tuple[list, list]:
        async with e.connect() as conn:
            rows = [
                dict(r._mapping) for r in await conn.execute(select(ledger).order_by(ledger.c.request_id))
            ]
            daily = (
                await conn.execute(text("SELECT * FROM gateway_usage_daily ORDER BY 1, 2, 3, 4, 5, 6"))
            ).all()
        return rows, [tuple(r) for r in daily]

    assert await everything(empty_engine) == await everything(engine)
    # and a real request's row has the same columns, each of the same type where both have a value
    await oai(gateway).chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": "hi"}], extra_headers={"session-id": "s1"}
    )
    (real,) = await gateway.rows()
    synthetic = (await everything(empty_engine))[0][-1]
    assert real.keys() == synthetic.keys() == set(ledger.c.keys())
    for col, value in real.items():
        if value is not None and synthetic[col] is not None:
            assert type(value) is type(synthetic[col]), col
    assert len(real["request_id"]) == len(synthetic["request_id"]) == 24
    int(real["request_id"], 16), int(synthetic["request_id"], 16)


# --- the plans (PostgreSQL) ----------------------------------------------------------------------------
def _hot_reads(team: Team) -> list[tuple[str, object, list[str]]]:
    """(what, statement, the indexes that must serve it)."""
    task, session = team.latest()
    ids = [team.request_id(i) for i in range(0, team.rows, 37)]
    return [
        ("today's usage and the budget rebuild", usage_since_select(team.midnight), ["ix_gateway_ledger_ts"]),
        ("the rows of request ids", request_rows_select("farm", ids), ["gateway_ledger_pkey"]),
        ("usage of one task by session", usage_select(UsageQuery(by="session", task=task)),
         ["ix_gateway_usage_daily_task_day"]),
        ("usage of one session", usage_select(UsageQuery(session=session)),
         ["ix_gateway_usage_daily_session_id_day"]),
        ("usage by key over a window", usage_select(UsageQuery(by="key", since=NOW - timedelta(days=2))),
         ["gateway_usage_daily_pkey", "ix_gateway_ledger_ts"]),
    ]  # fmt: skip


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_each_hot_read_uses_its_index_and_fails_without_it(engine):
    team = _team(days=40, per_day=150)
    await load(engine, team)
    async with engine.connect() as conn:
        await conn.execute(text("ANALYZE"))
        await conn.execute(text("SET enable_seqscan = off"))
        for what, stmt, indexes in _hot_reads(team):
            access = ledger_access(await explain(conn, stmt))
            assert "Seq Scan of ledger" not in access, (what, access)
            for index in indexes:
                assert index in access, (what, index, access)
                # the same read with that index gone (undone by the rollback): the check fails
                without = await conn.begin_nested()
                try:
                    if index.endswith("_pkey"):
                        table = index.removesuffix("_pkey")
                        await conn.execute(text(f"ALTER TABLE {table} DROP CONSTRAINT {index}"))
                    else:
                        await conn.execute(text(f"DROP INDEX {index}"))
                    assert index not in ledger_access(await explain(conn, stmt)), (what, index)
                finally:
                    await without.rollback()
            assert ledger_access(await explain(conn, stmt)) == access  # the rollback put them back
