"""Streamed translation: byte-boundary independence, and the official SDKs accept what comes out.

Each upstream answer is built twice from one spec, as an SSE stream and as a whole body, the way each
provider really sends it (text with multi-byte characters, a tool call with its arguments in fragments,
usage with cached input tokens). The translated stream, accumulated by the SDK of the client's format, must
equal the translated whole body.
"""

from __future__ import annotations

import json
import random

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter
from sdk_streams import anthropic_final, chat_final, events, responses_final

from gateway.translate import StreamTranslator, translate_response

CREATED = 1_700_000_000
TEXT = ["Hello, w", "örld ✓ ", "done."]
ARGS = ['{"city":', ' "Par', 'is"}']
PAIRS = [
    (s, d) for s in ("chat", "responses", "messages") for d in ("chat", "responses", "messages") if s != d
]


def _sse(obj: dict, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def chat_upstream(tool: bool = True) -> tuple[bytes, dict]:
    base = {"id": "chatcmpl-up1", "object": "chat.completion.chunk", "created": CREATED, "model": "gpt-x"}

    def chunk(delta: dict, finish: str | None = None) -> bytes:
        return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    out = [chunk({"role": "assistant", "content": ""})]
    out += [chunk({"content": t}) for t in TEXT]
    if tool:
        first = {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        }
        out.append(chunk({"tool_calls": [first]}))
        out += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": a}}]}) for a in ARGS]
    finish = "tool_calls" if tool else "stop"
    out.append(chunk({}, finish))
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "total_tokens": 120,
        "prompt_tokens_details": {"cached_tokens": 40},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    out.append(_sse({**base, "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    message: dict = {"role": "assistant", "content": "".join(TEXT)}
    if tool:
        message["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "".join(ARGS)},
            }
        ]
    whole = {
        **base,
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }
    return b"".join(out), whole


def messages_upstream(tool: bool = True) -> tuple[bytes, dict]:
    usage0 = {
        "input_tokens": 60,
        "cache_read_input_tokens": 40,
        "cache_creation_input_tokens": 0,
        "output_tokens": 1,
    }
    start = {
        "id": "msg_up1",
        "type": "message",
        "role": "assistant",
        "model": "claude-x",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage0,
    }
    out = [_sse({"type": "message_start", "message": start}, "message_start"), _sse({"type": "ping"}, "ping")]
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    out.append(_sse(block, "content_block_start"))
    for t in TEXT:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
        out.append(_sse(delta, "content_block_delta"))
    out.append(_sse({"type": "content_block_stop", "index": 0}, "content_block_stop"))
    content: list[dict] = [{"type": "text", "text": "".join(TEXT)}]
    if tool:
        use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}
        out.append(
            _sse({"type": "content_block_start", "index": 1, "content_block": use}, "content_block_start")
        )
        for a in ARGS:
            delta = {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": a},
            }
            out.append(_sse(delta, "content_block_delta"))
        out.append(_sse({"type": "content_block_stop", "index": 1}, "content_block_stop"))
        content.append({**use, "input": {"city": "Paris"}})
    reason = "tool_use" if tool else "end_turn"
    md = {
        "type": "message_delta",
        "delta": {"stop_reason": reason, "stop_sequence": None},
        "usage": {"output_tokens": 20},
    }
    out.append(_sse(md, "message_delta"))
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    whole = {**start, "content": content, "stop_reason": reason, "usage": {**usage0, "output_tokens": 20}}
    return b"".join(out), whole


def responses_upstream(tool: bool = True) -> tuple[bytes, dict]:
    seq = iter(range(1000))

    def ev(kind: str, **fields) -> bytes:
        return _sse({"type": kind, "sequence_number": next(seq), **fields}, kind)

    shell = {
        "id": "resp_up1",
        "object": "response",
        "created_at": CREATED,
        "status": "in_progress",
        "model": "gpt-x",
        "output": [],
        "usage": None,
    }
    text = "".join(TEXT)
    msg = {
        "id": "msg_up1",
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    out = [ev("response.created", response=shell), ev("response.in_progress", response=shell)]
    out.append(
        ev("response.output_item.added", output_index=0, item={**msg, "status": "in_progress", "content": []})
    )
    part = {"type": "output_text", "text": "", "annotations": []}
    out.append(
        ev("response.content_part.added", item_id="msg_up1", output_index=0, content_index=0, part=part)
    )
    for t in TEXT:
        out.append(
            ev("response.output_text.delta", item_id="msg_up1", output_index=0, content_index=0, delta=t)
        )
    out.append(ev("response.output_text.done", item_id="msg_up1", output_index=0, content_index=0, text=text))
    out.append(ev("response.output_item.done", output_index=0, item=msg))
    output = [msg]
    if tool:
        fc = {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": "".join(ARGS),
        }
        out.append(
            ev(
                "response.output_item.added",
                output_index=1,
                item={**fc, "arguments": "", "status": "in_progress"},
            )
        )
        for a in ARGS:
            out.append(ev("response.function_call_arguments.delta", item_id="fc_1", output_index=1, delta=a))
        out.append(
            ev(
                "response.function_call_arguments.done",
                item_id="fc_1",
                output_index=1,
                arguments="".join(ARGS),
            )
        )
        out.append(ev("response.output_item.done", output_index=1, item=fc))
        output.append(fc)
    usage = {
        "input_tokens": 100,
        "input_tokens_details": {"cached_tokens": 40},
        "output_tokens": 20,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 120,
    }
    done = {**shell, "status": "completed", "output": output, "usage": usage}
    out.append(ev("response.completed", response=done))
    return b"".join(out), done


UPSTREAMS = {"chat": chat_upstream, "responses": responses_upstream, "messages": messages_upstream}


def run(src: str, dst: str, data: bytes, cuts: list[int]) -> tuple[bytes, StreamTranslator]:
    t = StreamTranslator(src, dst, public_model="public-model", created=CREATED)
    out, prev = [], 0
    for c in [*cuts, len(data)]:
        out.append(t.feed(data[prev:c]))
        prev = c
    out.append(t.finish())
    return b"".join(out), t


@pytest.mark.parametrize("src,dst", PAIRS)
def test_any_split_gives_the_same_bytes(src, dst):
    data, _ = UPSTREAMS[src]()
    whole, _ = run(src, dst, data, [])
    assert whole
    every_byte, _ = run(src, dst, data, list(range(1, len(data))))
    assert every_byte == whole
    rng = random.Random(7)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 40)))
        assert run(src, dst, data, cuts)[0] == whole


@pytest.mark.parametrize("src,dst", PAIRS)
def test_output_is_produced_as_events_arrive(src, dst):
    """Not buffered to the end: the first text is out before the upstream has finished."""
    data, _ = UPSTREAMS[src]()
    cut = data.index("örld".encode()) + 20  # past the second text delta, long before the end
    t = StreamTranslator(src, dst, public_model="public-model", created=CREATED)
    early = t.feed(data[:cut])
    assert b"Hello, w" in early
    assert b"[DONE]" not in early and b"message_stop" not in early and b"response.completed" not in early


def _normalized(obj: object) -> object:
    """A model dump where tool-call argument strings are parsed (a stream relays the upstream's own
    spacing, a whole Anthropic answer is re-serialised) and the SDK's stream-only ``index`` is gone."""
    if isinstance(obj, dict):
        out = {k: _normalized(v) for k, v in obj.items() if k != "index"}
        if isinstance(obj.get("arguments"), str) and obj["arguments"]:
            out["arguments"] = json.loads(obj["arguments"])
        return out
    if isinstance(obj, list):
        return [_normalized(v) for v in obj]
    return obj


@pytest.mark.parametrize("tool", [True, False], ids=["tool", "text"])
@pytest.mark.parametrize("src,dst", PAIRS)
def test_sdk_accumulates_the_stream_into_the_whole_translation(src, dst, tool):
    data, whole_body = UPSTREAMS[src](tool)
    out, t = run(src, dst, data, [])
    expected = translate_response(whole_body, src, dst, public_model="public-model", created=CREATED)
    if dst == "messages":
        assert anthropic_final(out) == Message.model_validate(expected)
    elif dst == "chat":
        got = _normalized(chat_final(out).model_dump(exclude_none=True))
        assert got == _normalized(ChatCompletion.model_validate(expected).model_dump(exclude_none=True))
    else:
        got = _normalized(responses_final(out).model_dump())
        assert got == _normalized(Response.model_validate(expected).model_dump())
    assert (t.input_tokens, t.output_tokens, t.cached_input_tokens) == (100, 20, 40)


def test_tool_call_without_arguments_gets_an_empty_object():
    stream = b"".join(
        [
            _sse(
                {
                    "type": "message_start",
                    "message": {"id": "msg_2", "usage": {"input_tokens": 3, "output_tokens": 1}},
                }
            ),
            _sse(
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "tool_use", "id": "toolu_9", "name": "now", "input": {}},
                }
            ),
            _sse({"type": "content_block_stop", "index": 0}),
            _sse(
                {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 5}}
            ),
            _sse({"type": "message_stop"}),
        ]
    )
    out, _ = run("messages", "chat", stream, [])
    final = chat_final(out)
    assert final.choices[0].message.tool_calls[0].function.arguments == "{}"
    assert final.choices[0].finish_reason == "tool_calls"
    out, _ = run("messages", "responses", stream, [])
    assert responses_final(out).output[0].arguments == "{}"


@pytest.mark.parametrize("src,dst", PAIRS)
def test_a_stream_cut_short_ends_with_the_client_format_error(src, dst):
    data, _ = UPSTREAMS[src]()
    t = StreamTranslator(src, dst, public_model="public-model", created=CREATED)
    out = t.feed(data[: len(data) // 2]) + t.finish()
    last = events(out)[-1]
    if dst == "messages":
        assert last[0] == "error" and json.loads(last[1])["error"]["type"] == "api_error"
    elif dst == "chat":
        assert "ended before" in json.loads(last[1])["error"]["message"]
    else:
        assert last[0] == "response.failed"
        TypeAdapter(ResponseStreamEvent).validate_python(json.loads(last[1]))


@pytest.mark.parametrize("dst", ["chat", "responses", "messages"])
def test_error_event_in_client_format(dst):
    src = "messages" if dst != "messages" else "chat"
    data, _ = UPSTREAMS[src]()
    t = StreamTranslator(src, dst, public_model="m", created=CREATED)
    t.feed(data[:200])
    out = events(t.error_event(504, "upstream stalled"))
    if dst == "responses":
        adapter = TypeAdapter(ResponseStreamEvent)
        parsed = [adapter.validate_python(json.loads(p)) for _, p in out]
        assert [e.type for e in parsed] == ["error", "response.failed"]
        assert parsed[1].response.error.message == "upstream stalled"
    elif dst == "messages":
        ev = TypeAdapter(RawMessageStreamEvent).validate_python  # error is not a message event: check shape
        assert out[0][0] == "error"
        assert json.loads(out[0][1]) == {
            "type": "error",
            "error": {"type": "timeout_error", "message": "upstream stalled"},
        }
        del ev
    else:
        assert json.loads(out[0][1])["error"]["message"] == "upstream stalled"
    assert t.feed(b"data: {}\n\n") == b""  # nothing after the error


def test_upstream_error_event_mid_stream_is_translated():
    data, _ = messages_upstream()
    cut = data.index(b"event: content_block_stop")
    err = _sse({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, "error")
    out, _ = run("messages", "responses", data[:cut] + err, [])
    kinds = [name for name, _ in events(out)]
    assert kinds[-2:] == ["error", "response.failed"]
    assert "Overloaded" in events(out)[-1][1]
