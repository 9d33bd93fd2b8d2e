"""The shared budget counters reconcile with the ledger after a Redis outage (gateway.limits.redis), on a
redis-server of the test's own and two gateways on one database, both serving through the outage on their own
share of the limits:

- Redis back **empty**: the day's counters are rebuilt from the ledger once, and each process adds only the
  outage usage whose rows that rebuild did not read (the rows it had already written are not counted twice,
  the rows it writes later are not missed);
- Redis back **with its data** (it hung: SIGSTOP, then SIGCONT): the outage usage is added once; a request
  under the hung Redis is answered within the Redis deadline, not after the hang.

Tokens and US dollars alike: after recovery, with nothing in flight, the counters equal the ledger."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from datetime import UTC, datetime

import aiohttp
import pytest
import redis
import services
from sqlalchemy import func, select

from gateway.limits.redis_scripts import utc_day
from gateway.store.db import ledger
from tests.gateway.redis import test_redis_shared_state as test_shared_state
from tests.gateway.redis.test_redis_shared_state import chat

start_shared = test_shared_state.start_shared  # its fixture: gateways on one database and one Redis

PRICES = {"gpt-upstream": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}}
PROJECTS = {"alpha": {"daily_token_budget": 10_000_000, "daily_cost_budget_usd": 1000.0}}
SHARED = {"redis_health_interval_s": 0.05, "redis_timeout_s": 0.3, "redis_fallback_processes": 2}


@pytest.fixture
def own_redis(tmp_path):
    from redis_server import Unavailable, start_server

    (tmp_path / "own-redis").mkdir()
    try:
        srv = start_server(tmp_path / "own-redis")
    except Unavailable as e:
        services.missing("redis", str(e))
    yield srv
    if srv.running:
        os.kill(srv.proc.pid, signal.SIGCONT)  # a test that failed while it was stopped
    srv.kill()


async def serve(s: aiohttp.ClientSession, gateways, n: int) -> list[float]:
    """``n`` requests on each gateway, all answered 200; their latencies (s)."""

    async def one(g) -> float:
        t0 = time.perf_counter()
        status, _, body = await chat(s, g, max_tokens=8)
        assert status == 200, body
        return time.perf_counter() - t0

    return list(await asyncio.gather(*(one(g) for g in gateways for _ in range(n))))


async def until(s: aiohttp.ClientSession, gateways, status: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        seen = []
        for g in gateways:
            async with s.get(g.url + "/readyz") as r:
                seen.append((await r.json())["status"])
        if seen == [status] * len(gateways):
            return
        assert time.monotonic() < deadline, f"not {status} within {timeout:g} s: {seen}"
        await asyncio.sleep(0.02)


async def ledger_today(g) -> tuple[int, float, int]:
    """Project alpha's tokens, US dollars and rows in the ledger today (read here, not by the gateway)."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    q = select(
        func.sum(ledger.c.input_tokens + ledger.c.output_tokens), func.sum(ledger.c.cost_usd), func.count()
    ).where(ledger.c.project == "alpha", ledger.c.ts >= midnight)
    async with g.gw.engine.connect() as conn:
        tokens, usd, rows = (await conn.execute(q)).one()
    return int(tokens or 0), float(usd or 0.0), rows


def counters(g) -> tuple[int, float]:
    """What Redis holds for alpha today: tokens, and US dollars (stored in nano-dollars)."""
    limits = g.gw.limits
    r = redis.Redis.from_url(g.gw.settings.redis_url)
    try:
        used = r.get(limits.used_key("alpha", utc_day()))
        cost = r.get(limits.cost_key("alpha", utc_day()))
    finally:
        r.close()
    return int(used or 0), int(cost or 0) / 1e9


async def assert_reconciled(gateways, served_requests: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    for g in gateways:  # every request's usage handed to Redis (a push may still be under way)
        while g.gw.limits.pending_requests:
            assert time.monotonic() < deadline, f"{g.gw.limits.pending_requests} requests never added"
            await asyncio.sleep(0.01)
        await g.gw.ledger.flush()
    tokens, usd, rows = await ledger_today(gateways[0])
    assert rows == served_requests
    used, cost = counters(gateways[0])
    assert used == tokens, f"Redis counts {used} tokens, the ledger {tokens}"
    assert cost == pytest.approx(usd, abs=1e-6), f"Redis counts ${cost}, the ledger ${usd}"


async def test_redis_back_empty_counts_the_ledger_once(start_shared, fake, own_redis):
    """Both processes wrote their outage rows before Redis came back empty: the rebuild reads them, and
    neither process adds them again (before: the second process to reconnect did)."""
    a, b = await start_shared(redis_url=own_redis.url, prices=PRICES, projects=PROJECTS, **SHARED)
    async with aiohttp.ClientSession() as s:
        await serve(s, (a, b), 3)  # counted through Redis
        await asyncio.to_thread(own_redis.kill)
        await until(s, (a, b), "degraded")
        await serve(s, (a, b), 5)  # each on its own share
        for g in (a, b):
            await g.gw.ledger.flush()  # in the ledger before Redis is back: the rebuild reads them
        await asyncio.to_thread(own_redis.start)  # empty, on the same port
        await until(s, (a, b), "ready")
        await assert_reconciled((a, b), 16)
        async with a.gw.engine.connect() as conn:  # the outage's rows say so (and those written meanwhile)
            flagged = await conn.scalar(select(func.count()).where(ledger.c.shared_pending.is_(True)))
        assert 10 <= flagged <= 16
        await serve(s, (a, b), 2)  # and counting on from there
        await assert_reconciled((a, b), 20)


async def test_redis_back_empty_adds_outage_rows_the_rebuild_did_not_read(start_shared, fake, own_redis):
    """One process's outage rows reach the ledger only after the other rebuilt the counters from it: that
    process adds them (they were neither in the rebuild nor in Redis)."""
    (a,) = await start_shared(n=1, redis_url=own_redis.url, prices=PRICES, projects=PROJECTS, **SHARED)
    (b,) = await start_shared(
        n=1, redis_url=own_redis.url, prices=PRICES, projects=PROJECTS, ledger_flush_interval_s=3600, **SHARED
    )
    async with aiohttp.ClientSession() as s:
        await serve(s, (a, b), 3)
        await b.gw.ledger.flush()
        await asyncio.to_thread(own_redis.kill)
        await until(s, (a, b), "degraded")
        await serve(s, (a, b), 5)
        await a.gw.ledger.flush()  # a's outage rows are in the ledger, b's only in b's writer
        await asyncio.to_thread(own_redis.start)
        await until(s, (a, b), "ready")
        await assert_reconciled((a, b), 16)  # b's rows written now, after the rebuild


async def test_redis_hung_then_back_with_its_data_adds_the_outage_usage_once(start_shared, fake, own_redis):
    a, b = await start_shared(redis_url=own_redis.url, prices=PRICES, projects=PROJECTS, **SHARED)
    async with aiohttp.ClientSession() as s:
        await serve(s, (a, b), 3)
        os.kill(own_redis.proc.pid, signal.SIGSTOP)  # hung: connections open, nothing answers
        try:
            latencies = await serve(s, (a, b), 3)  # the first ones find out
            await until(s, (a, b), "degraded")
            latencies += await serve(s, (a, b), 3)
        finally:
            os.kill(own_redis.proc.pid, signal.SIGCONT)  # back, with the counters it had
        assert max(latencies) < 1.5, latencies  # the Redis deadline (0.3 s), not the hang
        await until(s, (a, b), "ready")
        await assert_reconciled((a, b), 18)
