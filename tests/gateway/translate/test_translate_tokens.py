"""The stream translator counts tokens for the ledger: the same numbers as ``StreamUsage`` fed the same bytes.

The gateway reads a translated stream once: the translator's ``tokens`` (a ``StreamUsage`` that the decoder
hands the parsed events carrying usage) replaces a second pass over the upstream's bytes. Every field the
ledger uses must match that second pass, for whole streams, streams cut short anywhere, counts that are not
counts, and cache writes.
"""

from __future__ import annotations

import json
import random

import pytest

from gateway.core.usage import StreamUsage
from gateway.translate import StreamTranslator
from tests.gateway.translate.test_translate_stream import PAIRS, UPSTREAMS, _sse


def _counts(u: StreamUsage) -> tuple:
    return (u.seen_usage, u.bad_usage, u.output_final, u.usage(), u.estimated_output_tokens())


def _both(src: str, dst: str, data: bytes, cuts: list[int]) -> tuple[tuple, tuple]:
    """(translator's counts, StreamUsage's counts) for ``data`` fed in pieces cut at ``cuts``."""
    t = StreamTranslator(src, dst, public_model="m", created=1)
    ref = StreamUsage(src)
    prev = 0
    for c in [*cuts, len(data)]:
        t.feed(data[prev:c])
        ref.feed(data[prev:c])
        prev = c
    t.finish()
    ref.finish()
    return _counts(t.tokens), _counts(ref)


@pytest.mark.parametrize("tool", [True, False], ids=["tool", "text"])
@pytest.mark.parametrize("src,dst", PAIRS)
def test_tokens_match_stream_usage_whole_split_and_cut_short(src, dst, tool):
    data, _ = UPSTREAMS[src](tool)
    got, want = _both(src, dst, data, [])
    assert got == want
    assert got[0] and got[2] and not got[1]  # a complete stream: usage seen, final, not estimated
    rng = random.Random(11)
    for _ in range(10):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 30)))
        assert _both(src, dst, data, cuts) == (want, want)
    # cut short at every event end and inside events: the partial usage and the estimate agree too
    ends = [i + 2 for i in range(len(data)) if data[i : i + 2] == b"\n\n"]
    for n in [*ends, *rng.sample(range(1, len(data)), 15)]:
        got, want = _both(src, dst, data[:n], [n // 2])
        assert got == want, n


def test_cut_before_the_final_count_is_not_final():
    data, _ = UPSTREAMS["messages"]()
    cut = data.index(b"event: message_delta")
    got, want = _both("messages", "chat", data[:cut], [])
    assert got == want
    seen, bad, final, usage, estimate = got
    assert seen and not bad and not final  # message_start's output count is a placeholder
    assert usage.input_tokens == 100 and estimate >= 1


@pytest.mark.parametrize(
    "src,old,new",
    [
        ("chat", b'"completion_tokens": 20', b'"completion_tokens": "lots"'),
        ("chat", b'"prompt_tokens": 100', b'"prompt_tokens": -3'),
        ("responses", b'"output_tokens": 20', b'"output_tokens": true'),
        ("messages", b'"output_tokens": 20', b'"output_tokens": 1e99'),
        ("messages", b'"input_tokens": 60', b'"input_tokens": 99999999999'),
    ],
)
def test_a_count_that_is_not_a_count_is_bad_usage(src, old, new):
    data, _ = UPSTREAMS[src]()
    assert old in data
    data = data.replace(old, new)
    dst = "chat" if src != "chat" else "messages"
    got, want = _both(src, dst, data, [])
    assert got == want
    assert got[1]  # bad_usage: the proxy estimates instead


def test_cache_writes_and_reads_are_counted_apart():
    data, _ = UPSTREAMS["messages"]()
    data = data.replace(b'"cache_creation_input_tokens": 0', b'"cache_creation_input_tokens": 7')
    got, want = _both("messages", "responses", data, [])
    assert got == want
    assert got[3] == (107, 20, 40, 7)  # input includes the cache read and the cache write


def test_stream_without_usage_is_estimated_from_its_text():
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "x"}
    chunks = [{"content": "x" * 40}, {"content": 'quote " and \\ and \n'}]
    data = b"".join(
        _sse({**base, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}) for d in chunks
    )
    data += (
        _sse({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}) + b"data: [DONE]\n\n"
    )
    got, want = _both("chat", "messages", data.replace(b"\n", b"\r\n"), [7, 100])
    assert got == want
    assert not got[0] and got[4] >= 10


def test_pings_and_comments_are_skipped_unread():
    """Keep-alives are passed over without parsing (a malformed ping would otherwise end the stream)."""
    data, _ = UPSTREAMS["messages"](False)
    data = data.replace(
        b"event: ping\ndata: " + json.dumps({"type": "ping"}).encode(), b"event: ping\ndata: {"
    )
    data = b": keep-alive\n\n" + data
    t = StreamTranslator("messages", "chat", public_model="m", created=1)
    out = t.feed(data) + t.finish()
    assert b"malformed" not in out and out.endswith(b"data: [DONE]\n\n")
    assert b'"content":"Hello, w"' in out
