"""The daily cost budget through the shared state (gateway.limits.redis, a real redis-server): two gateway
apps on one database and one Redis spend one budget, overshooting it by at most one request's reservation, and
a Redis that comes back empty rebuilds the day's cost from the ledger."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import redis

from tests.gateway.redis import test_redis_shared_state as test_shared_state
from tests.gateway.redis.test_redis_shared_state import chat, empty_redis

start_shared = test_shared_state.start_shared  # its fixture: gateways on one database and one Redis

PRICES = {"gpt-upstream": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}}  # ~a cent a request
BUDGET_USD = 0.08
MAX_TOKENS = 8


def spent_usd(fake) -> float:
    return sum(1000 * (i + o) / 1e6 for _, _, i, o in fake.usage_log)


async def test_two_gateways_share_one_cost_budget_rebuilt_from_the_ledger(start_shared, fake):
    a, b = await start_shared(prices=PRICES, projects={"alpha": {"daily_cost_budget_usd": BUDGET_USD}})
    refused = None
    async with aiohttp.ClientSession() as s:
        for _ in range(40):
            wave = await asyncio.gather(*(chat(s, (a, b)[i % 2], max_tokens=MAX_TOKENS) for i in range(4)))
            refused = next((r for r in wave if r[0] == 429 and "has used" in r[2]["error"]["message"]), None)
            if refused is not None:
                break
        assert refused is not None, "the shared cost budget never refused"
        assert refused[1]["x-farm-limit"] == "daily_cost_budget"
        assert "daily cost budget" in refused[2]["error"]["message"]
        one_reservation = (20 + MAX_TOKENS) * 1000 / 1e6  # more than any one request here reserves
        spent = spent_usd(fake)
        assert BUDGET_USD <= spent < BUDGET_USD + one_reservation, spent  # two apps alone would allow 2x
        for g in (a, b):
            assert (await chat(s, g))[0] == 429
        # the other project has no cost budget
        assert (await chat(s, a, project="beta"))[0] == 200

        # Redis comes back empty: the day's cost is rebuilt from the ledger, not started from zero
        await empty_redis((a, b), start_shared.prefix)
        st, _, body = await chat(s, b)
        assert st == 429 and "has used its daily cost budget" in body["error"]["message"], body
        r = redis.Redis.from_url(a.gw.settings.redis_url)
        try:
            rebuilt = int(r.get(b.gw.limits.cost_key("alpha", int(time.time() // 86400)))) / 1e9
        finally:
            r.close()
    assert rebuilt == pytest.approx(spent, abs=1e-6)  # gpt-beta has no price: its request counts nothing


async def test_the_cost_budget_gauge_reads_what_the_shared_counter_says(start_shared, fake):
    """gateway_daily_cost_budget_remaining_usd of a gateway is the budget less the shared spend as it last
    saw it: the one that served says what both spent, the other (idle) the whole budget until it serves
    (the alert rules take the lowest, per project)."""
    a, b = await start_shared(prices=PRICES, projects={"alpha": {"daily_cost_budget_usd": 1.0}})

    def left(g) -> float:
        return g.gw.metrics.registry.get_sample_value(
            "gateway_daily_cost_budget_remaining_usd", {"project": "alpha"}
        )

    async def settled(g) -> float:
        """The gauge once the gateway has Redis' reply to its last settlement: the reply comes after the
        answer to the client (on a loaded host, after the test's next line), on this event loop."""
        deadline = time.monotonic() + 10.0
        while left(g) != pytest.approx(1.0 - spent_usd(fake), abs=1e-6) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return left(g)

    async with aiohttp.ClientSession() as s:
        assert (await chat(s, a))[0] == 200 and (await chat(s, a))[0] == 200
        assert await settled(a) == pytest.approx(1.0 - spent_usd(fake), abs=1e-6)
        assert left(b) == 1.0
        assert (await chat(s, b))[0] == 200
    assert await settled(b) == pytest.approx(1.0 - spent_usd(fake), abs=1e-6) and left(b) < left(a)
    assert (
        a.gw.metrics.registry.get_sample_value("gateway_daily_cost_budget_usd", {"project": "alpha"}) == 1.0
    )
