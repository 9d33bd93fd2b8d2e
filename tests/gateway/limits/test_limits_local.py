"""Concurrency cap, rpm, tpm, daily budget, and auth errors, each in the calling API's error shape."""

from __future__ import annotations

import asyncio

import anthropic
import openai
import pytest
from pg import DB_BACKENDS

from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway of this module runs on SQLite and on PostgreSQL (conftest.start_gateway)."""
    return request.param


def metric(gw, name: str, **labels) -> float:
    return gw.gw.metrics.registry.get_sample_value(name, labels) or 0.0


def assert_openai_error(exc: openai.APIStatusError, status: int) -> dict:
    body = exc.response.json()
    assert exc.status_code == status
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"])
    return body["error"]


def assert_anthropic_error(exc: anthropic.APIStatusError, status: int) -> dict:
    body = exc.response.json()
    assert exc.status_code == status
    assert body["type"] == "error" and {"type", "message"} <= set(body["error"])
    return body["error"]


async def test_burst_never_exceeds_project_concurrency(start_gateway, fake, oai):
    gw = await start_gateway(projects={"alpha": {"max_concurrency": 3}})
    fake.latency_s = 0.05
    client = oai(gw)
    results = await asyncio.gather(
        *(client.chat.completions.create(model="gpt-fake", messages=MSGS) for _ in range(12))
    )
    assert len(results) == 12
    assert fake.max_in_flight == 3
    rows = await gw.rows()
    assert len(rows) == 12 and all(r["status"] == "ok" for r in rows)
    assert max(r["queue_wait_ms"] for r in rows) > 0


async def test_queue_wait_runs_out_with_429(start_gateway, fake, oai):
    gw = await start_gateway(projects={"alpha": {"max_concurrency": 1, "queue_timeout_s": 0.1}})
    fake.faults.append(Fault(stall_before_headers=True))
    client = oai(gw)
    first = asyncio.create_task(client.chat.completions.create(model="gpt-fake", messages=MSGS))
    while fake.in_flight == 0:
        await asyncio.sleep(0.005)
    with pytest.raises(openai.RateLimitError) as ei:
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    err = assert_openai_error(ei.value, 429)
    assert "queue wait" in err["message"] and err["code"] == "concurrency_limit_exceeded"
    assert ei.value.response.headers["retry-after"] == "1"
    assert ei.value.response.headers["x-farm-limit"] == "concurrency"
    fake.release.set()
    await first
    assert metric(gw, "gateway_rejections_total", project="alpha", limit="concurrency") == 1


async def test_rpm_limit_answers_429_with_retry_after(start_gateway, fake, oai, anth):
    gw = await start_gateway(projects={"alpha": {"rpm": 2}})
    await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    await anth(gw).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    with pytest.raises(openai.RateLimitError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    err = assert_openai_error(ei.value, 429)
    assert "requests per minute" in err["message"]
    assert int(ei.value.response.headers["retry-after"]) >= 1
    with pytest.raises(anthropic.RateLimitError) as ai:
        await anth(gw).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    aerr = assert_anthropic_error(ai.value, 429)
    assert aerr["type"] == "rate_limit_error" and "requests per minute" in aerr["message"]
    assert ai.value.response.headers["x-farm-limit"] == "rpm"
    assert fake.requests == 2
    rows = await gw.rows()
    assert [r["status"] for r in rows] == ["ok", "ok", "rejected", "rejected"]
    assert {r["error_class"] for r in rows[2:]} == {"limit_rpm"}
    assert metric(gw, "gateway_rejections_total", project="alpha", limit="rpm") == 2


async def test_tpm_reserves_max_tokens_and_settles_with_actual_usage(start_gateway, fake, oai):
    gw = await start_gateway(projects={"alpha": {"tpm": 100}})
    client = oai(gw)
    await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=80)
    # Reserved 80, settled to the ~15 actually used: another 80 fits in the minute.
    await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=80)
    with pytest.raises(openai.RateLimitError) as ei:
        await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=90)
    err = assert_openai_error(ei.value, 429)
    assert "tokens per minute" in err["message"] and ei.value.response.headers["x-farm-limit"] == "tpm"


async def test_daily_budget(start_gateway, fake, anth):
    gw = await start_gateway(projects={"alpha": {"daily_token_budget": 20}})
    client = anth(gw)
    await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    used = sum(i + o for _, _, i, o in fake.usage_log)
    assert used >= 20
    with pytest.raises(anthropic.RateLimitError) as ai:
        await client.messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert "daily token budget" in assert_anthropic_error(ai.value, 429)["message"]
    assert ai.value.response.headers["x-farm-limit"] == "daily_budget"
    assert metric(gw, "gateway_daily_budget_remaining_tokens", project="alpha") == 0


async def test_wrong_key_401_in_each_format(gateway, fake, oai, anth):
    with pytest.raises(openai.AuthenticationError) as ei:
        await oai(gateway, project="kf_0123456789ab_notarealkeynotarealkey").chat.completions.create(
            model="gpt-fake", messages=MSGS
        )
    assert_openai_error(ei.value, 401)
    with pytest.raises(openai.AuthenticationError):
        await oai(gateway, project="garbage", header="x-api-key").responses.create(
            model="gpt-fake", input="x"
        )
    with pytest.raises(anthropic.AuthenticationError) as ai:
        await anth(gateway, project="sk-ant-whatever").messages.create(
            model="claude-fake", max_tokens=8, messages=MSGS
        )
    assert assert_anthropic_error(ai.value, 401)["type"] == "authentication_error"
    assert fake.requests == 0
    rows = await gateway.rows()
    assert len(rows) == 3 and {r["error_class"] for r in rows} == {"auth_invalid"}
    assert all(r["project"] is None for r in rows)


async def test_other_projects_model_is_403_in_each_format(gateway, fake, oai, anth):
    with pytest.raises(openai.PermissionDeniedError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-beta", messages=MSGS)
    assert "not allowed" in assert_openai_error(ei.value, 403)["message"]
    with pytest.raises(anthropic.PermissionDeniedError) as ai:
        await anth(gateway, project="beta").messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert assert_anthropic_error(ai.value, 403)["type"] == "permission_error"
    with pytest.raises(openai.NotFoundError):
        await oai(gateway).chat.completions.create(model="no-such-model", messages=MSGS)
    # the beta key reaches beta's own model
    await oai(gateway, project="beta").chat.completions.create(model="gpt-beta", messages=MSGS)
    assert fake.requests == 1
    rows = await gateway.rows()
    assert [(r["project"], r["http_status"]) for r in rows] == [
        ("alpha", 403),
        ("beta", 403),
        ("alpha", 404),
        ("beta", 200),
    ]


async def test_bad_body_is_400_naming_the_field(gateway, oai):
    with pytest.raises(openai.BadRequestError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=-5)
    assert "max_tokens" in assert_openai_error(ei.value, 400)["message"]


def _limits(**cfg):
    from gateway.config import ProjectConfig
    from gateway.limits.local import ProjectLimits

    return ProjectLimits("alpha", ProjectConfig(models=["gpt-fake"], **cfg))


async def test_tpm_rejections_do_not_use_up_rpm():
    from gateway.limits.base import LimitExceeded

    pl = _limits(rpm=5, tpm=100)
    held = await pl.admit(60)
    for _ in range(6):
        with pytest.raises(LimitExceeded) as ei:
            await pl.admit(60)
        assert ei.value.limit == "tpm"
    held.release()
    held.settle(0)
    ok = await pl.admit(10)  # only one request was admitted this minute: rpm has room
    ok.release()


async def test_queue_timeout_and_cancel_refund_rpm_and_tpm():
    from gateway.limits.base import LimitExceeded

    pl = _limits(rpm=2, tpm=100, max_concurrency=1, queue_timeout_s=0.05)
    held = await pl.admit(30)
    with pytest.raises(LimitExceeded) as ei:
        await pl.admit(30)
    assert ei.value.limit == "concurrency"
    waiter = asyncio.create_task(pl.admit(30))
    await asyncio.sleep(0.01)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    held.release()
    held.settle(0)
    ok = await pl.admit(90)  # neither the timed-out nor the cancelled request kept its rpm slot or tokens
    ok.release()
