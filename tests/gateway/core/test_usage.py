"""Usage parsing: tolerant of what an upstream reports, bounded in what it buffers."""

from __future__ import annotations

import json

import pytest

from gateway.core.usage import StreamUsage, usage_from_body


@pytest.mark.parametrize("bad", ["12.5", "lots", {"n": 1}, [3], -4, True])
def test_bad_usage_values_mean_estimate_not_crash(bad):
    assert usage_from_body("chat", {"usage": {"prompt_tokens": bad, "completion_tokens": 3}}) is None
    assert usage_from_body("responses", {"usage": {"input_tokens": 2, "output_tokens": bad}}) is None
    assert usage_from_body("messages", {"usage": {"input_tokens": 2, "cache_read_input_tokens": bad}}) is None
    assert usage_from_body("chat", {"usage": {"prompt_tokens": "7", "completion_tokens": None}}) == (7, 0)

    chat = StreamUsage("chat", strip_usage_chunk=True)
    event = b'data: {"choices":[],"usage":{"prompt_tokens":%s,"completion_tokens":1}}\n\n'
    assert chat.feed(event % json.dumps(bad).encode()) == b""  # still stripped, as the client did not ask
    assert chat.bad_usage and not chat.seen_usage

    msgs = StreamUsage("messages")
    start = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n'
    delta = b'event: message_delta\ndata: {"type":"message_delta","usage":{"output_tokens":%s}}\n\n'
    out = msgs.feed(start + delta % json.dumps(bad).encode())
    assert out.count(b"\n\n") == 2  # every event still reaches the client
    assert msgs.bad_usage


def test_a_stream_without_event_ends_is_forwarded_once_the_buffer_passes_the_cap():
    from gateway.core.usage import MAX_EVENT_BYTES

    tracker = StreamUsage("chat")
    chunk = b"data: " + b"x" * 65_530  # 64 KiB, never a blank line
    sent = b""
    for _ in range(40):  # 2.5 MiB in all
        sent += tracker.feed(chunk)
    assert len(sent) >= 40 * len(chunk) - MAX_EVENT_BYTES - len(chunk)  # the buffer stays bounded
    sent += tracker.finish()
    assert sent == chunk * 40  # every byte reaches the client, in order


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def test_anthropic_output_tokens_come_from_message_delta_not_message_start():
    start = _event(
        "message_start",
        {"type": "message_start", "message": {"usage": {"input_tokens": 9, "output_tokens": 1}}},
    )
    text = _event(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "a message_delta b " * 20}},
    )
    delta = _event("message_delta", {"type": "message_delta", "usage": {"output_tokens": 57}})
    whole = StreamUsage("messages")
    whole.feed(start + text)
    assert (whole.output_tokens, whole.output_final) == (1, False)  # the text quoting the name is not usage
    whole.feed(delta)
    assert (whole.input_tokens, whole.output_tokens, whole.output_final) == (9, 57, True)

    cut = StreamUsage("messages")  # the stream broke before message_delta: 1 is a placeholder, not the count
    cut.feed(start + text)
    assert not cut.output_final and cut.estimated_output_tokens() > 1


def _chat_stream(words: int, usage: bool = True) -> bytes:
    def chunk(delta: dict, **extra) -> bytes:
        return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}], **extra}).encode() + b"\n\n"

    out = chunk({"role": "assistant", "content": ""})
    out += b"".join(chunk({"content": f"word{i} "}) for i in range(words))
    if usage:
        out += b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":%d}}\n\n' % words
    return out + b"data: [DONE]\n\n"


@pytest.mark.parametrize("split", [None, 1, 7, 64])
def test_the_usage_chunk_alone_is_cut_out_and_every_other_byte_passes_as_it_came(split):
    body = b": keep-alive comment\n\n" + _chat_stream(5)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":5}}\n\n'
    tracker = StreamUsage("chat", strip_usage_chunk=True)
    pieces = [body] if split is None else [body[i : i + split] for i in range(0, len(body), split)]
    out = b"".join(tracker.feed(p) for p in pieces) + tracker.finish()
    assert out == body.replace(usage, b"")
    assert tracker.seen_usage and tracker.usage()[:2] == (11, 5)
    kept = StreamUsage("chat", strip_usage_chunk=False)  # the client asked for it: nothing is cut
    assert kept.feed(body) + kept.finish() == body


@pytest.mark.parametrize("words", [3, 20_000])  # within and past the bytes kept for a later count
def test_the_text_estimate_is_the_same_whether_counted_late_or_as_it_goes(words):
    body = _chat_stream(words, usage=False)
    tracker = StreamUsage("chat")
    for i in range(0, len(body), 4096):
        tracker.feed(body[i : i + 4096])
    tracker.finish()
    text = sum(len(f"word{i} ") for i in range(words))
    assert not tracker.seen_usage
    assert tracker.estimated_output_tokens() == max(1, text // 4)
