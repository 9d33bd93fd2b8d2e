"""The real openai and anthropic SDKs through the gateway: each endpoint, stream or not, either auth."""

from __future__ import annotations

import pytest
from pg import DB_BACKENDS

MESSAGES = [{"role": "user", "content": "Draft an acceptance checklist for the paged MLA decode kernel."}]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway of this module runs on SQLite and on PostgreSQL (conftest.start_gateway)."""
    return request.param


@pytest.mark.parametrize("header", ["bearer", "x-api-key"])
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_chat(gateway, fake, oai, anth, header, stream):
    client = oai(gateway, header=header)
    if stream:
        text = ""
        got_usage = []
        async for chunk in await client.chat.completions.create(
            model="gpt-fake", messages=MESSAGES, stream=True
        ):
            if chunk.usage is not None:
                got_usage.append(chunk.usage)
            for choice in chunk.choices:
                text += choice.delta.content or ""
        assert got_usage == []  # the client did not ask for usage: the injected usage chunk is stripped
    else:
        resp = await client.chat.completions.create(model="gpt-fake", messages=MESSAGES)
        text = resp.choices[0].message.content
        assert resp.usage.completion_tokens == fake.usage_log[-1][3]
    assert text.startswith("w1-0")
    seen = fake.seen[-1]
    assert seen.body["model"] == "gpt-upstream"
    if stream:
        assert seen.body["stream_options"] == {"include_usage": True}
    # the client's gateway key never reaches the upstream
    assert gateway.keys["alpha"] not in str(seen.headers)
    (row,) = await gateway.rows()
    assert row["status"] == "ok" and row["project"] == "alpha" and row["stream"] == int(stream)
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:]
    assert row["tokens_estimated"] == 0
    assert row["public_model"] == "gpt-fake" and row["upstream_model"] == "gpt-upstream"
    assert row["upstream_request_id"] == "req_fake_1"


async def test_openai_chat_stream_usage_kept_when_asked(gateway, fake, oai, anth):
    client = oai(gateway)
    usage = None
    stream = await client.chat.completions.create(
        model="gpt-fake", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == fake.usage_log[-1][3]
    (row,) = await gateway.rows()
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:]


@pytest.mark.parametrize("header", ["bearer", "x-api-key"])
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses(gateway, fake, oai, anth, header, stream):
    client = oai(gateway, header=header)
    if stream:
        events = [e async for e in await client.responses.create(model="gpt-fake", input="hi", stream=True)]
        assert events[-1].type == "response.completed"
        text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
        assert events[-1].response.usage.output_tokens == fake.usage_log[-1][3]
    else:
        resp = await client.responses.create(model="gpt-fake", input="hi")
        text = resp.output_text
    assert text.startswith("w1-0")
    (row,) = await gateway.rows()
    assert row["status"] == "ok" and row["endpoint"] == "responses"
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:]


@pytest.mark.parametrize("header", ["x-api-key", "bearer"])
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_messages(gateway, fake, oai, anth, header, stream):
    client = anth(gateway, header=header)
    extra = {"anthropic-beta": "fine-grained-tool-streaming-2025-05-14"}
    if stream:
        async with client.messages.stream(
            model="claude-fake", max_tokens=256, messages=MESSAGES, extra_headers=extra
        ) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
        assert final.usage.output_tokens == fake.usage_log[-1][3]
    else:
        msg = await client.messages.create(
            model="claude-fake", max_tokens=256, messages=MESSAGES, extra_headers=extra
        )
        text = msg.content[0].text
        assert msg.usage.input_tokens == fake.usage_log[-1][2]
    assert text.startswith("w1-0")
    seen = fake.seen[-1]
    assert seen.headers["anthropic-version"] and seen.headers["anthropic-beta"] == extra["anthropic-beta"]
    assert seen.body["model"] == "claude-upstream"
    assert "authorization" not in {k.lower() for k in seen.headers}
    assert gateway.keys["alpha"] not in str(seen.headers)
    (row,) = await gateway.rows()
    assert row["status"] == "ok" and row["endpoint"] == "messages" and row["stream"] == int(stream)
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:]


@pytest.mark.parametrize("header", ["x-api-key", "bearer"])
async def test_anthropic_count_tokens_and_models(gateway, fake, oai, anth, header):
    client = anth(gateway, header=header)
    counted = await client.messages.count_tokens(model="claude-fake", messages=MESSAGES)
    assert counted.input_tokens > 0
    models = [m.id async for m in client.models.list()]
    assert models == ["gpt-fake", "claude-fake"]
    (row,) = await gateway.rows()
    assert row["endpoint"] == "count_tokens" and row["status"] == "ok"


@pytest.mark.parametrize("header", ["bearer", "x-api-key"])
async def test_openai_models(gateway, oai, header):
    client = oai(gateway, header=header)
    assert [m.id async for m in client.models.list()] == ["gpt-fake", "claude-fake"]


async def test_session_and_task_recorded(gateway, fake, oai, anth):
    client = oai(gateway)
    await client.responses.create(
        model="gpt-fake", input="hi", extra_headers={"session-id": "codex-sess-1", "X-Farm-Task": "checklist"}
    )
    await anth(gateway).messages.create(
        model="claude-fake",
        max_tokens=16,
        messages=MESSAGES,
        extra_headers={"X-Claude-Code-Session-Id": "cc-sess-2"},
    )
    rows = await gateway.rows()
    assert [(r["session_id"], r["task"]) for r in rows] == [
        ("codex-sess-1", "checklist"),
        ("cc-sess-2", "alpha-default"),
    ]


async def test_body_over_client_max_size_is_a_413_in_the_callers_format(start_gateway, fake, monkeypatch):
    import aiohttp

    import gateway.http.app

    monkeypatch.setattr(gateway.http.app, "MAX_BODY_BYTES", 2000)
    gw = await start_gateway()
    big = [{"role": "user", "content": "x" * 5000}]
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {gw.keys['alpha']}"}
        body = {"model": "gpt-fake", "messages": big}
        async with s.post(f"{gw.v1}/chat/completions", json=body, headers=headers) as r:
            assert r.status == 413
            err = (await r.json())["error"]
            assert "body" in err["message"] and err["type"] == "invalid_request_error"
        headers = {"x-api-key": gw.keys["alpha"], "anthropic-version": "2023-06-01"}
        body = {"model": "claude-fake", "max_tokens": 8, "messages": big}
        async with s.post(f"{gw.v1}/messages", json=body, headers=headers) as r:
            assert r.status == 413
            data = await r.json()
            assert data["type"] == "error" and data["error"]["type"] == "request_too_large"
    assert fake.requests == 0
    rows = await gw.rows()
    assert [(r["http_status"], r["error_class"]) for r in rows] == [(413, "body_too_large")] * 2


async def test_chat_stream_usage_request_is_appended_to_the_clients_own_bytes(gateway, fake):
    """A chat stream whose client did not ask for usage, on a model whose upstream id is its public name:
    the gateway appends `stream_options` to the body as the client wrote it (no re-encoding), and the
    upstream gets every field of it; the usage chunk it asked for is not passed on."""
    import json

    import aiohttp

    raw = (
        b'{"model": "gpt-beta",\n "stream": true, "temperature": 0.25, "x_extra": {"k": [1, 2.5, null]},'
        b' "messages": [{"role": "user", "content": "caf\\u00e9 \\"quoted\\""}]}\n  \t'
    )
    headers = {"Authorization": f"Bearer {gateway.keys['beta']}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gateway.url}/v1/chat/completions", data=raw, headers=headers) as r:
            assert r.status == 200, await r.text()
            text = (await r.read()).decode()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and all(json.loads(e).get("usage") is None for e in events[:-1])
    seen = fake.seen[-1]
    assert seen.body == {**json.loads(raw), "stream_options": {"include_usage": True}}
    (row,) = await gateway.rows()
    assert (row["input_tokens"], row["output_tokens"]) == fake.usage_log[-1][2:] and not row[
        "tokens_estimated"
    ]
