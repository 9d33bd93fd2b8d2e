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
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

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


def events(data: bytes) -> list[tuple[str | None, str]]:
    out = []
    for block in data.decode().split("\n\n"):
        if not block:
            continue
        name = None
        payload = []
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                payload.append(line[6:])
        out.append((name, "\n".join(payload)))
    return out


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


def _anthropic_final(data: bytes) -> Message:
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, bufs = None, {}
    names = []
    for name, payload in events(data):
        event = adapter.validate_python(json.loads(payload))
        assert name == event.type
        names.append(name)
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=bufs)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    return Message.model_validate(snapshot.model_dump())


def _chat_final(data: bytes) -> ChatCompletion:
    state = ChatCompletionStreamState()
    chunks = events(data)
    assert chunks[-1][1] == "[DONE]"
    first = ChatCompletionChunk.model_validate_json(chunks[0][1])
    assert first.choices[0].delta.role == "assistant"
    for _, payload in chunks[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(payload))
    return ChatCompletion.model_validate(state.get_final_completion().model_dump())


def _responses_final(data: bytes) -> Response:
    adapter = TypeAdapter(ResponseStreamEvent)
    parsed = [adapter.validate_python(json.loads(p)) for _, p in events(data)]
    assert [e.sequence_number for e in parsed] == list(range(len(parsed)))
    kinds = [e.type for e in parsed]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    needed = ["response.output_item.added", "response.output_item.done"]
    if "response.output_text.delta" in kinds:
        needed += ["response.content_part.added", "response.output_text.done", "response.content_part.done"]
    if "response.function_call_arguments.delta" in kinds:
        needed.append("response.function_call_arguments.done")
    assert set(needed) <= set(kinds)
    assert kinds[-1] == "response.completed"
    text = "".join(e.delta for e in parsed if e.type == "response.output_text.delta")
    final = parsed[-1].response
    assert final.output_text == text
    return final


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
        assert _anthropic_final(out) == Message.model_validate(expected)
    elif dst == "chat":
        got = _normalized(_chat_final(out).model_dump(exclude_none=True))
        assert got == _normalized(ChatCompletion.model_validate(expected).model_dump(exclude_none=True))
    else:
        got = _normalized(_responses_final(out).model_dump())
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
    final = _chat_final(out)
    assert final.choices[0].message.tool_calls[0].function.arguments == "{}"
    assert final.choices[0].finish_reason == "tool_calls"
    out, _ = run("messages", "responses", stream, [])
    assert _responses_final(out).output[0].arguments == "{}"


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
