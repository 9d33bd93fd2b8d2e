"""A client-format SSE stream read as the SDKs read it: each event validated against the SDK's types, the
stream accumulated by the SDK's own helpers into its final object (anthropic ``Message``, openai
``ChatCompletion`` and ``Response``), with the framing each format requires checked on the way."""

from __future__ import annotations

import json

from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter


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


def anthropic_final(data: bytes) -> Message:
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


def chat_final(data: bytes) -> ChatCompletion:
    state = ChatCompletionStreamState()
    chunks = events(data)
    assert chunks[-1][1] == "[DONE]"
    first = ChatCompletionChunk.model_validate_json(chunks[0][1])
    assert first.choices[0].delta.role == "assistant"
    for _, payload in chunks[:-1]:
        state.handle_chunk(ChatCompletionChunk.model_validate_json(payload))
    return ChatCompletion.model_validate(state.get_final_completion().model_dump())


def responses_final(data: bytes) -> Response:
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
