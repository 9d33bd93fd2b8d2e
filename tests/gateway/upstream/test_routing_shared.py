"""A deployment's rpm and tpm shared through Redis (gateway.upstream.routing on gateway.limits.redis): two
gateway apps on one Redis send a deployment at most its limits within the window, together, not each; the
rest goes to the other deployment. Real fake upstreams, a real redis-server, the real gateways."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.gateway.redis import test_redis_shared_state as test_shared_state
from tests.gateway.redis.test_redis_shared_state import chat
from tests.gateway.upstream import test_routing

start_shared = test_shared_state.start_shared  # gateways on one database and one Redis
fake2 = test_routing.fake2  # a second fake upstream

pytestmark = pytest.mark.service("redis")


def routed(fake2, a: dict) -> dict:
    """Settings: alpha's gpt-fake on two deployments, ``a`` (the first fake, preferred by weight, with the
    limits ``a``) and ``b`` (the second fake, no limits)."""
    return {
        "providers": test_routing.providers(fake2),
        "models": test_routing.models(**{"gpt-fake": test_routing.two("oa", "oa2", a={"weight": 100, **a})}),
    }


async def test_two_gateways_send_a_deployment_its_rpm_together_not_each(start_shared, fake, fake2):
    one, two = await start_shared(**routed(fake2, {"rpm": 3}))
    async with aiohttp.ClientSession() as s:
        results = await asyncio.gather(*(chat(s, (one, two)[i % 2]) for i in range(10)))
        assert [st for st, _, _ in results] == [200] * 10
        # 3 a minute for both together (each alone would have sent `a` 3, 6 in all); the rest went to `b`
        assert (fake.requests, fake2.requests) == (3, 7)
        deployments = [h["x-farm-deployment"] for _, h, _ in results]
        assert deployments.count("a") == 3 and deployments.count("b") == 7
        # sequential requests through either gateway: `a` stays full for the rest of its window
        for g in (one, two, one, two):
            assert (await chat(s, g))[1]["x-farm-deployment"] == "b"
    assert fake.requests == 3


async def test_a_deployments_tpm_spent_through_one_gateway_is_spent_for_the_other(start_shared, fake, fake2):
    one, two = await start_shared(**routed(fake2, {"tpm": 1}))
    async with aiohttp.ClientSession() as s:
        # the first request's tokens (its estimate, settled to its real usage) fill `a`'s window of 1 token a
        # minute; each gateway on its own would still send its own first request to `a`
        deployments = [(await chat(s, g))[1]["x-farm-deployment"] for g in (one, two, one, two)]
    assert deployments == ["a", "b", "b", "b"]
    assert (fake.requests, fake2.requests) == (1, 3)
