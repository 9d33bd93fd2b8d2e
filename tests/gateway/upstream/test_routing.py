"""Routing over deployments (gateway.upstream.routing): two real fake upstreams, the real SDKs, the real
ledger.

Cooldowns end by moving the router's injectable clock, never by sleeping."""

from __future__ import annotations

import asyncio
import socket

import anthropic
import openai
import pytest

from testkit.gateway.fake_upstream import FakeUpstream, Fault

MSGS = [{"role": "user", "content": "hi"}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def unused_port() -> int:
    """A port nothing listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
async def fake2():
    f = FakeUpstream()
    await f.start()
    yield f
    f.release.set()
    await f.close()


def models(**extra) -> dict:
    """The conftest's models plus ``extra`` (public name -> route)."""
    base = {
        "gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"},
        "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
        "claude-fake": {"provider": "an", "upstream_model": "claude-upstream"},
    }
    return {**base, **extra}


def two(provider_a: str, provider_b: str, **extra) -> dict:
    """A route of two deployments, ``a`` on provider_a (the first fake), ``b`` on provider_b (the second)."""
    return {
        "deployments": [
            {"name": "a", "provider": provider_a, "upstream_model": "up-a", **extra.pop("a", {})},
            {"name": "b", "provider": provider_b, "upstream_model": "up-b", **extra.pop("b", {})},
        ],
        **extra,
    }


def providers(fake2: FakeUpstream) -> dict:
    return {
        "oa2": {"kind": "openai", "base_url": fake2.base_url, "read_timeout_s": 5, "connect_timeout_s": 2},
        "an2": {"kind": "anthropic", "base_url": fake2.base_url, "read_timeout_s": 5, "connect_timeout_s": 2},
    }


async def start(start_gateway, fake2, clock: Clock | None = None, **overrides):
    overrides.setdefault("providers", providers(fake2))
    gw = await start_gateway(**overrides)
    if clock is not None:
        gw.gw.router.clock = clock
    return gw


def metric(gw, name: str, **labels) -> float:
    return gw.gw.metrics.registry.get_sample_value(name, labels) or 0.0


def models_seen(*fakes: FakeUpstream) -> list[str]:
    return [s.body["model"] for f in fakes for s in f.seen]


async def test_429_moves_to_the_other_deployment_then_the_first_is_probed(start_gateway, fake, fake2, oai):
    clock = Clock()
    gw = await start(start_gateway, fake2, clock, models=models(**{"gpt-fake": two("oa", "oa2")}))
    client = oai(gw)
    fake.faults.append(Fault(status=429, retry_after="5"))
    raw = await client.chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    assert raw.parse().choices[0].message.content  # no client-visible error
    assert (raw.headers["x-farm-model"], raw.headers["x-farm-deployment"]) == ("gpt-fake", "b")
    assert (fake.requests, fake2.requests) == (1, 1)
    for _ in range(3):  # `a` cools down for its Retry-After: everything goes to `b`
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake.requests, fake2.requests) == (1, 4)
    clock.now += 5.01  # the cooldown is over: the next request probes `a`
    raw = await client.chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    assert raw.headers["x-farm-deployment"] == "a"
    assert (fake.requests, fake2.requests) == (2, 4)
    assert models_seen(fake) == ["up-a", "up-a"] and set(models_seen(fake2)) == {"up-b"}
    rows = await gw.rows()
    assert [(r["deployment"], r["retries"], r["status"]) for r in rows] == [
        ("b", 1, "ok"), ("b", 0, "ok"), ("b", 0, "ok"), ("b", 0, "ok"), ("a", 0, "ok"),
    ]  # fmt: skip
    assert {(r["provider"], r["upstream_model"]) for r in rows} == {("oa2", "up-b"), ("oa", "up-a")}
    assert all(r["fallback_from"] is None for r in rows)
    labels = {"model": "gpt-fake", "deployment": "a"}
    assert metric(gw, "gateway_deployment_cooldowns_total", **labels) == 1
    assert metric(gw, "gateway_deployment_errors_total", **labels, **{"class": "rate_limit"}) == 1
    assert metric(gw, "gateway_deployment_requests_total", **labels) == 2
    assert metric(gw, "gateway_deployment_requests_total", model="gpt-fake", deployment="b") == 4
    assert metric(gw, "gateway_deployment_in_flight", **labels) == 0


async def test_anthropic_429_with_retry_after_ms_moves_on_and_probes(start_gateway, fake, fake2, anth):
    clock = Clock()
    gw = await start(start_gateway, fake2, clock, models=models(**{"claude-fake": two("an", "an2")}))
    client = anth(gw)
    fake.faults.append(Fault(status=429, headers={"retry-after-ms": "2500"}))
    raw = await client.messages.with_raw_response.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert (await raw.parse()).content[0].text
    assert raw.headers["x-farm-deployment"] == "b"
    await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert (fake.requests, fake2.requests) == (1, 2)
    clock.now += 2.4  # still cooling
    await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert (fake.requests, fake2.requests) == (1, 3)
    clock.now += 0.2
    stream = await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS, stream=True)
    async for _ in stream:
        pass
    assert (fake.requests, fake2.requests) == (2, 3)
    rows = await gw.rows()
    assert [r["deployment"] for r in rows] == ["b", "b", "b", "a"]


async def test_weights_split_sequential_requests_exactly(start_gateway, fake, fake2, oai):
    route = two("oa", "oa2", a={"weight": 3})
    gw = await start(start_gateway, fake2, models=models(**{"gpt-fake": route}))
    client = oai(gw)
    for _ in range(12):
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake.requests, fake2.requests) == (9, 3)


async def test_in_flight_headroom_steers_concurrent_requests(start_gateway, fake, fake2, oai):
    gw = await start(start_gateway, fake2, models=models(**{"gpt-fake": two("oa", "oa2")}))
    client = oai(gw)
    fake.faults.append(Fault(stall_before_headers=True))  # the first request (to `a`) hangs
    first = asyncio.create_task(client.chat.completions.create(model="gpt-fake", messages=MSGS))
    while fake.requests < 1:
        await asyncio.sleep(0.005)
    for _ in range(3):  # `a` has one in flight, `b` none: `b` has the headroom each time
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake.requests, fake2.requests) == (1, 3)
    fake.release.set()
    await first
    assert metric(gw, "gateway_deployment_in_flight", model="gpt-fake", deployment="a") == 0


async def test_deployment_rpm_is_skipped_when_reached(start_gateway, fake, fake2, oai):
    route = two("oa", "oa2", a={"weight": 100, "rpm": 2})
    gw = await start(start_gateway, fake2, Clock(), models=models(**{"gpt-fake": route}))
    for _ in range(5):
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake.requests, fake2.requests) == (2, 3)


async def test_connect_failures_cool_a_deployment_after_allowed_fails(start_gateway, fake2, oai, unused_port):
    dead = {"kind": "openai", "base_url": f"http://127.0.0.1:{unused_port}/v1", "connect_timeout_s": 1}
    gw = await start(
        start_gateway,
        fake2,
        Clock(),
        providers={**providers(fake2), "dead": dead},
        models=models(**{"gpt-fake": two("dead", "oa2")}),
        routing={"allowed_fails": 1, "cooldown_s": 30},
    )
    client = oai(gw)
    for _ in range(6):
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    assert fake2.requests == 6
    labels = {"model": "gpt-fake", "deployment": "a"}
    # the first failure is allowed, the second cools `a` down: no third attempt
    assert metric(gw, "gateway_deployment_requests_total", **labels) == 2
    assert metric(gw, "gateway_deployment_errors_total", **labels, **{"class": "connect"}) == 2
    assert metric(gw, "gateway_deployment_cooldowns_total", **labels) == 1


async def test_all_deployments_failing_the_fallback_answers(start_gateway, fake, fake2, oai):
    route = two("oa", "oa2", fallbacks=["gpt-beta"])  # gpt-beta is not alpha's: fallbacks are operator config
    gw = await start(start_gateway, fake2, Clock(), models=models(**{"gpt-fake": route}))
    fake.faults.append(Fault(status=503))
    fake2.faults.append(Fault(status=500))
    raw = await oai(gw).chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    assert raw.parse().choices[0].message.content
    assert (raw.headers["x-farm-model"], raw.headers["x-farm-deployment"]) == ("gpt-beta", "oa")
    assert models_seen(fake, fake2) == ["up-a", "gpt-beta", "up-b"]
    (row,) = await gw.rows()
    assert (row["public_model"], row["fallback_from"], row["deployment"]) == ("gpt-fake", "gpt-fake", "oa")
    assert (row["upstream_model"], row["provider"], row["retries"]) == ("gpt-beta", "oa", 2)
    assert metric(gw, "gateway_fallbacks_total", from_model="gpt-fake", to_model="gpt-beta") == 1


async def test_cooling_model_goes_straight_to_its_fallback(start_gateway, fake, fake2, oai):
    route = {"provider": "oa2", "upstream_model": "up-b", "fallbacks": ["gpt-beta"]}
    clock = Clock()
    gw = await start(start_gateway, fake2, clock, models=models(**{"gpt-fake": route}))
    client = oai(gw)
    fake2.faults.append(Fault(status=429, retry_after="30"))
    await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake2.requests, fake.requests) == (1, 2)  # the second never tried the cooling deployment
    clock.now += 31
    raw = await client.chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    assert raw.headers["x-farm-model"] == "gpt-fake" and fake2.requests == 2
    rows = await gw.rows()
    assert [r["fallback_from"] for r in rows] == ["gpt-fake", "gpt-fake", None]


async def test_fallback_on_excludes_a_class(start_gateway, fake, fake2, oai):
    route = two("oa", "oa2", fallbacks=["gpt-beta"])
    gw = await start(
        start_gateway,
        fake2,
        Clock(),
        models=models(**{"gpt-fake": route}),
        projects={"alpha": {"fallback_on": ["rate_limit"]}},
    )
    fake.faults.extend([Fault(status=503)] * 4)
    fake2.faults.extend([Fault(status=503)] * 4)
    with pytest.raises(openai.InternalServerError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.status_code == 503
    assert "gpt-beta" not in models_seen(fake, fake2)
    assert fake.requests + fake2.requests == 4  # first try + max_retries, over both deployments
    (row,) = await gw.rows()
    assert row["fallback_from"] is None and row["retries"] == 3


async def test_a_400_is_never_retried_nor_sent_to_a_fallback(start_gateway, fake, fake2, oai):
    route = two("oa", "oa2", fallbacks=["gpt-beta"], context_window_fallbacks=["gpt-beta"])
    gw = await start(
        start_gateway,
        fake2,
        models=models(**{"gpt-fake": route}),
        projects={"alpha": {"fallback_on": ["rate_limit", "server_error", "timeout", "context_window"]}},
    )
    fake.faults.append(Fault(status=400))
    with pytest.raises(openai.BadRequestError):
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert (fake.requests, fake2.requests) == (1, 0)
    (row,) = await gw.rows()
    assert (row["http_status"], row["retries"], row["deployment"]) == (400, 0, "a")


OPENAI_CONTEXT_ERROR = {
    "error": {
        "message": "This model's maximum context length is 8192 tokens.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}
ANTHROPIC_CONTEXT_ERROR = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210000 tokens > 200000 maximum",
    },
}
WITH_CONTEXT = {"alpha": {"fallback_on": ["rate_limit", "server_error", "timeout", "context_window"]}}


@pytest.mark.parametrize("enabled", [True, False])
async def test_context_window_fallback_openai(start_gateway, fake, fake2, oai, enabled):
    route = {"provider": "oa", "upstream_model": "short", "context_window_fallbacks": ["gpt-long"]}
    long = {"provider": "oa2", "upstream_model": "long-up"}
    gw = await start(
        start_gateway,
        fake2,
        models=models(**{"gpt-fake": route, "gpt-long": long}),
        projects=WITH_CONTEXT if enabled else {},
    )
    fake.faults.append(Fault(status=400, error_body=OPENAI_CONTEXT_ERROR))
    client = oai(gw)
    if not enabled:  # not in fallback_on: the 400 goes back as it is
        with pytest.raises(openai.BadRequestError) as ei:
            await client.chat.completions.create(model="gpt-fake", messages=MSGS)
        assert ei.value.code == "context_length_exceeded"
        assert (fake.requests, fake2.requests) == (1, 0)
        return
    raw = await client.chat.completions.with_raw_response.create(model="gpt-fake", messages=MSGS)
    assert raw.parse().choices[0].message.content
    assert raw.headers["x-farm-model"] == "gpt-long"
    assert models_seen(fake, fake2) == ["short", "long-up"]
    (row,) = await gw.rows()
    assert (row["fallback_from"], row["upstream_model"], row["status"]) == ("gpt-fake", "long-up", "ok")


async def test_context_window_fallback_anthropic_once_only(start_gateway, fake, fake2, anth):
    route = {"provider": "an", "upstream_model": "short", "context_window_fallbacks": ["claude-long"]}
    long = {"provider": "an2", "upstream_model": "long-up", "context_window_fallbacks": ["claude-fake"]}
    gw = await start(
        start_gateway,
        fake2,
        models=models(**{"claude-fake": route, "claude-long": long}),
        projects=WITH_CONTEXT,
    )
    client = anth(gw)
    fake.faults.append(Fault(status=400, error_body=ANTHROPIC_CONTEXT_ERROR))
    raw = await client.messages.with_raw_response.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert raw.headers["x-farm-model"] == "claude-long"
    # too long for the fallback too: re-sent once, not again
    fake.faults.append(Fault(status=400, error_body=ANTHROPIC_CONTEXT_ERROR))
    fake2.faults.append(Fault(status=400, error_body=ANTHROPIC_CONTEXT_ERROR))
    with pytest.raises(anthropic.BadRequestError) as ei:
        await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert "prompt is too long" in ei.value.message
    assert (fake.requests, fake2.requests) == (2, 2)
    # another 400 that is not about the context: never re-sent
    fake.faults.append(Fault(status=400))
    with pytest.raises(anthropic.BadRequestError):
        await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert (fake.requests, fake2.requests) == (3, 2)


async def test_summaries_go_through_the_routing(start_gateway, fake, fake2):
    from tests.gateway.http.endpoints.test_summaries import anomaly, model_reply, post

    fake.reply = fake2.reply = model_reply
    gw = await start(start_gateway, fake2, Clock(), models=models(**{"gpt-fake": two("oa", "oa2")}))
    fake.faults.append(Fault(status=503))
    status, body = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 200 and [d["anomaly_ids"] for d in body["drafts"]] == [["an-1"]]
    assert models_seen(fake, fake2) == ["up-a", "up-b"]
    (row,) = await gw.rows()
    assert (row["endpoint"], row["deployment"], row["upstream_model"], row["retries"]) == (
        "summaries", "b", "up-b", 1,
    )  # fmt: skip


async def test_summaries_reach_a_deployment_of_the_other_kind_in_its_own_format(start_gateway, fake, fake2):
    """A summaries model whose second deployment is an Anthropic one: that attempt is a Messages request (not
    the chat body), and its answer is read as Messages."""
    from tests.gateway.http.endpoints.test_summaries import anomaly, model_reply, post

    fake.reply = fake2.reply = model_reply
    gw = await start(start_gateway, fake2, Clock(), models=models(**{"gpt-fake": two("oa", "an2")}))
    fake.faults.append(Fault(status=503))
    status, body = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 200 and [d["anomaly_ids"] for d in body["drafts"]] == [["an-1"]], body
    assert [s.path for s in fake.seen] == ["/v1/chat/completions"]
    (seen,) = fake2.seen
    assert seen.path == "/v1/messages" and "system" in seen.body and "response_format" not in seen.body
    assert seen.headers.get("anthropic-version")
    (row,) = await gw.rows()
    assert (row["deployment"], row["upstream_model"], row["status"]) == ("b", "up-b", "ok")
    assert row["input_tokens"] > 0 and not row["tokens_estimated"]
