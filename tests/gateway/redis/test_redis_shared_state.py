"""Shared state through a real redis-server (gateway.redis, gateway.limits.redis): two gateway apps in one
event loop, one database, one Redis, act as one gateway: rpm, tpm, concurrency and the daily budget hold
across both, a key revoked through one is refused by the other at once, one summaries batch costs one model
call; with Redis stopped both keep serving (``degraded``) and the shared limits come back with it. Each test
runs under a key prefix of its own on the session's redis-server (the outage test on a server of its own)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
import uuid
from datetime import timedelta

import aiohttp
import pytest
import redis
import services
from aiohttp import web

from gateway.core.usage import estimate_tokens
from gateway.http.app import create_app
from gateway.store.keys import KEY_RE
from gateway.summaries.batcher import SUMMARIES_PATH
from tests.gateway.http.endpoints.test_summaries import anomaly, model_reply
from tests.gateway.serving import ServedGateway

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def start_shared(fake, tmp_path, redis_server, settings_factory):
    """``start_shared(n=2, redis_url=None, **settings)``: n gateways on one database and one Redis (the
    session's, under a fresh key prefix, unless ``redis_url``), each with its own spool; keys made once."""
    started: list[ServedGateway] = []
    prefix = f"t{uuid.uuid4().hex[:12]}"

    async def start(n: int = 2, redis_url: str | None = None, **overrides) -> list[ServedGateway]:
        keys: dict[str, str] = {}
        out = []
        for _ in range(n):
            settings = settings_factory(
                fake,
                tmp_path / "shared.db",
                redis_url=redis_url or redis_server.url,
                redis_key_prefix=prefix,
                ledger_spool_dir=str(tmp_path / f"spool{len(started)}"),
                **overrides,
            )
            app = create_app(settings)
            runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            rg = ServedGateway(app, runner, runner.addresses[0][1], keys)
            started.append(rg)
            out.append(rg)
        for project in ("alpha", "beta"):
            keys[project], _ = await out[0].gw.keys.create(project, "test")
        return out

    start.prefix = prefix  # type: ignore[attr-defined]
    yield start
    fake.release.set()
    for rg in started:
        await rg.runner.cleanup()


async def chat(
    s: aiohttp.ClientSession, gw: ServedGateway, project: str = "alpha", max_tokens: int = 8, key=None
):
    body = {
        "model": "gpt-fake" if project == "alpha" else "gpt-beta",
        "messages": MSGS,
        "max_tokens": max_tokens,
    }
    headers = {"Authorization": f"Bearer {key or gw.keys[project]}"}
    async with s.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers) as r:
        return r.status, r.headers, await r.json()


async def empty_redis(gateways: tuple[ServedGateway, ...], prefix: str) -> None:
    """Redis as it comes back empty: the gateways' ledgers flushed, then every key under ``prefix`` gone."""
    for g in gateways:
        await g.gw.ledger.flush()
    r = redis.Redis.from_url(gateways[0].gw.settings.redis_url)
    try:
        for k in r.scan_iter(f"{prefix}:*"):
            r.delete(k)
    finally:
        r.close()


def metric(gw: ServedGateway, name: str, **labels) -> float | None:
    return gw.gw.metrics.registry.get_sample_value(name, labels)


async def test_rpm_admits_exactly_the_limit_across_two_gateways(start_shared, fake):
    a, b = await start_shared(projects={"alpha": {"rpm": 10}})
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(chat(s, (a, b)[i % 2]) for i in range(16)))
    statuses = [st for st, _, _ in results]
    assert statuses.count(200) == 10 and statuses.count(429) == 6, statuses
    assert fake.requests == 10
    for st, headers, body in results:
        if st == 429:
            assert headers["x-farm-limit"] == "rpm" and "requests per minute" in body["error"]["message"]
            assert 1 <= int(headers["Retry-After"]) <= 6  # the next of 10 per minute, by Redis' clock
    assert {st for st, _, _ in results[0::2]} == {200, 429} or {st for st, _, _ in results[1::2]} == {
        200,
        429,
    }


async def test_tpm_reservation_settles_across_two_gateways(start_shared, fake):
    a, b = await start_shared(projects={"alpha": {"tpm": 100}})
    async with aiohttp.ClientSession() as s:
        assert (await chat(s, a, max_tokens=80))[0] == 200
        # a reserved 80 and settled to the ~13 used: 80 more fit through b within the minute
        assert (await chat(s, b, max_tokens=80))[0] == 200
        # ~27 used by both: 80 more do not fit, through a either (a alone would have ~13 used)
        st, headers, body = await chat(s, a, max_tokens=80)
    assert st == 429 and headers["x-farm-limit"] == "tpm", body
    assert "tokens per minute" in body["error"]["message"]
    assert 1 <= int(headers["Retry-After"]) <= 5


async def test_concurrency_across_two_gateways_never_exceeds_the_cap(start_shared, fake):
    a, b = await start_shared(projects={"alpha": {"max_concurrency": 2}})
    fake.latency_s = 0.05
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(chat(s, (a, b)[i % 2]) for i in range(12)))
    assert [st for st, _, _ in results] == [200] * 12
    assert fake.max_in_flight == 2
    for g in (a, b):  # nothing left held
        assert g.gw.limits["alpha"].in_flight == 0 and not g.gw.limits["alpha"]._slots


async def test_daily_budget_is_exact_within_one_reservation_and_rebuilt_from_the_ledger(start_shared, fake):
    budget = 300
    a, b = await start_shared(projects={"alpha": {"daily_token_budget": budget}})
    body = {"model": "gpt-fake", "messages": MSGS, "max_tokens": 8}
    reservation = estimate_tokens(json.dumps(body).encode()) + 8  # one request's, about (the body differs)
    spent = None
    async with aiohttp.ClientSession() as s:
        for _ in range(60):
            wave = await asyncio.gather(*(chat(s, (a, b)[i % 2]) for i in range(6)))
            spent = next((r for r in wave if r[0] == 429 and "has used" in r[2]["error"]["message"]), None)
            if spent is not None:
                break
        assert spent is not None and spent[1]["x-farm-limit"] == "daily_budget"
        assert int(spent[1]["Retry-After"]) > 1  # until 00:00 UTC
        used = sum(i + o for _, _, i, o in fake.usage_log)
        assert budget <= used < budget + reservation, (used, reservation)  # two apps alone would allow 2x
        for g in (a, b):
            assert (await chat(s, g))[0] == 429
            assert g.gw.limits["alpha"].budget_remaining() == 0
        # Redis comes back empty: the counter is rebuilt from the ledger, not started from zero
        await empty_redis((a, b), start_shared.prefix)
        st, headers, body = await chat(s, b)
        assert st == 429 and "has used its daily token budget" in body["error"]["message"], body
    assert sum(i + o for _, _, i, o in fake.usage_log) == used


async def test_revocation_and_rotation_reach_the_other_gateway_at_once(start_shared, fake):
    a, b = await start_shared(key_cache_ttl_s=1.0)  # without the message, b would trust its cache for 1 s

    async def refused_after(key: str) -> float:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2:
            if (await chat(s, b, key=key))[0] == 401:
                return time.perf_counter() - t0
            await asyncio.sleep(0.01)
        return float("inf")

    async with aiohttp.ClientSession() as s:
        alpha, beta = a.keys["alpha"], a.keys["beta"]
        assert (await chat(s, b, key=alpha))[0] == 200  # cached in b now
        assert await a.gw.keys.revoke(KEY_RE.match(alpha).group(1))
        assert await refused_after(alpha) < 0.5

        assert (await chat(s, b, "beta", key=beta))[0] == 200
        new, _ = await a.gw.keys.rotate(KEY_RE.match(beta).group(1), timedelta(0))
        assert await refused_after(beta) < 0.5
        assert (await chat(s, b, "beta", key=new))[0] == 200


async def test_one_summaries_batch_sent_to_two_gateways_costs_one_model_call(start_shared, fake):
    fake.reply = model_reply
    a, b = await start_shared(summaries={"window_ms": 50})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1), anomaly(2)]}

    async def post(g: ServedGateway) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s:
            headers = {"Authorization": f"Bearer {g.keys['alpha']}"}
            async with s.post(g.url + SUMMARIES_PATH, json=body, headers=headers) as r:
                return r.status, await r.json()

    (sa, da), (sb, db) = await asyncio.gather(post(a), post(b))
    assert (sa, sb) == (200, 200), (da, db)
    assert fake.requests == 1
    assert da["drafts"] == db["drafts"] and [d["anomaly_ids"] for d in da["drafts"]] == [["an-1"], ["an-2"]]
    assert da["batch"]["request_ids"] == db["batch"]["request_ids"]
    st, again = await post(b)  # and from the cache after that, in either process
    assert st == 200 and again["cached"] is True and fake.requests == 1


async def test_redis_stopped_mid_load_degrades_without_errors_and_shared_limits_resume(
    start_shared, fake, tmp_path, caplog
):
    from redis_server import Unavailable, start_server

    (tmp_path / "own-redis").mkdir()
    try:
        srv = start_server(tmp_path / "own-redis")
    except Unavailable as e:
        services.missing("redis", str(e))
    caplog.set_level(logging.INFO, logger="gateway.redis.state")
    try:
        a, b = await start_shared(
            redis_url=srv.url,
            redis_health_interval_s=0.1,
            redis_fallback_processes=2,
            projects={"alpha": {"rpm": 10}, "beta": {"max_concurrency": 4}},
        )
        fake.latency_s = 0.005
        statuses: list[int] = []
        stop = asyncio.Event()

        async def load(s: aiohttp.ClientSession, g: ServedGateway) -> None:
            while not stop.is_set():
                statuses.append((await chat(s, g, "beta"))[0])

        async def ready(g: ServedGateway) -> tuple[int, dict]:
            async with s.get(g.url + "/readyz") as r:
                return r.status, await r.json()

        async def until(status: str, timeout: float = 5) -> None:
            deadline = time.monotonic() + timeout
            while [(await ready(g))[1]["status"] for g in (a, b)] != [status, status]:
                assert time.monotonic() < deadline, f"not {status} within {timeout:g} s"
                await asyncio.sleep(0.02)

        async with aiohttp.ClientSession() as s:
            workers = [asyncio.create_task(load(s, g)) for g in (a, b, a, b)]
            await asyncio.sleep(0.2)
            await asyncio.to_thread(srv.stop)
            await until("degraded")
            assert [await ready(g) for g in (a, b)][0][0] == 200
            assert metric(a, "gateway_shared_state_up") == 0
            served = len(statuses)
            await asyncio.sleep(0.3)
            assert len(statuses) > served  # still serving, on each process's own share
            await asyncio.to_thread(srv.start)  # empty, on the same port
            await until("ready")
            await asyncio.sleep(0.1)
            stop.set()
            await asyncio.gather(*workers)
            assert metric(b, "gateway_shared_state_up") == 1
            assert metric(a, "gateway_shared_fallback_admissions_total") > 0
            assert len(statuses) > 20 and set(statuses) == {200}, sorted(set(statuses))
            # shared again: 10 a minute for both together (a's own share alone would be 5)
            results = await asyncio.gather(*(chat(s, a) for _ in range(14)))
            assert [st for st, _, _ in results].count(200) == 10
        # one line per process for the outage and one for the recovery
        messages = [r.getMessage() for r in caplog.records]
        assert sum("is unreachable" in m for m in messages) == 2, messages
        assert sum("reachable again" in m for m in messages) == 2, messages
    finally:
        await asyncio.to_thread(srv.kill)


def test_shares_divide_each_limit_among_the_processes():
    from gateway.config import ProjectConfig
    from gateway.limits.local import share_of

    cfg = ProjectConfig(models=["m"], max_concurrency=5, rpm=10, tpm=1000, daily_token_budget=7)
    part = share_of(cfg, 2)
    assert (part.max_concurrency, part.rpm, part.tpm, part.daily_token_budget) == (2, 5, 500, 3)
    assert share_of(cfg, 100).max_concurrency == 1 and share_of(cfg, 1) is cfg


async def test_a_gateway_started_while_redis_is_down_serves_degraded(start_shared, fake):
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (a,) = await start_shared(n=1, redis_url=f"redis://127.0.0.1:{port}/0", projects={"alpha": {"rpm": 2}})
    async with aiohttp.ClientSession() as s:
        async with s.get(a.url + "/readyz") as r:
            body = await r.json()
            assert r.status == 200 and body["status"] == "degraded", body
            assert body["shared_state"]["up"] is False and body["shared_state"]["error"]
        statuses = [(await chat(s, a))[0] for _ in range(3)]
    assert statuses == [200, 200, 429]  # this process's own rpm
    assert metric(a, "gateway_shared_state_up") == 0
