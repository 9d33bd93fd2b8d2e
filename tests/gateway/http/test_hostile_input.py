"""Inputs a hostile or careless client sends: each is a clear 4xx in the caller's API format, one log
line, and the gateway keeps serving (seen: RecursionError, non-latin-1 headers and bad gzip gave 500s;
unknown routes gave aiohttp's plain text)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging

import aiohttp
import openai
import pytest
from rawhttp import send_raw

from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]


async def raw_request(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request written byte for byte (header values the client libraries would refuse)."""
    return await send_raw(port, head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


def _openai_error(payload: bytes) -> dict:
    body = json.loads(payload)
    assert set(body) == {"error"} and body["error"]["message"], body
    return body["error"]


def _anthropic_error(payload: bytes) -> dict:
    body = json.loads(payload)
    assert body["type"] == "error" and body["error"]["message"], body
    return body["error"]


async def _still_serving(gw, oai) -> None:
    r = await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert r.choices[0].message.content


async def test_deeply_nested_json_is_a_400(gateway, oai, caplog):
    key = gateway.keys["alpha"]
    body = b"[" * 100_000 + b"]" * 100_000
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{gateway.v1}/chat/completions", data=body, headers={"Authorization": f"Bearer {key}"}
        ) as r:
            assert r.status == 400
            err = _openai_error(await r.read())
    assert "nested" in err["message"]
    assert "Traceback" not in caplog.text
    await _still_serving(gateway, oai)


@pytest.mark.parametrize("name", ["anthropic-beta", "openai-beta"])
async def test_non_latin1_forwarded_header_is_a_400_naming_it(gateway, fake, oai, name):
    key = gateway.keys["alpha"].encode()
    path, model = (
        (b"/v1/messages", "claude-fake")
        if name == "anthropic-beta"
        else (b"/v1/chat/completions", "gpt-fake")
    )
    body = json.dumps({"model": model, "max_tokens": 5, "messages": MSGS}).encode()
    head = (
        b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"x-api-key: " + key + b"\r\n" + name.encode() + b": \xce\xb2eta-\xe2\x98\x83\r\n"
    )
    status, headers, payload = await raw_request(gateway.port, head, body)
    assert status == 400
    err = _anthropic_error(payload) if name == "anthropic-beta" else _openai_error(payload)
    assert name in err["message"]
    assert fake.requests == 0
    await _still_serving(gateway, oai)


async def test_gzip_header_with_a_body_that_is_not_gzip_is_a_400(gateway, fake, oai):
    key = gateway.keys["alpha"]
    async with aiohttp.ClientSession() as s:
        hdrs = {
            "Authorization": f"Bearer {key}",
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        }
        body = json.dumps({"model": "gpt-fake", "messages": MSGS}).encode()
        async with s.post(f"{gateway.v1}/chat/completions", data=body, headers=hdrs) as r:
            assert r.status == 400, await r.text()
            err = _openai_error(await r.read())
            assert "gzip" in err["message"]
        # a real gzip body is read
        async with s.post(f"{gateway.v1}/chat/completions", data=gzip.compress(body), headers=hdrs) as r:
            assert r.status == 200, await r.text()
    assert fake.requests == 1


@pytest.mark.parametrize(
    ("method", "path", "status", "style"),
    [
        ("POST", "/v1/nope", 404, "openai"),
        ("GET", "/v1/chat/completions", 405, "openai"),
        ("GET", "/v1/messages", 405, "anthropic"),
        ("DELETE", "/v1/models", 405, "openai"),
        ("POST", "/v1/messages/batches", 404, "anthropic"),
    ],
)
async def test_unknown_paths_and_methods_answer_json_in_the_callers_format(
    gateway, method, path, status, style
):
    async with aiohttp.ClientSession() as s:
        async with s.request(method, gateway.url + path) as r:
            assert r.status == status
            assert r.content_type == "application/json"
            payload = await r.read()
            if status == 405:
                assert r.headers["Allow"]
    err = _anthropic_error(payload) if style == "anthropic" else _openai_error(payload)
    assert path in err["message"]


async def test_malformed_http_logs_no_traceback(gateway, oai, caplog):
    caplog.set_level(logging.DEBUG)
    status, _, _ = await raw_request(
        gateway.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nBad Header\r\n"
    )
    assert status == 400
    body = json.dumps({"model": "gpt-fake", "messages": MSGS}).encode()
    status, _, payload = await raw_request(
        gateway.port,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nonsense\r\n",
        body,
    )
    assert status == 401
    _openai_error(payload)
    assert "Traceback" not in caplog.text
    await _still_serving(gateway, oai)


async def test_latin1_task_header_is_served_and_recorded(gateway, fake, oai):
    key = gateway.keys["alpha"].encode()
    body = json.dumps({"model": "gpt-fake", "messages": MSGS}).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + key + b"\r\nX-Farm-Task: caf\xe9-review\r\n"
    )
    status, _, payload = await raw_request(gateway.port, head, body)
    assert status == 200, payload
    await _still_serving(gateway, oai)
    rows = await gateway.rows()
    assert [r["task"] for r in rows] == ["caf\ufffd-review", "alpha-default"]


async def test_one_sdk_call_costs_at_most_max_retries_plus_one_upstream_attempts(gateway, fake, oai, anth):
    """Seen: every attempt answered 429 with Retry-After: 0 gave 12 upstream POSTs for one SDK call."""
    max_retries = gateway.gw.settings.retry.max_retries
    for _ in range(50):
        fake.faults.append(Fault(status=429, retry_after="0"))
    client = openai.AsyncOpenAI(base_url=gateway.v1, api_key=gateway.keys["alpha"], max_retries=2)
    try:
        with pytest.raises(openai.RateLimitError) as ei:
            await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    finally:
        await client.close()
    assert fake.requests == max_retries + 1
    assert ei.value.response.headers["x-should-retry"] == "false"
    assert int(ei.value.response.headers["Retry-After"]) >= 1
    fake.faults.clear()


async def test_retry_after_zero_without_gateway_retries_is_at_least_one_second(start_gateway, fake, oai):
    gw = await start_gateway(retry={"max_retries": 0})
    fake.faults.append(Fault(status=429, retry_after="0"))
    with pytest.raises(openai.RateLimitError) as ei:
        await oai(gw).chat.completions.create(model="gpt-fake", messages=MSGS)
    assert ei.value.response.headers["Retry-After"] == "1"
    assert "x-should-retry" not in ei.value.response.headers


async def test_responses_stream_failure_ends_with_typed_events(start_gateway, fake, oai):
    """Seen: the error event had no ``type``, so Codex showed "stream closed before response.completed"."""
    gw = await start_gateway(providers={"oa": {"read_timeout_s": 0.3}})
    fake.faults.append(Fault(stall_after_events=2))
    events = []
    stream = await oai(gw).responses.create(model="gpt-fake", input="hi", stream=True)
    async for ev in stream:
        events.append(ev)
    types = [e.type for e in events]
    assert types[-2:] == ["error", "response.failed"], types
    assert "stalled mid-stream" in events[-1].response.error.message
    assert fake.requests == 1


async def test_daily_budget_overshoot_is_bounded_by_one_request(start_gateway, fake, oai):
    """Many requests in flight at once may not all pass a budget check made before any of them settles."""
    gw = await start_gateway(projects={"alpha": {"daily_token_budget": 300, "max_concurrency": 40}})
    fake.latency_s = 0.2
    client = oai(gw)

    async def one():
        try:
            await client.chat.completions.create(model="gpt-fake", messages=MSGS, max_tokens=20)
            return True
        except openai.RateLimitError as e:
            assert e.response.headers["x-farm-limit"] == "daily_budget"
            return False

    results = await asyncio.gather(*(one() for _ in range(30)))
    fake.latency_s = 0.0
    rows = [r for r in await gw.rows() if r["status"] == "ok"]
    used = sum(r["input_tokens"] + r["output_tokens"] for r in rows)
    assert sum(results) == len(rows) < 30
    # each reservation is its input estimate + max_tokens; the overshoot is at most one request's usage
    assert used <= 300 + max(r["input_tokens"] + r["output_tokens"] for r in rows) + 20


async def test_anthropic_stream_cut_before_message_delta_has_its_output_estimated(start_gateway, fake, anth):
    gw = await start_gateway(providers={"an": {"read_timeout_s": 0.3}})
    fake.faults.append(Fault(stall_after_events=6))  # message_start, block start, ping, 3 text deltas
    client = anth(gw)
    with pytest.raises(Exception, match="stalled mid-stream"):
        async with client.messages.stream(model="claude-fake", max_tokens=64, messages=MSGS) as s:
            async for _ in s.text_stream:
                pass
    (row,) = await gw.rows()
    assert row["status"] == "error" and row["error_class"] == "read_timeout"
    # message_start said output_tokens 1 (a placeholder); what was relayed is estimated instead
    assert row["output_tokens"] >= 1 and row["tokens_estimated"] == 1
    assert row["input_tokens"] == fake.usage_log[-1][2]


async def test_an_unreachable_key_store_is_a_503_not_a_500(gateway, oai, caplog, tmp_path):
    """Seen: while the database was down, a key not looked up in the last second got a 500. A key verified
    lately is served from the last known good (gateway.store.keys); any other gets a 503 with Retry-After."""
    from gateway.store.db import create_engine

    gw = gateway.gw
    unseen, _ = await gw.keys.create("alpha", "never used")
    await _still_serving(gateway, oai)  # the project's key, verified by the database
    real = gw.keys._engine
    gw.keys._engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/missing-dir/nothing/keys.db")
    gw.keys._cache_ttl = 0  # every request asks the store
    try:
        with pytest.raises(openai.APIStatusError) as ei:
            await oai(gateway, project=unseen).chat.completions.create(model="gpt-fake", messages=MSGS)
        assert ei.value.status_code == 503
        assert "key store is unavailable" in ei.value.message
        assert ei.value.response.headers["Retry-After"] == "1"
        assert "Traceback" not in caplog.text
        await _still_serving(gateway, oai)  # the key verified a moment ago: the last known good
        assert gw.keys.stale_served >= 1
    finally:
        await gw.keys._engine.dispose()
        gw.keys._engine = real
    await _still_serving(gateway, oai)


async def test_a_request_nested_nearly_as_deep_as_the_parser_allows_is_a_400_when_translated(gateway, fake):
    """Seen: a tool_use input 990 levels deep parsed (the JSON parser allows 1024), then re-encoding it for
    an OpenAI model hit Python's recursion limit: a 500."""
    deep = b"[" * 990 + b"]" * 990
    body = (
        b'{"model":"gpt-fake","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"tool_use",'
        b'"id":"t","name":"f","input":{"x":' + deep + b'}}]},{"role":"user","content":[{"type":"tool_result",'
        b'"tool_use_id":"t","content":"ok"}]}]}'
    )
    hdrs = {"x-api-key": gateway.keys["alpha"], "anthropic-version": "2023-06-01"}
    hdrs["Content-Type"] = "application/json"
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gateway.url}/v1/messages", data=body, headers=hdrs) as r:
            assert r.status == 400, await r.text()
            err = _anthropic_error(await r.read())
    assert "nested too deeply" in err["message"]
    assert fake.requests == 0
