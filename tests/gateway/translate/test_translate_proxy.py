"""Any client on any model, through real HTTP: the real anthropic and openai SDKs against the gateway, whose
model is served by a fake upstream that is only ever asked in the other wire format (gateway.translate).

conftest's project alpha has ``gpt-fake`` (openai provider, upstream ``gpt-upstream``) and ``claude-fake``
(anthropic provider, upstream ``claude-upstream``)."""

from __future__ import annotations

import json
import logging

import anthropic
import openai
import pytest

from testkit.gateway.fake_upstream import Fault

WEATHER_ARGS = {"city": "Paris", "unit": "celsius"}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
        "required": ["city"],
    },
}
FUNCTION_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": ANTHROPIC_TOOL["input_schema"],
}


def paths(fake) -> list[str]:
    return [s.path for s in fake.seen]


def row_tokens(row: dict) -> tuple[int, int]:
    return row["input_tokens"], row["output_tokens"]


async def _final(api, stream: bool, **kw):
    """The whole answer of an SDK resource (``client.messages``, ``client.responses``), streamed or not."""
    if not stream:
        return await api.create(**kw)
    async with api.stream(**kw) as s:
        final = s.get_final_message if hasattr(s, "get_final_message") else s.get_final_response
        return await final()


# --- Claude Code's path: /v1/messages on a model served by an openai provider -----------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_anthropic_sdk_tool_call_round_trip_on_an_openai_model(gateway, fake, anth, stream):
    client = anth(gateway)
    fake.tool_call = WEATHER_ARGS
    first_turn = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = {"model": "gpt-fake", "max_tokens": 200, "system": "Be brief.", "tools": [ANTHROPIC_TOOL]}
    msg = await _final(client.messages, stream, messages=first_turn, **kw)

    (use,) = msg.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.input == WEATHER_ARGS
    assert use.id.startswith("call_")  # the upstream's call id, kept
    assert msg.stop_reason == "tool_use"
    assert msg.model == "gpt-fake"
    _, _, inp, out = fake.usage_log[-1]
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (inp, out)

    # the upstream was asked in chat format, with the system prompt and the tool as a function
    (seen,) = fake.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "gpt-upstream"
    assert seen.body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert seen.body["tools"][0]["type"] == "function"
    assert seen.body["tools"][0]["function"]["name"] == "get_weather"
    assert "anthropic-version" not in seen.headers and "anthropic-beta" not in seen.headers
    if stream:
        assert seen.body["stream_options"] == {"include_usage": True}

    # second turn: the tool's result goes back as a chat tool message
    fake.tool_call = None
    second_turn = [
        *first_turn,
        {"role": "assistant", "content": [u.model_dump(exclude_none=True) for u in msg.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]},
    ]
    reply = await _final(client.messages, stream, messages=second_turn, **kw)
    assert reply.content[0].type == "text" and reply.content[0].text.startswith("w2-0")
    assert reply.stop_reason == "end_turn"
    assert paths(fake) == ["/v1/chat/completions"] * 2
    sent = fake.seen[1].body["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["tool_calls"][0]["id"] == use.id
    assert json.loads(sent[-2]["tool_calls"][0]["function"]["arguments"]) == WEATHER_ARGS
    assert sent[-1] == {"role": "tool", "tool_call_id": use.id, "content": "18 C"}

    rows = await gateway.rows()
    assert [r["translation"] for r in rows] == ["messages->chat"] * 2
    assert [row_tokens(r) for r in rows] == [tuple(u[2:]) for u in fake.usage_log]
    assert all(r["deployment"] == "oa" and r["upstream_model"] == "gpt-upstream" for r in rows)
    assert not any(r["tokens_estimated"] for r in rows)


async def test_claude_code_beta_header_is_not_sent_to_openai(gateway, fake, anth):
    client = anth(gateway, default_headers={"anthropic-beta": "claude-code-20250219"})
    raw = await client.messages.with_raw_response.create(
        model="gpt-fake", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-farm-model"] == "gpt-fake" and raw.headers["x-farm-deployment"] == "oa"
    (seen,) = fake.seen
    assert not any(h.lower().startswith(("anthropic-", "openai-beta")) for h in seen.headers)


# --- Codex's path: /v1/responses on a model served by an anthropic provider --------------------------
@pytest.mark.parametrize("stream", [False, True])
async def test_openai_responses_tool_call_round_trip_on_an_anthropic_model(gateway, fake, oai, stream):
    client = oai(gateway)
    fake.tool_call = WEATHER_ARGS
    first_input = [{"role": "user", "content": "What is the weather in Paris?"}]
    kw = {"model": "claude-fake", "instructions": "Be brief.", "tools": [FUNCTION_TOOL]}
    resp = await _final(client.responses, stream, input=first_input, **kw)

    (call,) = resp.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == WEATHER_ARGS and call.call_id.startswith("toolu_")
    assert resp.status == "completed"
    _, _, inp, out = fake.usage_log[-1]
    assert (resp.usage.input_tokens, resp.usage.output_tokens) == (inp, out)

    (seen,) = fake.seen
    assert seen.path == "/v1/messages"
    assert seen.body["model"] == "claude-upstream" and seen.body["system"] == "Be brief."
    assert seen.body["tools"][0]["name"] == "get_weather" and "input_schema" in seen.body["tools"][0]
    assert seen.body["max_tokens"] >= 1  # required by Anthropic; the project's default_max_tokens
    assert seen.headers.get("anthropic-version") == "2023-06-01"

    fake.tool_call = None
    second_input = [
        *first_input,
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
    ]
    if stream:
        texts = []
        async with client.responses.stream(input=second_input, **kw) as s:
            async for event in s:
                if event.type == "response.output_text.delta":
                    texts.append(event.delta)
            reply = await s.get_final_response()
        assert "".join(texts) == reply.output_text
    else:
        reply = await client.responses.create(input=second_input, **kw)
    assert reply.output_text.startswith("w2-0")
    assert paths(fake) == ["/v1/messages"] * 2
    sent = fake.seen[1].body["messages"]
    assert sent[-2]["role"] == "assistant" and sent[-2]["content"][0]["type"] == "tool_use"
    assert sent[-2]["content"][0]["input"] == WEATHER_ARGS
    result = sent[-1]["content"][0]
    assert result["type"] == "tool_result" and result["tool_use_id"] == call.call_id

    rows = await gateway.rows()
    assert [r["translation"] for r in rows] == ["responses->messages"] * 2
    assert [row_tokens(r) for r in rows] == [tuple(u[2:]) for u in fake.usage_log]


# --- chat completions -> an anthropic model -----------------------------------------------------------
@pytest.mark.parametrize("include_usage", [False, True])
async def test_chat_stream_on_an_anthropic_model(gateway, fake, oai, include_usage):
    client = oai(gateway)
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    stream = await client.chat.completions.create(
        model="claude-fake",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        stream=True,
        **extra,
    )
    text, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(text) == "w1-0 w1-1 w1-2 w1-3 "
    assert finish == "stop"
    _, _, inp, out = fake.usage_log[-1]
    if include_usage:
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (inp, out)
    else:
        assert usage is None  # not asked for: not sent, though the gateway counted it
    (seen,) = fake.seen
    assert seen.path == "/v1/messages" and seen.body["stream"] is True
    assert seen.body["system"] == "Be brief."
    (row,) = await gateway.rows()
    assert row["translation"] == "chat->messages" and row_tokens(row) == (inp, out)


async def test_chat_whole_on_an_anthropic_model(gateway, fake, oai):
    client = oai(gateway)
    raw = await client.chat.completions.with_raw_response.create(
        model="claude-fake", messages=[{"role": "user", "content": "hi"}], max_tokens=64
    )
    resp = raw.parse()
    assert resp.choices[0].message.content == "w1-0 w1-1 w1-2 w1-3 "
    assert resp.choices[0].finish_reason == "stop" and resp.model == "claude-fake"
    assert (raw.headers["x-farm-model"], raw.headers["x-farm-deployment"]) == ("claude-fake", "an")
    _, _, inp, out = fake.usage_log[-1]
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens) == (inp, out)
    (seen,) = fake.seen
    assert seen.path == "/v1/messages" and seen.body["max_tokens"] == 64
    (row,) = await gateway.rows()
    assert row["translation"] == "chat->messages" and row_tokens(row) == (inp, out)


async def test_native_requests_are_not_translated(gateway, fake, oai):
    client = oai(gateway)
    await client.chat.completions.create(model="gpt-fake", messages=[{"role": "user", "content": "hi"}])
    (row,) = await gateway.rows()
    assert row["translation"] is None
    assert paths(fake) == ["/v1/chat/completions"]


# --- untranslatable features: a 400 naming the field, nothing sent -----------------------------------
async def test_untranslatable_field_is_a_400_in_the_clients_format(start_gateway, fake, oai, anth):
    gateway = await start_gateway(projects={"alpha": {"translation": "strict"}})
    with pytest.raises(openai.BadRequestError) as e:
        await oai(gateway).chat.completions.create(
            model="claude-fake", messages=[{"role": "user", "content": "hi"}], n=2
        )
    assert e.value.status_code == 400 and "n: 2 choices" in e.value.message
    assert "anthropic messages" in e.value.message
    assert e.value.body["type"] == "invalid_request_error"  # OpenAI's error shape

    with pytest.raises(anthropic.BadRequestError) as e2:  # strict: a server tool without an equivalent
        await anth(gateway).messages.create(
            model="gpt-fake",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
        )
    assert e2.value.status_code == 400 and "tools[web_search_20250305]" in e2.value.message
    assert e2.value.body["type"] == "error" and e2.value.body["error"]["type"] == "invalid_request_error"
    assert fake.seen == []
    rows = await gateway.rows()
    assert [(r["http_status"], r["error_class"]) for r in rows] == [(400, "untranslatable")] * 2


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unknown_field_is_dropped_and_reported_by_default(gateway, fake, anth, caplog, stream):
    """Lenient (the default): the request is served without the field, which is named in the x-farm-dropped
    header, the ledger row and a metric by client and field, and logged once."""
    caplog.set_level(logging.WARNING, logger="gateway")
    client = anth(gateway)
    for _ in range(2):
        raw = await client.messages.with_raw_response.create(
            model="gpt-fake",
            max_tokens=10,
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "web_search_20250305", "name": "web_search"}],
            extra_body={"brand_new_field": {"x": 1}},
            stream=stream,
        )
        assert raw.headers["x-farm-dropped"] == "brand_new_field,tools[web_search_20250305]"
        if stream:
            async for _ in await raw.parse():
                pass
    sent = fake.seen[-1].body
    assert "brand_new_field" not in sent and "tools" not in sent  # the upstream got neither
    rows = await gateway.rows()
    assert [r["dropped_fields"] for r in rows] == ["brand_new_field,tools[web_search_20250305]"] * 2
    assert all(r["status"] == "ok" for r in rows)
    metrics = gateway.gw.metrics.registry
    value = metrics.get_sample_value(
        "gateway_translation_dropped_fields_total", {"client": "anthropic-sdk", "field": "brand_new_field"}
    )
    assert value == 2
    logged = [r.getMessage() for r in caplog.records if "translation dropped" in r.getMessage()]
    assert len(logged) == 2 and "'brand_new_field'" in logged[0]  # one line per field, not per request


async def test_upstream_error_of_a_translated_target_is_in_the_clients_format(gateway, fake, anth):
    fake.faults.append(Fault(status=400))
    with pytest.raises(anthropic.BadRequestError) as e:
        await anth(gateway).messages.create(
            model="gpt-fake", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
        )
    assert e.value.body["type"] == "error" and "fake upstream error 400" in e.value.message
    assert paths(fake) == ["/v1/chat/completions"]


# --- a fallback of the other kind ---------------------------------------------------------------------
FALLBACK_MODELS = {  # gpt-fake falls back to a model of the other kind
    "gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream", "fallbacks": ["claude-fake"]},
    "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
    "claude-fake": {"provider": "an", "upstream_model": "claude-upstream"},
}


async def test_fallback_of_the_other_kind_answers_through_translation(start_gateway, fake, anth):
    gw = await start_gateway(models=FALLBACK_MODELS)
    fake.faults.append(Fault(status=503))
    # a messages client on gpt-fake: the primary is translated to chat, the fallback is native again
    raw = await anth(gw).messages.with_raw_response.create(
        model="gpt-fake", max_tokens=10, messages=[{"role": "user", "content": "hi"}]
    )
    msg = await raw.parse()
    assert msg.content[0].text.startswith("w2-0")
    assert (raw.headers["x-farm-model"], raw.headers["x-farm-deployment"]) == ("claude-fake", "an")
    assert paths(fake) == ["/v1/chat/completions", "/v1/messages"]
    (row,) = await gw.rows()
    assert row["fallback_from"] == "gpt-fake" and row["deployment"] == "an" and row["translation"] is None
    assert row_tokens(row) == tuple(fake.usage_log[-1][2:])


async def test_fallback_to_the_other_kind_is_translated(start_gateway, fake, oai):
    gw = await start_gateway(models=FALLBACK_MODELS)
    fake.faults.append(Fault(status=429, retry_after="0"))
    stream = await oai(gw).chat.completions.create(
        model="gpt-fake", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(text) == "w2-0 w2-1 w2-2 w2-3 w2-4 "
    assert paths(fake) == ["/v1/chat/completions", "/v1/messages"]
    (row,) = await gw.rows()
    assert (row["fallback_from"], row["deployment"], row["translation"]) == (
        "gpt-fake",
        "an",
        "chat->messages",
    )
    assert row_tokens(row) == tuple(fake.usage_log[-1][2:]) and row["retries"] == 1


# --- count_tokens ---------------------------------------------------------------------------------------
async def test_count_tokens_on_an_openai_model_is_answered_locally(gateway, fake, anth):
    client = anth(gateway)
    count = await client.messages.count_tokens(
        model="gpt-fake", messages=[{"role": "user", "content": "hello " * 40}], tools=[ANTHROPIC_TOOL]
    )
    small = await client.messages.count_tokens(model="gpt-fake", messages=[{"role": "user", "content": "x"}])
    assert count.input_tokens > small.input_tokens >= 1
    assert fake.seen == []
    rows = await gateway.rows()
    assert [(r["endpoint"], r["translation"], r["http_status"]) for r in rows] == [
        ("count_tokens", "messages->chat", 200)
    ] * 2


# --- effort hints between providers (gateway.translate.policy.EFFORT) ---------------------------------------


def _effort_models(effort: bool) -> dict:
    return {
        "gpt-fake": {"deployments": [{"name": "oa", "provider": "oa", "upstream_model": "gpt-upstream",
                                      "effort": effort}]},
        "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
        "claude-fake": {"deployments": [{"name": "an", "provider": "an", "upstream_model": "claude-upstream",
                                         "effort": effort}]},
    }  # fmt: skip


@pytest.mark.parametrize("effort", [True, False])
async def test_an_effort_hint_is_mapped_only_to_a_deployment_that_takes_one(start_gateway, fake, anth, oai,
                                                                           effort):  # fmt: skip
    """Claude Code's output_config.effort reaches a chat model flagged ``effort: true`` as
    reasoning_effort; an openai client's reasoning_effort an Anthropic one as output_config.effort (the
    nearest word). Without the flag both are dropped: a chat model without reasoning refuses the field."""
    gw = await start_gateway(models=_effort_models(effort))
    await anth(gw).messages.create(
        model="gpt-fake", max_tokens=10, messages=[{"role": "user", "content": "hi"}],
        extra_body={"output_config": {"effort": "max"}},
    )  # fmt: skip
    await oai(gw).chat.completions.create(
        model="claude-fake", messages=[{"role": "user", "content": "hi"}], reasoning_effort="minimal"
    )
    await oai(gw).responses.create(model="claude-fake", input="hi", reasoning={"effort": "high"})
    to_chat, to_anthropic, from_responses = (s.body for s in fake.seen)
    if effort:
        assert to_chat["reasoning_effort"] == "high"  # max: the highest chat has
        assert to_anthropic["output_config"] == {"effort": "low"}  # minimal: the lowest Anthropic has
        assert from_responses["output_config"] == {"effort": "high"}
    else:
        assert "reasoning_effort" not in to_chat and "output_config" not in to_anthropic
        assert "output_config" not in from_responses
    rows = await gw.rows()
    assert all(r["status"] == "ok" and not r["dropped_fields"] for r in rows)  # a hint, not an unknown field
