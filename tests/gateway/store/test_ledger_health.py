"""A ledger writer that falls behind or keeps failing says so: /readyz turns 503 naming the problem, and
/metrics shows the pending rows and the failed flushes. A failure is logged once, not on every retry."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

import aiohttp
import pytest
from pg import DB_BACKENDS
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.store.db import create_engine, create_tables, ledger
from gateway.store.ledger import LedgerWriter

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway of this module runs on SQLite and on PostgreSQL (conftest.start_gateway)."""
    return request.param


def _row(rid: str) -> dict:
    return {"request_id": rid, "ts": datetime.now(UTC), "endpoint": "chat", "status": "ok", "latency_ms": 1.0}


async def _until(cond, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if await cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def test_a_ledger_that_cannot_write_makes_readyz_503_and_shows_in_metrics(gateway, caplog):
    caplog.set_level(logging.WARNING, "gateway.store.ledger")
    async with gateway.gw.engine.begin() as conn:
        await conn.run_sync(ledger.drop)  # every flush now fails: rows must stay pending
    headers = {"Authorization": f"Bearer {gateway.keys['alpha']}"}
    ready: dict = {}
    metrics: dict[str, float] = {}
    async with aiohttp.ClientSession() as s:
        for _ in range(2):
            async with s.post(
                f"{gateway.v1}/chat/completions",
                json={"model": "gpt-fake", "messages": MSGS},
                headers=headers,
            ) as r:
                assert r.status == 200  # the request path never waits on the ledger

        async def unready() -> bool:
            async with s.get(f"{gateway.url}/readyz") as r:
                ready.update(await r.json(), http=r.status)
            return r.status == 503

        await _until(unready)
        assert any(p.startswith("ledger flushes failing") for p in ready["problems"]), ready
        assert ready["ledger"]["pending_rows"] == 2
        async with s.get(f"{gateway.url}/metrics") as r:
            for fam in text_string_to_metric_families(await r.text()):
                metrics.update({smp.name: smp.value for smp in fam.samples})
        assert metrics["gateway_ledger_pending_rows"] == 2
        assert metrics["gateway_ledger_flush_failures_total"] >= 3
        assert metrics["gateway_ledger_oldest_pending_seconds"] > 0
        failures = gateway.gw.ledger.failed_flushes
        logged = [r for r in caplog.records if "ledger flush failed" in r.getMessage()]
        assert len(logged) == 1 and failures >= 3  # once, with its traceback, not once per retry

        async with gateway.gw.engine.begin() as conn:
            await conn.run_sync(ledger.create)  # the database is back

        async def ready_again() -> bool:
            async with s.get(f"{gateway.url}/readyz") as r:
                return r.status == 200

        await _until(ready_again)
    assert len(await gateway.rows()) == 2
    assert gateway.gw.ledger.pending_rows == 0 and gateway.gw.ledger.dropped == 0
    assert any("recovered" in r.getMessage() for r in caplog.records)


async def test_a_writer_that_falls_behind_names_it(tmp_path):
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'l.db'}")
    await create_tables(engine)
    writer = LedgerWriter(engine, interval_s=60, batch_size=100, max_pending_rows=3, max_lag_s=0.2)
    try:
        assert writer.problems() == ["ledger writer not running"]
        await writer.start()
        assert writer.problems() == []
        for i in range(4):
            writer.submit(_row(f"r{i}"))
        assert any("4 rows pending" in p for p in writer.problems()), writer.problems()
        await asyncio.sleep(0.3)
        assert any("oldest pending row" in p for p in writer.problems()), writer.problems()
        assert await writer.flush() == 4
        assert writer.problems() == [] and writer.oldest_pending_s() == 0.0
    finally:
        await writer.stop()
        await engine.dispose()


async def test_an_unreachable_database_keeps_every_row_pending_and_is_named(tmp_path, caplog):
    caplog.set_level(logging.ERROR, "gateway.store.ledger")
    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'missing' / 'l.db'}")  # cannot be opened
    writer = LedgerWriter(engine, interval_s=0.02, spool_dir=tmp_path / "spool")
    try:
        await writer.start()
        for i in range(3):
            writer.submit(_row(f"r{i}"))

        async def failing() -> bool:
            return writer.consecutive_failures >= 5

        await _until(failing)
        assert writer.pending_rows == 3 and writer.dropped == 0 and writer.running
        (problem,) = writer.problems()
        assert problem.startswith("ledger flushes failing") and "OperationalError" in problem
        assert len([r for r in caplog.records if "ledger flush failed" in r.getMessage()]) == 1
        assert len(list((tmp_path / "spool").glob("ledger-*.jsonl"))) == 1  # the rows are spooled
    finally:
        writer._stopping = True
        writer._task.cancel()
        writer._spool.close(delete=False)
        await engine.dispose()
