"""Routing that follows the deployments (issue 48): ``models.<m>.strategy`` ``latency`` and ``least-busy``
beside ``weighted``, the reason in ``x-farm-route``, and the active health checks of idle deployments.

Before: every model was routed by weight only, and a slow deployment kept its share. Times are the router's
own clock, moved by the fake upstreams while they answer (``reply``), so what is measured is exact and no
test depends on the machine's speed."""

from __future__ import annotations

import random

import pytest

from gateway.limits.local import Limits
from gateway.upstream.routing import Router
from gateway.upstream.strategies import WHY_EXPLORE, WHY_FASTEST, WHY_LEAST_BUSY, WHY_UNMEASURED, WHY_WEIGHTED
from testkit.gateway.fake_upstream import FakeUpstream, Fault
from tests.gateway.upstream.test_routing import Clock, models, start, two
from tests.gateway.upstream.test_routing_config import deployments, settings

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def fake2():
    f = FakeUpstream()
    await f.start()
    yield f
    f.release.set()
    await f.close()


def _slow(clock: Clock, seconds: float):
    """A fake's ``reply``: the answer takes ``seconds`` on the router's clock."""

    def reply(_body: dict) -> str:
        clock.now += seconds
        return "ok"

    return reply


async def _ask(client) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    raw.parse()
    return raw.headers["x-farm-deployment"], raw.headers.get("x-farm-route", "")


async def test_latency_goes_to_the_faster_deployment_and_back_when_the_other_is_faster(
    start_gateway, fake, fake2, oai
):
    clock = Clock()
    route = two("oa", "oa2", strategy="latency")
    gw = await start(
        start_gateway, fake2, clock, models=models(**{"gpt-fake": route}), routing={"latency_explore": 0}
    )
    fake.reply, fake2.reply = _slow(clock, 0.1), _slow(clock, 0.3)  # b is 3x slower
    client = oai(gw)
    first = {await _ask(client) for _ in range(2)}  # each is measured once first
    assert first == {("a", WHY_UNMEASURED), ("b", WHY_UNMEASURED)}
    assert [await _ask(client) for _ in range(5)] == [("a", WHY_FASTEST)] * 5
    md = gw.gw.router.models["gpt-fake"]
    a, b = md.deployments
    assert (a.ttfb, b.ttfb) == pytest.approx((0.1, 0.3))

    fake2.reply = _slow(clock, 0.01)  # b is fast now: only exploring sees it
    md.explore = 1.0
    assert await _ask(client) == ("b", WHY_EXPLORE)
    assert b.ttfb > a.ttfb  # one answer does not move it: the median of 0.3 and 0.01
    assert await _ask(client) == ("b", WHY_EXPLORE)
    assert b.ttfb < a.ttfb  # the median of its latest: 0.3, 0.01, 0.01
    md.explore = 0.0
    assert [await _ask(client) for _ in range(3)] == [("b", WHY_FASTEST)] * 3


async def test_a_single_deployment_says_nothing_and_weighted_says_so(start_gateway, fake, fake2, oai):
    gw = await start(start_gateway, fake2, models=models(**{"gpt-fake": two("oa", "oa2")}))
    assert {await _ask(oai(gw)) for _ in range(2)} == {("a", WHY_WEIGHTED), ("b", WHY_WEIGHTED)}
    beta = oai(gw, project="beta")
    raw = await beta.chat.completions.with_raw_response.create(model="gpt-beta", messages=MSGS)
    assert raw.headers["x-farm-deployment"] == "oa" and "x-farm-route" not in raw.headers


def _router(strategy: str, explore: float = 0.0, **dep) -> Router:
    cfg = settings(
        {"m": {"deployments": deployments("a", "b", **dep), "strategy": strategy}},
        routing={"latency_explore": explore},
    )
    return Router(cfg, {}, limits=Limits(cfg.projects), clock=Clock(), environ={})


@pytest.mark.parametrize(("strategy", "want"), [("weighted", "a"), ("least-busy", "b")])
def test_least_busy_counts_requests_in_flight_and_weighted_per_weight(strategy, want):
    r = _router(strategy, a={"weight": 4})
    a, b = r.models["m"].deployments
    a.in_flight, b.in_flight = 2, 1  # a: 0.5 per weight, b: 1.0; b has fewer in flight
    assert r.models["m"].pick(0.0).name == want
    assert r.models["m"].why == (WHY_WEIGHTED if strategy == "weighted" else WHY_LEAST_BUSY)


def test_latency_explores_its_share_of_requests():
    r = _router("latency", explore=0.05)
    md = r.models["m"]
    md.rng = random.Random(7)
    a, b = md.deployments
    a.ttfb, b.ttfb = 0.02, 0.06
    picks = [md.pick(0.0) for _ in range(4000)]
    share = picks.count(b) / len(picks)
    assert 0.03 < share < 0.07, share  # a seeded draw: 5% explore, the rest to the fastest


async def test_health_checks_cool_a_failing_idle_deployment_before_a_request_meets_it(
    start_gateway, fake, fake2, oai
):
    clock = Clock()
    route = two("oa", "an2")  # b speaks Anthropic: its check is a Messages call
    gw = await start(
        start_gateway,
        fake2,
        clock,
        models=models(**{"gpt-fake": route}),
        routing={"health_check_interval_s": 60, "allowed_fails": 0, "cooldown_s": 30},
    )
    health = gw.gw.health
    fake2.faults.append(Fault(status=503))
    checked = await health.check_idle()  # both idle since the start
    assert [d.name for d in checked if d.model == "gpt-fake"] == ["a", "b"]
    probe = fake2.seen[-1]
    assert probe.path == "/v1/messages" and probe.body["max_tokens"] == 1
    assert probe.headers.get("anthropic-version")
    a, b = gw.gw.router.models["gpt-fake"].deployments
    assert b.cooldown_until > clock.now and a.cooldown_until == 0
    before = fake2.requests
    assert {await _ask(oai(gw)) for _ in range(3)} == {("a", WHY_WEIGHTED)}  # no request met b's error
    assert fake2.requests == before

    clock.now += 61  # b's cooldown is over and both are idle again: b answers its check
    assert [d.name for d in await health.check_idle() if d.model == "gpt-fake"] == ["a", "b"]
    assert b.cooldown_until == 0
    assert {(await _ask(oai(gw)))[0] for _ in range(2)} == {"a", "b"}
