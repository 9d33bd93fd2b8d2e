"""Whole requests, answers and errors across the three wire formats (gateway.translate).

Golden files (tests/gateway/golden/translate/*.json) hold {kind, src, dst, kwargs, input, expected}:
realistic Claude Code and Codex CLI requests, chat requests, and the answers back, compared exactly.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from anthropic.types import Message
from openai.types.chat import ChatCompletion
from openai.types.responses import Response

from gateway.errors import BadRequest
from gateway.translate import (
    DROPPED,
    chat,
    messages,
    responses,
    translate_error,
    translate_request,
    translate_response,
)
from gateway.translate.ir import Text, ToolCall, ToolResult
from gateway.translate.policy import TOP_LEVEL

GOLDEN = Path(__file__).parents[1] / "golden" / "translate"
CASES = sorted(GOLDEN.glob("*.json"))
PARSERS = {
    "chat": chat.parse_request,
    "responses": responses.parse_request,
    "messages": messages.parse_request,
}
SDK_MODELS = {"chat": ChatCompletion, "responses": Response, "messages": Message}


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_golden(path):
    case = json.loads(path.read_text())
    fn = translate_request if case["kind"] == "request" else translate_response
    before = copy.deepcopy(case["input"])
    assert fn(case["input"], case["src"], case["dst"], **case["kwargs"]) == case["expected"]
    assert case["input"] == before  # the caller's body is not modified
    if case["kind"] == "response":  # and the official SDK reads the answer
        SDK_MODELS[case["dst"]].model_validate(case["expected"])


def test_golden_set_covers_the_clients():
    names = {p.stem for p in CASES}
    assert {"request_claude_code_to_chat", "request_codex_to_messages", "request_chat_to_messages"} <= names
    assert {"response_chat_to_messages", "response_messages_to_responses"} <= names


def _meaning(body: dict, fmt: str):
    """What a request means, independent of spelling: one system text, consecutive turns of one role
    merged, assistant text joined, tool arguments parsed, tool error flags ignored (dropped towards
    OpenAI on purpose)."""
    req = PARSERS[fmt](body, "chat" if fmt != "chat" else "messages")
    system = "\n\n".join(p.text for m in req.messages if m.role == "system" for p in m.parts)
    turns: list[list] = []
    for m in req.messages:
        if m.role == "system":
            continue
        role = "user" if m.role == "tool" else m.role
        if not turns or turns[-1][0] != role:
            turns.append([role, []])
        for p in m.parts:
            if isinstance(p, ToolCall):
                turns[-1][1].append(("call", p.id, p.name, json.loads(p.arguments)))
            elif isinstance(p, ToolResult):
                turns[-1][1].append(("result", p.call_id, [getattr(c, "text", c) for c in p.content]))
            elif (
                isinstance(p, Text) and role == "assistant" and turns[-1][1] and turns[-1][1][-1][0] == "text"
            ):
                turns[-1][1][-1] = ("text", turns[-1][1][-1][1] + p.text)
            else:
                turns[-1][1].append(("text", p.text) if isinstance(p, Text) else ("image", p.url))
    return system, turns, req.tools, req.tool_choice, req.tool_name, req.max_tokens, req.stream


@pytest.mark.parametrize(
    "name,via",
    [
        ("request_chat_to_messages", "messages"),
        ("request_claude_code_to_chat", "chat"),
        ("request_claude_code_to_chat", "responses"),
        ("request_codex_to_messages", "chat"),
    ],
)
def test_request_round_trip_keeps_the_meaning(name, via):
    case = json.loads((GOLDEN / f"{name}.json").read_text())
    src, body = case["src"], case["input"]
    if src == "responses":  # reasoning items are dropped on purpose (policy.DROPPED)
        body = {**body, "input": [i for i in body["input"] if i.get("type") != "reasoning"]}
    if src == "chat":  # one-way spellings: parallel_tool_calls survives, stop cannot cross responses
        body = {k: v for k, v in body.items() if k not in ("stop",)} if via == "responses" else body
    there = translate_request(body, src, via, upstream_model="x", default_max_tokens=32000)
    back = translate_request(there, via, src, upstream_model="x", default_max_tokens=32000)
    assert _meaning(back, src) == _meaning(body, src)


@pytest.mark.parametrize(
    "src,via",
    [(s, v) for s in ("chat", "responses", "messages") for v in ("chat", "responses", "messages") if s != v],
)
def test_response_round_trip_keeps_text_tool_calls_and_usage(src, via):
    answer = translate_response(
        json.loads((GOLDEN / "response_chat_to_messages.json").read_text())["input"],
        "chat",
        src,
        public_model="m",
    )
    there = translate_response(answer, src, via, public_model="m")
    back = translate_response(there, via, src, public_model="m")
    parse = {
        "chat": chat.parse_response,
        "responses": responses.parse_response,
        "messages": messages.parse_response,
    }
    a, b = parse[src](answer), parse[src](back)
    assert b.parts == a.parts
    assert b.stop == a.stop
    assert (b.usage.input, b.usage.output, b.usage.cached) == (a.usage.input, a.usage.output, a.usage.cached)


def test_cached_tokens_convert_both_ways():
    claude = {
        "id": "msg_1",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {
            "input_tokens": 10,
            "cache_read_input_tokens": 90,
            "cache_creation_input_tokens": 5,
            "output_tokens": 3,
        },
    }
    as_chat = translate_response(claude, "messages", "chat", public_model="m", created=1)
    assert as_chat["usage"]["prompt_tokens"] == 105
    assert as_chat["usage"]["prompt_tokens_details"]["cached_tokens"] == 90
    back = translate_response(as_chat, "chat", "messages", public_model="m")
    assert back["usage"] == claude["usage"] | {"output_tokens": 3}


@pytest.mark.parametrize(
    "finish,reason",
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ],
)
def test_stop_reasons(finish, reason):
    body = {
        "id": "chatcmpl-1",
        "created": 1,
        "choices": [{"message": {"content": "x"}, "finish_reason": finish}],
    }
    assert translate_response(body, "chat", "messages", public_model="m")["stop_reason"] == reason
    resp = translate_response(body, "chat", "responses", public_model="m")
    if finish == "length":
        assert (resp["status"], resp["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    elif finish == "content_filter":
        assert resp["incomplete_details"] == {"reason": "content_filter"}
    else:
        assert resp["status"] == "completed"
    claude = {"id": "msg_1", "content": [{"type": "text", "text": "x"}], "stop_reason": reason}
    assert (
        translate_response(claude, "messages", "chat", public_model="m")["choices"][0]["finish_reason"]
        == finish
    )


def test_ids_get_the_target_prefix():
    body = {"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}]}  # no id at all
    assert translate_response(body, "chat", "messages", public_model="m")["id"].startswith("msg_")
    assert translate_response(body, "chat", "responses", public_model="m")["id"].startswith("resp_")
    claude = {"id": "msg_abc", "content": [], "stop_reason": "end_turn"}
    assert translate_response(claude, "messages", "chat", public_model="m", created=1)["id"] == "chatcmpl-abc"


def test_default_max_tokens_for_anthropic():
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert (
        translate_request(body, "chat", "messages", upstream_model="c", default_max_tokens=777)["max_tokens"]
        == 777
    )
    body["max_tokens"] = 5
    assert (
        translate_request(body, "chat", "messages", upstream_model="c", default_max_tokens=777)["max_tokens"]
        == 5
    )


def test_same_format_only_renames_the_model_and_asks_for_usage():
    body = {"model": "pub", "stream": True, "messages": [{"role": "user", "content": "hi"}], "seed": 3}
    out = translate_request(body, "chat", "chat", upstream_model="up")
    assert out == {**body, "model": "up", "stream_options": {"include_usage": True}}


def test_claude_code_thinking_and_cache_control_are_dropped_not_refused():
    case = json.loads((GOLDEN / "request_claude_code_to_chat.json").read_text())
    out = json.dumps(translate_request(case["input"], "messages", "chat", upstream_model="x"))
    assert "cache_control" not in out and "thinking" not in out and "budget_tokens" not in out


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
RESP = {"model": "m", "input": "hi"}
MSGS = {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
UNTRANSLATABLE = [
    ("chat", "messages", {**CHAT, "n": 2}, "n: 2 choices"),
    ("chat", "responses", {**CHAT, "n": 3}, "n: 3 choices"),
    ("chat", "messages", {**CHAT, "logprobs": True}, "logprobs"),
    ("chat", "messages", {**CHAT, "top_logprobs": 3}, "top_logprobs"),
    ("chat", "messages", {**CHAT, "seed": 42}, "seed"),
    ("chat", "messages", {**CHAT, "frequency_penalty": 0.5}, "frequency_penalty"),
    ("chat", "messages", {**CHAT, "logit_bias": {"50256": -100}}, "logit_bias"),
    ("chat", "messages", {**CHAT, "modalities": ["text", "audio"], "audio": {"voice": "alloy"}}, "audio"),
    ("chat", "messages", {**CHAT, "response_format": {"type": "json_object"}}, "response_format"),
    (
        "chat",
        "messages",
        {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
        "response_format",
    ),
    ("chat", "responses", {**CHAT, "stop": ["END"]}, "stop"),
    ("messages", "responses", {**MSGS, "stop_sequences": ["END"]}, "stop_sequences"),
    (
        "chat",
        "messages",
        {
            **CHAT,
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "input_audio", "input_audio": {"data": "x", "format": "wav"}}],
                }
            ],
        },
        "messages[0].content[0].type",
    ),
    ("chat", "messages", {**CHAT, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
    ("responses", "messages", {**RESP, "previous_response_id": "resp_1"}, "previous_response_id"),
    ("responses", "chat", {**RESP, "conversation": "conv_1"}, "conversation"),
    ("responses", "messages", {**RESP, "background": True}, "background"),
    ("responses", "messages", {**RESP, "text": {"format": {"type": "json_object"}}}, "response_format"),
    ("responses", "messages", {**RESP, "include": ["message.output_text.logprobs"]}, "include"),
    ("responses", "messages", {**RESP, "top_logprobs": 2}, "top_logprobs"),
    ("responses", "messages", {**RESP, "truncation": "auto"}, "truncation"),
    ("responses", "messages", {**RESP, "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    (
        "responses",
        "chat",
        {
            **RESP,
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}
            ],
        },
        "input[0].content[0].type",
    ),
    ("messages", "chat", {**MSGS, "top_k": 5}, "top_k"),
    (
        "messages",
        "chat",
        {
            **MSGS,
            "messages": [{"role": "user", "content": [{"type": "document", "source": {"type": "base64"}}]}],
        },
        "messages[0].content[0].type",
    ),
    (
        "messages",
        "chat",
        {
            **MSGS,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [
                                {
                                    "type": "image",
                                    "source": {"type": "base64", "media_type": "image/png", "data": "x"},
                                }
                            ],
                        }
                    ],
                }
            ],
        },
        "tool result t",
    ),
]


# Fields and tools the gateway does not know or cannot serve (server tools): dropped and reported, or refused
# by name in strict mode (gateway.translate.policy)
UNKNOWN = [
    ("responses", "messages", {**RESP, "tools": [{"type": "web_search"}]}, "tools[web_search]"),
    (
        "responses",
        "chat",
        {**RESP, "tools": [{"type": "file_search", "vector_store_ids": ["v"]}]},
        "tools[file_search]",
    ),
    (
        "responses",
        "messages",
        {**RESP, "tools": [{"type": "computer_use_preview"}]},
        "tools[computer_use_preview]",
    ),
    (
        "messages",
        "chat",
        {**MSGS, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "tools[web_search_20250305]",
    ),
    ("messages", "chat", {**MSGS, "mcp_servers": [{"url": "x"}]}, "mcp_servers"),
    ("chat", "messages", {**CHAT, "brand_new_field": 1}, "brand_new_field"),
    (
        "messages",
        "responses",
        {**MSGS, "output_config": {"effort": "high", "format": {}}},
        "output_config.format",
    ),
    ("responses", "chat", {**RESP, "brand_new_field": {"a": 1}}, "brand_new_field"),
    ("chat", "messages", {**CHAT, "web_search_options": {}}, "web_search_options"),
]


@pytest.mark.parametrize("src,dst,body,field", UNKNOWN, ids=[f"{c[0]}-{c[3]}" for c in UNKNOWN])
def test_an_unknown_field_is_dropped_and_reported_or_refused_when_strict(src, dst, body, field):
    dropped: list[str] = []
    out = translate_request(body, src, dst, upstream_model="x", dropped=dropped)
    assert dropped == [field]
    top = field.split("[")[0].split(".")[0]
    assert top == "tools" or top not in out
    with pytest.raises(BadRequest) as e:
        translate_request(body, src, dst, upstream_model="x", strict=True)
    assert e.value.status == 400 and e.value.error_class == "untranslatable"
    assert e.value.message.startswith(field) and "cannot be translated to" in e.value.message


@pytest.mark.parametrize("src,dst,body,field", UNTRANSLATABLE, ids=[f"{c[0]}-{c[3]}" for c in UNTRANSLATABLE])
def test_untranslatable_feature_is_a_400_naming_the_field(src, dst, body, field):
    with pytest.raises(BadRequest) as e:
        translate_request(body, src, dst, upstream_model="x")
    assert e.value.status == 400 and e.value.error_class == "untranslatable"
    assert e.value.message.startswith(field) or field in e.value.message
    assert "cannot be translated to" in e.value.message


def test_n_message_reads_well():
    with pytest.raises(BadRequest) as e:
        translate_request({**CHAT, "n": 2}, "chat", "messages", upstream_model="x")
    assert e.value.message == "n: 2 choices cannot be translated to anthropic messages"


def test_malformed_request_is_a_400_naming_the_field():
    with pytest.raises(BadRequest) as e:
        translate_request({"model": "m", "messages": "hi"}, "chat", "messages", upstream_model="x")
    assert "messages" in e.value.message and e.value.error_class == "bad_request"
    bad_args = {
        **CHAT,
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}
                ],
            }
        ],
    }
    with pytest.raises(BadRequest, match="not valid JSON"):
        translate_request(bad_args, "chat", "messages", upstream_model="x")


def test_every_dropped_top_level_field_is_in_the_one_table():
    """Codex and Claude Code hints go through; each one is documented with a reason."""
    assert all(d.reason for d in DROPPED)
    for fmt, fields in TOP_LEVEL.items():
        for f in fields:
            assert any(d.field == f and d.src in (fmt, "*") for d in DROPPED)
    codex = {
        **RESP,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k",
        "reasoning": {"effort": "high", "summary": "auto"},
        "parallel_tool_calls": True,
        "metadata": {"a": "b"},
    }
    out = translate_request(codex, "responses", "messages", upstream_model="c")
    assert set(out) == {"model", "messages", "max_tokens"}
    to_chat = translate_request(codex, "responses", "chat", upstream_model="g")
    assert to_chat["reasoning_effort"] == "high"


def test_tool_choice_mapping():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for choice, expected in [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ({"type": "function", "function": {"name": "f"}}, {"type": "tool", "name": "f"}),
    ]:
        out = translate_request(
            {**CHAT, "tools": tools, "tool_choice": choice}, "chat", "messages", upstream_model="c"
        )
        assert out["tool_choice"] == expected
        back = translate_request(out, "messages", "chat", upstream_model="g")
        assert back["tool_choice"] == choice
        resp = translate_request(out, "messages", "responses", upstream_model="g")
        assert resp["tool_choice"] == (
            choice if isinstance(choice, str) else {"type": "function", "name": "f"}
        )
        assert resp["tools"][0]["strict"] is False


@pytest.mark.parametrize(
    "src,body,status,dst,expected",
    [
        (
            "messages",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            529,
            "chat",
            {"error": {"message": "Overloaded", "type": "server_error", "param": None, "code": None}},
        ),
        (
            "chat",
            {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}},
            429,
            "messages",
            {"type": "error", "error": {"type": "rate_limit_error", "message": "Rate limit reached"}},
        ),
        (
            "responses",
            {"error": {"message": "bad input", "type": "invalid_request_error", "code": None}},
            400,
            "messages",
            {"type": "error", "error": {"type": "invalid_request_error", "message": "bad input"}},
        ),
        (
            "chat",
            b"<html>502 Bad Gateway</html>",
            502,
            "messages",
            {"type": "error", "error": {"type": "api_error", "message": "<html>502 Bad Gateway</html>"}},
        ),
        (
            "messages",
            None,
            503,
            "responses",
            {
                "error": {
                    "message": "upstream returned HTTP 503",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            },
        ),
    ],
)
def test_translate_error(src, body, status, dst, expected):
    assert translate_error(body, src, dst, status=status) == expected


def test_what_claude_code_and_codex_send_translates_without_a_refusal():
    """Seen: Claude Code on a chat model refused for output_config, then for a system message in its
    conversation; Codex on an Anthropic model refused for client_metadata. Hints are dropped by the policy
    table (not reported), a system message anywhere in the conversation is kept in its place."""
    claude_code = {
        **MSGS,
        "output_config": {"effort": "medium"},
        "messages": [
            {"role": "user", "content": "read a.txt"},
            {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "now"},
        ],
        "tools": [{"name": "Read", "input_schema": {"type": "object"}, "defer_loading": True}],
    }
    for dst in ("chat", "responses"):
        dropped: list[str] = []
        out = translate_request(claude_code, "messages", dst, upstream_model="x", dropped=dropped)
        assert dropped == [] and "output_config" not in out
        turns = out["messages"] if dst == "chat" else out["input"]
        system = "system" if dst == "chat" else "developer"  # the Responses API's name for it
        assert [t["role"] for t in turns][-3:] == ["user", system, "user"]
        assert "defer_loading" not in json.dumps(out)
    codex = {**RESP, "client_metadata": {"x-codex-turn": "1"}, "store": False}
    for dst in ("chat", "messages"):
        dropped = []
        out = translate_request(codex, "responses", dst, upstream_model="x", dropped=dropped)
        assert dropped == [] and "client_metadata" not in out


def test_the_client_label_comes_from_the_user_agent():
    from gateway.core.metrics import client_label

    assert client_label("claude-cli/2.1.3 (external, cli)") == "claude-code"
    assert client_label("codex_cli_rs/0.17.0 (Debian 12; x86_64) xterm") == "codex"
    assert client_label("AsyncOpenAI/Python 1.99.1") == "openai-sdk"
    assert client_label("AsyncAnthropic/Python 0.49.0") == "anthropic-sdk"
    assert client_label("curl/8.5.0") == client_label(None) == "other"


CODEX_NAMESPACED = {
    "model": "m",
    "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "spawn one"}]},
        {"type": "function_call", "call_id": "call_1", "name": "spawn_agent", "namespace": "collaboration",
         "arguments": '{"message": "a"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "spawned"},
    ],
    "tools": [{"type": "namespace", "name": "collaboration", "description": "agents", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawns an agent.",
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}},
    ]}],
}  # fmt: skip


@pytest.mark.parametrize("dst", ["chat", "messages"])
def test_codex_namespace_tools_travel_flat_and_come_back_split(dst):
    """Seen: Codex on an Anthropic model refused for tools of type namespace."""
    from gateway.translate.namespaces import tool_names

    dropped: list[str] = []
    out = translate_request(CODEX_NAMESPACED, "responses", dst, upstream_model="x", dropped=dropped)
    assert dropped == []
    if dst == "messages":
        assert [t["name"] for t in out["tools"]] == ["collaboration__spawn_agent"]
        (use,) = [b for m in out["messages"] if isinstance(m["content"], list) for b in m["content"]
                  if b["type"] == "tool_use"]  # fmt: skip
        assert use["name"] == "collaboration__spawn_agent"
        use = {"type": "tool_use", "id": "toolu_2", "name": use["name"], "input": {"message": "b"}}
        answer = {"id": "msg_1", "type": "message", "role": "assistant", "model": "x",
                  "stop_reason": "tool_use", "content": [use],
                  "usage": {"input_tokens": 5, "output_tokens": 3}}  # fmt: skip
    else:
        assert [t["function"]["name"] for t in out["tools"]] == ["collaboration__spawn_agent"]
        call = {
            "id": "call_2",
            "type": "function",
            "function": {"name": "collaboration__spawn_agent", "arguments": '{"message": "b"}'},
        }
        answer = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "x",
                  "choices": [{"index": 0, "finish_reason": "tool_calls",
                               "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
                  "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}  # fmt: skip
    back = translate_response(
        answer, dst, "responses", public_model="p", tool_names=tool_names(CODEX_NAMESPACED)
    )
    (item,) = back["output"]
    assert (item["type"], item["namespace"], item["name"]) == (
        "function_call",
        "collaboration",
        "spawn_agent",
    )
    plain = translate_response(answer, dst, "responses", public_model="p")  # a client that declared none
    assert (
        plain["output"][0]["name"] == "collaboration__spawn_agent" and "namespace" not in plain["output"][0]
    )


def test_a_streamed_call_of_a_namespaced_tool_comes_back_split():
    from gateway.translate import StreamTranslator
    from gateway.translate.namespaces import tool_names

    def ev(kind: str, obj: dict) -> bytes:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **obj})}\n\n".encode()

    msg = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "x",
           "usage": {"input_tokens": 5, "output_tokens": 0}}  # fmt: skip
    upstream = b"".join([
        ev("message_start", {"message": msg}),
        ev("content_block_start", {"index": 0, "content_block": {
            "type": "tool_use", "id": "toolu_2", "name": "collaboration__spawn_agent", "input": {}}}),
        ev("content_block_delta", {"index": 0, "delta": {"type": "input_json_delta",
                                                         "partial_json": '{"message": "b"}'}}),
        ev("content_block_stop", {"index": 0}),
        ev("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}}),
        ev("message_stop", {}),
    ])  # fmt: skip
    t = StreamTranslator("messages", "responses", public_model="p", tool_names=tool_names(CODEX_NAMESPACED))
    out = (t.feed(upstream) + t.finish()).decode()
    done = [json.loads(line[6:]) for line in out.splitlines() if line.startswith("data: ")]
    added = next(e for e in done if e["type"] == "response.output_item.added")["item"]
    final = next(e for e in done if e["type"] == "response.completed")["response"]["output"][0]
    for item in (added, final):
        assert (item["namespace"], item["name"]) == ("collaboration", "spawn_agent")
    assert json.loads(final["arguments"]) == {"message": "b"}


# --- effort hints (policy.EFFORT) ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "src,body,dst,expected",
    [
        ("messages", {"output_config": {"effort": "medium"}}, "chat", {"reasoning_effort": "medium"}),
        ("messages", {"output_config": {"effort": "low"}}, "responses", {"reasoning": {"effort": "low"}}),
        ("chat", {"reasoning_effort": "xhigh"}, "messages", {"output_config": {"effort": "high"}}),
        ("responses", {"reasoning": {"effort": "none"}}, "messages", {"output_config": {"effort": "low"}}),
        ("chat", {"reasoning_effort": "minimal"}, "responses", {"reasoning": {"effort": "minimal"}}),
        ("responses", {"reasoning": {"effort": "high"}}, "chat", {"reasoning_effort": "high"}),
    ],
)
def test_an_effort_word_maps_to_the_nearest_the_target_has(src, body, dst, expected):
    base = {"chat": {"messages": [{"role": "user", "content": "hi"}]}, "responses": {"input": "hi"},
            "messages": {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}}[src]  # fmt: skip
    out = translate_request({**base, **body}, src, dst, upstream_model="m", effort=True)
    assert {k: out[k] for k in expected} == expected
    plain = translate_request({**base, **body}, src, dst, upstream_model="m")
    # without the flag only the OpenAI formats keep their own word between them
    kept = src != "messages" and dst != "messages"
    assert ({k: plain.get(k) for k in expected} == expected) == kept


def test_an_effort_word_outside_the_table_is_not_mapped():
    body = {"max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    body["output_config"] = {"effort": "x"}
    out = translate_request(body, "messages", "chat", upstream_model="m", effort=True)
    assert "reasoning_effort" not in out
