"""Streams and answers an upstream should never send, through the gateway's translation (variants of #14's
"What was seen": absurd usage, input nested too deeply, fields of the wrong type). Seen: a chat stream's
usage of ``"prompt_tokens": "12"`` translated for an Anthropic client raised a TypeError, and 50,000
nested arrays in one event a RecursionError, after the stream had begun: the client got no end of stream
and hung; -5, NaN and 10**30 were passed on to the client as its token counts (NaN as ``Infinity``, which
is no JSON); a whole answer whose text was a number was passed on translated (``"text": 5``), which the
client's SDK cannot read."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest

from gateway.translate.stream import StreamTranslator

MSGS = [{"role": "user", "content": "hi"}]


def sse(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chat_chunk(text: str) -> dict:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}}],
    }


def usage_event(usage: bytes) -> bytes:
    return b'data: {"id":"c","object":"chat.completion.chunk","choices":[],"usage":' + usage + b"}\n\n"


def anthropic_events(start_usage: dict, delta_usage: dict) -> list[bytes]:
    def ev(kind: str, obj: dict) -> bytes:
        return f"event: {kind}\ndata: {json.dumps(obj)}\n\n".encode()

    msg = {
        "id": "m",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "u",
        "usage": start_usage,
    }
    return [
        ev("message_start", {"type": "message_start", "message": msg}),
        ev("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "hello"}}),
        ev("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ev("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                             "usage": delta_usage}),
        ev("message_stop", {"type": "message_stop"}),
    ]  # fmt: skip


class ScriptedUpstream:
    """An HTTP/1.1 server on 127.0.0.1 that answers every request with the SSE chunks it is given."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.answer: bytes | None = None  # a whole JSON answer instead of the SSE chunks
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(ln.split(b":")[1])
                    for ln in head.split(b"\r\n")
                    if ln.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            if self.answer is not None:
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                writer.write(head % len(self.answer) + self.answer)
                await writer.drain()
                return
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for chunk in self.chunks:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


@pytest.fixture
async def scripted(start_gateway):
    up = ScriptedUpstream()
    url = await up.start()
    gw = await start_gateway(providers={"oa": {"base_url": url}, "an": {"base_url": url}})
    yield gw, up
    up.close()


NOT_COUNTS = [b'"12"', b"-5", b"NaN", b"Infinity", b"1e400", str(10**30).encode(), b"[1]", b"true", b"2.5"]


@pytest.mark.parametrize("value", NOT_COUNTS)
async def test_chat_usage_that_is_no_count_reaches_an_anthropic_client_as_a_count(scripted, anth, value):
    gw, up = scripted
    usage = b'{"prompt_tokens":' + value + b',"completion_tokens":' + value + b"}"
    up.chunks = [sse(chat_chunk("hello")), usage_event(usage), sse(b"[DONE]")]
    client = anth(gw)
    async with asyncio.timeout(20):
        async with client.messages.stream(model="gpt-fake", max_tokens=16, messages=MSGS) as s:
            text = "".join([t async for t in s.text_stream])
            final = await s.get_final_message()
    assert text == "hello"
    for n in (final.usage.input_tokens, final.usage.output_tokens):
        assert isinstance(n, int) and 0 <= n <= 10_000_000
    rows = await gw.rows()
    numeric = value in (
        b'"12"',
        b"2.5",
    )  # counts the accounting reads as such (gateway.core.usage.token_count)
    assert rows[-1]["status"] == "ok" and rows[-1]["tokens_estimated"] == (not numeric)
    assert 0 <= rows[-1]["input_tokens"] <= 10_000_000


@pytest.mark.parametrize("value", [b'"12"', b"-1", b"NaN", str(10**30).encode()])
async def test_anthropic_usage_that_is_no_count_reaches_a_chat_client_as_a_count(scripted, oai, value):
    gw, up = scripted
    bad = json.loads(b'{"v":' + value + b"}")["v"]
    up.chunks = anthropic_events({"input_tokens": bad, "output_tokens": 1}, {"output_tokens": bad})
    stream = await oai(gw).chat.completions.create(
        model="claude-fake", messages=MSGS, stream=True, stream_options={"include_usage": True}
    )
    usage = None
    async with asyncio.timeout(20):
        async for chunk in stream:
            usage = chunk.usage or usage
    assert usage is not None
    for n in (usage.prompt_tokens, usage.completion_tokens):
        assert isinstance(n, int) and 0 <= n <= 10_000_000
    assert (await gw.rows())[-1]["status"] == "ok"


async def test_an_event_nested_too_deeply_ends_the_stream_with_an_error_event(scripted, anth):
    gw, up = scripted
    deep = b'{"choices":[],"usage":' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    up.chunks = [sse(chat_chunk("hi")), sse(deep), sse(b"[DONE]")]
    with pytest.raises(anthropic.APIStatusError) as ei:
        async with asyncio.timeout(20):
            async with anth(gw).messages.stream(model="gpt-fake", max_tokens=16, messages=MSGS) as s:
                async for _ in s.text_stream:
                    pass
    assert "malformed stream event" in str(ei.value)
    row = (await gw.rows())[-1]
    assert (row["status"], row["error_class"]) == ("error", "upstream_stream_error")


async def test_a_fault_of_the_gateway_mid_stream_ends_the_stream_and_is_recorded(
    scripted, oai, monkeypatch, caplog
):
    """Whatever raises once the stream has begun (here the translator's end, made to fail), the client gets an
    error event and the end of the stream, and the row says internal_error."""
    gw, up = scripted
    up.chunks = anthropic_events({"input_tokens": 3, "output_tokens": 1}, {"output_tokens": 2})

    def failing(self):
        raise RuntimeError("a bug")

    monkeypatch.setattr(StreamTranslator, "finish", failing)  # called once the stream has begun
    stream = await oai(gw).chat.completions.create(model="claude-fake", messages=MSGS, stream=True)
    with pytest.raises(openai.APIError) as ei:
        async with asyncio.timeout(20):
            async for _ in stream:
                pass
    assert "internal gateway error" in str(ei.value)
    row = (await gw.rows())[-1]
    assert (row["status"], row["error_class"], row["http_status"]) == ("error", "internal_error", 200)
    assert "a bug" in caplog.text


def chat_answer(message: dict) -> bytes:
    return json.dumps(
        {"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": message,
         "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    ).encode()  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        (chat_answer({"role": "assistant", "content": 5}), "choices[0].message.content"),
        (chat_answer({"role": "assistant", "content": None, "tool_calls": [{"id": "t", "function": 5}]}),
         "choices[0].message.tool_calls[0].function"),
        (chat_answer({"role": "assistant", "content": None, "tool_calls": [{"id": "t", "type": "function",
         "function": {"name": "f", "arguments": {"a": 1}}}]}), "function.arguments"),
        (b'{"id":"c","choices":"none"}', "choices"),
    ],
)  # fmt: skip
async def test_a_chat_answer_with_a_field_of_the_wrong_type_is_a_502_naming_it(scripted, anth, answer, field):
    gw, up = scripted
    up.answer = answer
    with pytest.raises(anthropic.APIStatusError) as ei:
        await anth(gw).messages.create(model="gpt-fake", max_tokens=16, messages=MSGS)
    assert ei.value.status_code == 502
    assert field in ei.value.message and "invalid request body" not in ei.value.message
    assert (await gw.rows())[-1]["error_class"] == "untranslatable_answer"


async def test_a_chat_answer_in_text_parts_is_read_as_its_text(scripted, anth):
    gw, up = scripted
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    up.answer = chat_answer({"role": "assistant", "content": parts})
    msg = await anth(gw).messages.create(model="gpt-fake", max_tokens=16, messages=MSGS)
    assert [b.text for b in msg.content] == ["hello world"]


async def test_an_anthropic_answer_with_a_number_for_text_is_a_502_naming_it(scripted, oai):
    gw, up = scripted
    up.answer = json.dumps(
        {"id": "m", "type": "message", "role": "assistant", "content": [{"type": "text", "text": 5}],
         "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}}
    ).encode()  # fmt: skip
    with pytest.raises(openai.APIStatusError) as ei:
        await oai(gw).chat.completions.create(model="claude-fake", messages=MSGS)
    assert ei.value.status_code == 502 and "content[0].text" in ei.value.message


def tool_call_chunks(arguments: list[str]) -> list[bytes]:
    """A chat stream whose answer is one tool call, its arguments in ``arguments`` pieces."""
    first = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": ""},
    }
    chunks = [
        sse(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"tool_calls": [first]}}],
            }
        )
    ]
    for piece in arguments:
        delta = {"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
        chunks.append(
            sse({"id": "c", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]})
        )
    done = {"index": 0, "delta": {}, "finish_reason": "tool_calls"}
    chunks.append(sse({"id": "c", "object": "chat.completion.chunk", "choices": [done]}))
    return [*chunks, sse(b"[DONE]")]


@pytest.mark.parametrize(
    "arguments", [["{not json"], ['{"path": ', '"a.txt"'], ["[1, 2]"], ['{"a": 1}', "x"]]
)
async def test_a_streamed_tool_call_whose_arguments_are_no_json_object_ends_with_an_error_event(
    scripted, anth, arguments
):
    """Seen: relayed to an Anthropic client as input_json_delta and a clean message_stop (row ``ok``); the
    anthropic SDK then failed to parse the tool input. The whole answer was a 502 already."""
    gw, up = scripted
    up.chunks = tool_call_chunks(arguments)
    with pytest.raises(anthropic.APIStatusError) as ei:
        async with asyncio.timeout(20):
            async with anth(gw).messages.stream(model="gpt-fake", max_tokens=16, messages=MSGS) as s:
                async for _ in s:
                    pass
    assert "read_file" in str(ei.value) and "not a JSON object" in str(ei.value)
    row = (await gw.rows())[-1]
    assert (row["status"], row["error_class"]) == ("error", "upstream_stream_error")


async def test_a_streamed_tool_call_with_json_arguments_in_pieces_is_whole_for_an_anthropic_client(
    scripted, anth
):
    gw, up = scripted
    up.chunks = tool_call_chunks(['{"pa', 'th": "a.txt"}'])
    async with asyncio.timeout(20):
        async with anth(gw).messages.stream(model="gpt-fake", max_tokens=16, messages=MSGS) as s:
            final = await s.get_final_message()
    (block,) = final.content
    assert (block.type, block.name, block.input) == ("tool_use", "read_file", {"path": "a.txt"})
    assert (await gw.rows())[-1]["status"] == "ok"
