"""The lane (gateway.redis.lane): RESP packing and parsing, and one pipelined connection to a real
redis-server: commands answered in order without waiting for each other, scripts run by their SHA, a
command left unanswered aborts the connection, a deliberate close tells nobody."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import parse_url

from gateway.redis.errors import ProtocolError, ReplyError
from gateway.redis.lane import Script, _Incomplete, args, eval_prefix, evalsha, open_lane, pack, parse


def test_pack_and_eval_prefix_encode_the_same_command():
    s = Script("echo", "return ARGV[1]")
    whole = pack("EVALSHA", s.sha, 2, "k1", "k2", b"v", 7)
    assert evalsha(s, ["k1", "k2"], [b"v", 7]) == whole
    assert eval_prefix(s, ["k1", "k2"], 2) + args(b"v", 7) == whole
    assert pack("GET", "k") == b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"


def test_parse_reads_every_reply_kind_and_waits_for_the_rest():
    raw = b"*5\r\n:42\r\n$3\r\nabc\r\n$-1\r\n+OK\r\n*1\r\n-ERR no\r\n"
    value, end = parse(bytearray(raw), 0)
    assert end == len(raw)
    assert value[:4] == [42, b"abc", None, "OK"]
    assert isinstance(value[4][0], ReplyError) and str(value[4][0]) == "ERR no"
    for cut in range(1, len(raw)):  # any prefix: the rest has not arrived yet
        with pytest.raises(_Incomplete):
            parse(bytearray(raw[:cut]), 0)


@pytest.mark.parametrize("raw", [b"?x\r\n", b":4x\r\n", b"$x\r\nab\r\n", b"*?\r\n"])
def test_bytes_that_are_no_reply_are_a_protocol_error(raw):
    with pytest.raises(ProtocolError):
        parse(bytearray(raw), 0)


async def test_commands_are_pipelined_and_answered_in_order(redis_server):
    lost: list[BaseException] = []
    lane = await open_lane(parse_url(redis_server.url), 2.0, lambda _l, e: lost.append(e))
    try:
        key = "lane-test:counter"
        await lane.call("DEL", key)
        futures = [lane.send(pack("INCR", key)) for _ in range(500)]  # all written before any answer
        assert len(lane.pending) == 500
        assert [await f for f in futures] == list(range(1, 501))
        script = Script("add", "return redis.call('INCRBY', KEYS[1], ARGV[1])")
        lane.load([script])
        assert await lane.send(evalsha(script, [key], [10])) == 510
    finally:
        lane.close()
    assert not lost  # a deliberate close tells nobody


async def test_a_command_left_unanswered_aborts_the_lane(redis_server):
    lost: list[BaseException] = []
    lane = await open_lane(parse_url(redis_server.url), 0.2, lambda _l, e: lost.append(e))
    blocked = lane.send(pack("BLPOP", "lane-test:empty", 5))  # Redis holds it for 5 s
    queued = lane.send(pack("PING"))
    with pytest.raises(TimeoutError):
        await blocked
    with pytest.raises(TimeoutError):
        await queued  # every command behind it fails with it
    assert lane.closed and len(lost) == 1 and isinstance(lost[0], TimeoutError)
    with pytest.raises(ConnectionError):
        lane.send(pack("PING"))
