"""The write-ahead spool: every row is on disk before its response ends; a killed gateway's rows are
replayed by the next start exactly once; a live gateway's segments are never touched by another."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import pytest
import yaml
from pg import DB_BACKENDS, SQLITE_ONLY
from sqlalchemy import select, text

from gateway.store.db import create_engine, ledger
from gateway.store.ledger import LedgerWriter
from gateway.store.ledger_rows import DATETIMES
from gateway.store.spool import default_spool_dir, read_rows
from testkit.gateway.fake_upstream import Fault
from tests.gateway.serving import free_port

MSGS = [{"role": "user", "content": "hi"}]


def _row(rid: str, **extra) -> dict:
    ts = datetime(2026, 11, 29, 21, 30, 1, 123456, tzinfo=UTC)
    return {"request_id": rid, "ts": ts, "endpoint": "chat", "status": "ok", "latency_ms": 1.0, **extra}


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """The writer's database, and the gateways', are SQLite and PostgreSQL (conftest: db_url)."""
    return request.param


@pytest.fixture
async def db(db_url):
    engine = create_engine(db_url)
    yield engine
    await engine.dispose()


async def _ids(engine) -> list[str]:
    async with engine.connect() as conn:
        return sorted((await conn.execute(select(ledger.c.request_id))).scalars())


async def _sql(engine, statement: str) -> None:
    """Change the database behind the writer's back (as another process would)."""
    async with engine.begin() as conn:
        await conn.execute(text(statement))


NO_TABLE = "no such table|does not exist"  # SQLite's words, PostgreSQL's


def _segments(spool: Path) -> list[Path]:
    return sorted(spool.glob("ledger-*.jsonl"))


def _spooled(spool: Path) -> list[dict]:
    return [row for p in _segments(spool) for row in read_rows(p, DATETIMES)]


def _crash(writer: LedgerWriter) -> None:
    """What SIGKILL does to a writer: no flush, no clean-up; the kernel closes its files (and locks)."""
    writer._stopping = True
    if writer._task is not None:
        writer._task.cancel()
    writer._spool.close(delete=False)


async def _started(db, spool) -> LedgerWriter:
    """A started writer spooling to `spool` that flushes only when stopped (or asked)."""
    writer = LedgerWriter(db, interval_s=60, spool_dir=spool)
    await writer.start()  # a replay of what the folder holds happens here, before start returns
    return writer


async def test_every_row_is_spooled_when_submit_returns(db, tmp_path):
    spool = tmp_path / "spool"
    writer = await _started(db, spool)
    try:
        writer.submit(_row("a", task="t", input_tokens=3, stream=True))
        writer.submit(_row("b"))
        got = _spooled(spool)
        assert [r["request_id"] for r in got] == ["a", "b"]
        assert got[0]["ts"] == _row("a")["ts"]  # a datetime again, with its zone
        assert (got[0]["task"], got[0]["input_tokens"], got[0]["stream"]) == ("t", 3, True)
    finally:
        await writer.stop()
    assert await _ids(db) == ["a", "b"] and _segments(spool) == []


async def test_a_flush_deletes_the_segments_it_wrote_and_a_failed_one_keeps_them(db, tmp_path):
    spool = tmp_path / "spool"
    writer = await _started(db, spool)
    try:
        writer.submit(_row("a"))
        writer.submit(_row("b"))
        (first,) = _segments(spool)
        assert await writer.flush() == 2
        assert _segments(spool) == []
        writer.submit(_row("c"))
        (second,) = _segments(spool)
        assert second != first
        await _sql(db, "ALTER TABLE gateway_ledger RENAME TO away")  # the next flush fails
        with pytest.raises(Exception, match=NO_TABLE):
            await writer.flush()
        writer.submit(_row("d"))  # goes to a new segment; the failed one is kept
        assert len(_segments(spool)) == 2 and writer.pending_rows == 2
        await _sql(db, "ALTER TABLE away RENAME TO gateway_ledger")
        assert await writer.flush() == 2
        assert _segments(spool) == []
    finally:
        await writer.stop()
    assert await _ids(db) == ["a", "b", "c", "d"]


async def test_a_crashed_writer_s_rows_are_replayed_exactly_once(db, tmp_path):
    spool = tmp_path / "spool"
    a = await _started(db, spool)
    for i in range(5):
        a.submit(_row(f"r{i}"))
    assert await a.flush() == 5
    for i in range(5, 12):
        a.submit(_row(f"r{i}"))
    _crash(a)
    assert await _ids(db) == [f"r{i}" for i in range(5)]

    b = await _started(db, spool)  # the replay happens here, before start returns
    try:
        assert b.replayed == 7 and b.dropped == 0
        assert await _ids(db) == sorted(f"r{i}" for i in range(12))
        assert _segments(spool) == []
    finally:
        await b.stop()


async def test_replaying_rows_that_are_partly_in_the_database_adds_no_duplicate(db, tmp_path, caplog):
    spool = tmp_path / "spool"
    a = await _started(db, spool)
    for i in range(10):
        a.submit(_row(f"r{i}"))
    a._spool.discard = lambda mark: None  # die after the flush wrote, before the segment was deleted
    assert await a.flush() == 10
    a.submit(_row("r10"))
    _crash(a)
    await _sql(db, "DELETE FROM gateway_ledger WHERE request_id IN ('r2', 'r7')")  # partly there
    assert len(_spooled(spool)) == 11

    b = await _started(db, spool)
    try:
        assert (b.replayed, b.dropped, b.failed_flushes) == (3, 0, 0)
        assert await _ids(db) == sorted(f"r{i}" for i in range(11))
        assert _segments(spool) == [] and "ERROR" not in caplog.text
    finally:
        await b.stop()


async def test_a_segment_held_by_a_live_writer_is_never_replayed(db, tmp_path):
    spool = tmp_path / "spool"
    a = await _started(db, spool)
    a.submit(_row("live-1"))
    a.submit(_row("live-2"))
    b = await _started(db, spool)  # another gateway process sharing the folder
    try:
        assert b.replayed == 0 and await _ids(db) == [] and len(_segments(spool)) == 1
        b.submit(_row("other"))
        assert len(_segments(spool)) == 2
    finally:
        await a.stop()
        await b.stop()
    assert await _ids(db) == ["live-1", "live-2", "other"] and _segments(spool) == []


async def test_a_failed_final_flush_leaves_the_spool_for_the_next_start(db, tmp_path):
    spool = tmp_path / "spool"
    a = await _started(db, spool)
    a.submit(_row("x"))
    a.submit(_row("y"))
    await _sql(db, "ALTER TABLE gateway_ledger RENAME TO away")
    with pytest.raises(Exception, match=NO_TABLE):
        await a.stop()
    assert len(_segments(spool)) == 1
    await _sql(db, "ALTER TABLE away RENAME TO gateway_ledger")
    b = await _started(db, spool)
    await b.stop()
    assert b.replayed == 2 and await _ids(db) == ["x", "y"] and _segments(spool) == []


def test_the_default_spool_sits_next_to_the_sqlite_file():
    assert default_spool_dir("sqlite+aiosqlite:///.farm/gateway.db") == Path(".farm/gateway-spool")
    assert default_spool_dir("sqlite+aiosqlite:////tmp/x/gw0.db") == Path("/tmp/x/gw0-spool")
    assert default_spool_dir("postgresql+asyncpg://u@h/db") == Path(".farm/gateway-spool")


# --- a real gateway process, killed and terminated -----------------------------------------------------
async def _serve(config: Path, port: int, cwd: Path) -> asyncio.subprocess.Process:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for k in [k for k in env if k.startswith("FARM_GATEWAY_")]:
        del env[k]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.ops.cli", "serve", "--config", str(config), "--port", str(port),
        env=env, cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    async with aiohttp.ClientSession() as s:
        for _ in range(300):
            if proc.returncode is not None:
                raise AssertionError((await proc.stdout.read()).decode())
            try:
                async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                    if r.status == 200:
                        return proc
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.05)
    proc.kill()
    raise AssertionError("gateway did not come up: " + (await proc.communicate())[0].decode())


@SQLITE_ONLY  # reads the database file with sqlite3 while the gateway process is dead
async def test_sigkill_loses_no_row_and_sigterm_drains_and_flushes(start_gateway, fake, tmp_path):
    setup = await start_gateway()  # creates the database and a key for project alpha
    key = setup.keys["alpha"]
    secret = setup.gw.settings.secret.get_secret_value()
    await setup.stop()
    spool = tmp_path / "spool-dir"
    config = tmp_path / "gw.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "database_url": f"sqlite+aiosqlite:///{setup.db_path}",
                "secret": secret,
                "providers": {"oa": {"kind": "openai", "base_url": fake.base_url}},
                "models": {"gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"}},
                "projects": {"alpha": {"models": ["gpt-fake"]}},
                "ledger_flush_interval_s": 3600,  # nothing is flushed before the kill
                "ledger_batch_size": 100_000,
                "ledger_spool_dir": str(spool),
                "uvloop": False,
            }
        )
    )
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "gpt-fake", "messages": MSGS}
    port = free_port()
    proc = await _serve(config, port, tmp_path)
    ids = []
    try:
        async with aiohttp.ClientSession() as s:
            for i in range(20):
                async with s.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json={**body, "stream": i % 2 == 1},
                    headers=headers,
                ) as r:  # fmt: skip
                    assert r.status == 200
                    await r.read()
                    ids.append(r.headers["x-request-id"])
    finally:
        proc.kill()  # SIGKILL: no flush, no clean-up
        await proc.wait()
    con = sqlite3.connect(setup.db_path)
    rows = lambda: sorted(r for (r,) in con.execute("SELECT request_id FROM gateway_ledger"))  # noqa: E731
    assert rows() == [] and len(_spooled(spool)) == 20

    proc = await _serve(config, port, tmp_path)  # its start replays the dead process's spool
    try:
        assert rows() == sorted(ids)
        fake.faults.append(Fault(stall_after_events=2))
        async with aiohttp.ClientSession() as s:
            async with s.post(
                f"http://127.0.0.1:{port}/v1/chat/completions", json={**body, "stream": True}, headers=headers
            ) as r:
                assert r.status == 200
                await r.content.readline()  # the stream has begun, the upstream is stalled
                proc.send_signal(signal.SIGTERM)
                await asyncio.sleep(0.3)
                fake.release.set()  # the in-flight request finishes during the graceful stop
                last = r.headers["x-request-id"]
                assert b"[DONE]" in await r.read()
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, out.decode()
    assert rows() == sorted([*ids, last])  # flushed on the way out, every row once
    status = con.execute("SELECT status FROM gateway_ledger WHERE request_id = ?", (last,)).fetchone()[0]
    con.close()
    assert status == "ok"
    assert _segments(spool) == [], os.listdir(spool)
    assert json.dumps(out.decode()).count("Traceback") == 0, out.decode()


async def test_a_spool_that_cannot_be_written_is_named_and_the_row_still_written(db, tmp_path, caplog):
    spool = tmp_path / "spool"
    writer = await _started(db, spool)
    try:
        spool.rmdir()
        spool.write_text("not a folder")  # a new segment cannot be created
        writer.submit(_row("a"))
        writer.submit(_row("b"))
        (problem,) = writer.problems()
        assert problem.startswith("ledger spool not writable") and writer.spool_errors == 2
        assert len([r for r in caplog.records if "cannot write a row" in r.getMessage()]) == 1
        assert await writer.flush() == 2  # the rows were kept in memory
        spool.unlink()
        spool.mkdir()
        writer.submit(_row("c"))
        assert writer.problems() == [] and len(_segments(spool)) == 1
    finally:
        await writer.stop()
    assert await _ids(db) == ["a", "b", "c"]


async def test_a_row_submitted_after_stop_is_kept_for_the_next_start(db, tmp_path):
    spool = tmp_path / "spool"
    a = await _started(db, spool)
    a.submit(_row("early"))
    await a.stop()
    a.submit(_row("late"))  # e.g. a request that finished after the ledger stopped
    assert [r["request_id"] for r in _spooled(spool)] == ["late"]
    b = await _started(db, spool)
    await b.stop()
    assert b.replayed == 1 and await _ids(db) == ["early", "late"] and _segments(spool) == []
