"""Retries, timeouts and upstream errors, seen through the real SDKs and read back from the ledger."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import anthropic
import openai
import pytest

from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]
SHORT_READ = {"providers": {"oa": {"read_timeout_s": 0.5}, "an": {"read_timeout_s": 0.5}}}


def metric(gw, name: str, **labels) -> float:
    return gw.gw.metrics.registry.get_sample_value(name, labels) or 0.0


async def test_429_then_success_is_retried_and_counted(gateway, fake, oai):
    fake.faults.append(Fault(status=429, retry_after="0"))
    resp = await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert resp.choices[0].message.content
    assert fake.requests == 2
    (row,) = await gateway.rows()
    assert row["status"] == "ok" and row["retries"] == 1
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:]
    labels = {"project": "alpha", "model": "gpt-fake", "reason": "429"}
    assert metric(gateway, "gateway_upstream_retries_total", **labels) == 1


async def test_5xx_retried_until_success(gateway, fake, anth):
    fake.faults.extend([Fault(status=500), Fault(status=503)])
    msg = await anth(gateway).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert msg.content[0].text
    (row,) = await gateway.rows()
    assert row["retries"] == 2 and row["status"] == "ok"


async def test_retries_exhausted_pass_the_upstream_status(gateway, fake, oai):
    fake.faults.extend([Fault(status=503)] * 4)
    with pytest.raises(openai.InternalServerError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.status_code == 503
    assert fake.requests == 4  # first try + 3 retries
    (row,) = await gateway.rows()
    assert (row["status"], row["http_status"], row["retries"]) == ("error", 503, 3)


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_other_4xx_never_retried(gateway, fake, oai, status):
    fake.faults.append(Fault(status=status))
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    # An upstream 401/403 means the gateway's own provider key was refused: a 502, never the client's fault.
    expect = 502 if status in (401, 403) else status
    assert ei.value.status_code == expect
    assert fake.requests == 1
    (row,) = await gateway.rows()
    assert (row["retries"], row["http_status"], row["error_class"]) == (0, expect, f"upstream_{status}")


@pytest.mark.parametrize("status", [401, 403])
async def test_upstream_auth_failure_is_a_502_about_the_gateways_credential(gateway, fake, oai, anth, status):
    fake.faults.append(Fault(status=status))
    with pytest.raises(openai.InternalServerError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    err = ei.value.response.json()["error"]
    assert "gateway's provider credential" in err["message"] and err["type"] == "server_error"
    assert "fake upstream error" not in ei.value.response.text  # the upstream body never passes through
    fake.faults.append(Fault(status=status))
    with pytest.raises(anthropic.InternalServerError) as ai:
        await anth(gateway).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    body = ai.value.response.json()
    assert body["type"] == "error" and "gateway's provider credential" in body["error"]["message"]
    assert "fake upstream error" not in ai.value.response.text
    assert fake.requests == 2


async def test_retry_after_90s_is_not_waited_out(gateway, fake, oai, anth):
    fake.faults.append(Fault(status=429, retry_after="90"))
    t0 = time.perf_counter()
    with pytest.raises(openai.RateLimitError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert time.perf_counter() - t0 < 2
    assert ei.value.response.headers["retry-after"] == "90"
    assert ei.value.body["type"] == "server_error"  # the upstream's OpenAI-shaped body passes through

    fake.faults.append(Fault(status=429, retry_after="90"))
    with pytest.raises(anthropic.RateLimitError) as ai:
        await anth(gateway).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert ai.value.response.headers["retry-after"] == "90"
    assert ai.value.body["type"] == "error"
    assert fake.requests == 2
    rows = await gateway.rows()
    assert [(r["http_status"], r["retries"]) for r in rows] == [(429, 0), (429, 0)]


async def test_retry_after_ms_reaches_the_client_as_plain_seconds(gateway, fake, oai, anth):
    fake.faults.append(Fault(status=429, headers={"retry-after-ms": "90200"}))
    with pytest.raises(openai.RateLimitError) as ei:
        await oai(gateway).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.response.headers["retry-after"] == "91"
    fake.faults.append(Fault(status=503, headers={"retry-after-ms": "61000"}))
    with pytest.raises(anthropic.InternalServerError) as ai:
        await anth(gateway).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert ai.value.response.headers["retry-after"] == "61"
    assert fake.requests == 2  # over max_retry_after_s: handed to the client, not waited out


async def test_stalled_upstream_gives_clean_504(start_gateway, fake, oai, anth):
    gw = await start_gateway(**SHORT_READ)
    fake.faults.append(Fault(stall_after_events=0))  # headers sent, body never finishes
    t0 = time.perf_counter()
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    elapsed = time.perf_counter() - t0
    assert ei.value.status_code == 504 and 0.45 <= elapsed < 3
    assert "read timeout" in ei.value.message

    fake.faults.append(Fault(stall_before_headers=True))
    with pytest.raises(anthropic.APIStatusError) as ai:
        await anth(gw).messages.create(model="claude-fake", max_tokens=8, messages=MSGS, stream=True)
    assert ai.value.status_code == 504
    assert ai.value.body["error"]["type"] == "timeout_error"
    rows = await gw.rows()
    assert [(r["http_status"], r["error_class"]) for r in rows] == [(504, "read_timeout")] * 2


async def test_stream_that_stalls_before_first_event_is_a_clean_504(start_gateway, fake, oai):
    gw = await start_gateway(**SHORT_READ)
    fake.faults.append(Fault(stall_after_events=0))
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS, stream=True)
    assert ei.value.status_code == 504


async def test_mid_stream_stall_ends_with_an_error_event(start_gateway, fake, oai):
    gw = await start_gateway(**SHORT_READ)
    fake.faults.append(Fault(stall_after_events=3))
    got = []
    with pytest.raises(openai.APIError, match="stalled mid-stream"):
        async for chunk in await oai(gw).chat.completions.create(
            model="gpt-fake", messages=MSGS, stream=True
        ):
            got.append(chunk)
    assert len(got) == 3  # what arrived before the stall was passed through, and no retry happened
    assert fake.requests == 1
    (row,) = await gw.rows()
    assert (row["status"], row["error_class"], row["http_status"]) == ("error", "read_timeout", 200)


async def test_slow_first_byte_within_read_timeout_succeeds(start_gateway, fake, anth):
    gw = await start_gateway(**SHORT_READ)
    fake.faults.append(Fault(first_byte_delay_s=0.2))
    msg = await anth(gw).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    assert msg.content[0].text
    (row,) = await gw.rows()
    assert row["status"] == "ok" and row["latency_ms"] >= 200


async def test_dropped_connection_is_retried(gateway, fake, oai):
    fake.faults.append(Fault(drop=True))
    resp = await oai(gateway).responses.create(model="gpt-fake", input="hi")
    assert resp.output_text
    (row,) = await gateway.rows()
    assert row["retries"] == 1 and row["status"] == "ok"


async def test_unreachable_upstream_is_a_502(start_gateway, oai):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    gw = await start_gateway(providers={"oa": {"base_url": f"http://127.0.0.1:{dead}/v1"}})
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.status_code == 502 and "unreachable" in ei.value.message
    (row,) = await gw.rows()
    assert (row["error_class"], row["retries"]) == ("unreachable", 3)


async def test_client_disconnect_cancels_upstream_and_is_recorded(gateway, fake):
    fake.faults.append(Fault(stall_after_events=2))
    body = {"model": "claude-fake", "max_tokens": 8, "messages": MSGS, "stream": True}
    async with aiohttp.ClientSession() as s:
        resp = await s.post(f"{gateway.v1}/messages", json=body, headers={"x-api-key": gateway.keys["alpha"]})
        assert resp.status == 200
        await resp.content.readline()  # something arrived
        resp.close()  # the client goes away mid-stream
    await asyncio.wait_for(fake.cancelled_event.wait(), 5)
    for _ in range(100):
        rows = await gateway.rows()
        if rows:
            break
        await asyncio.sleep(0.02)
    (row,) = rows
    assert (row["status"], row["error_class"]) == ("cancelled", "client_disconnected")
    assert row["input_tokens"] == fake.usage_log[-1][2]  # message_start had arrived
