"""The one table of the shared state's failures (gateway.redis.errors): each failure of the lane or of
redis-py has one kind, a bug has none, and the failures that can be made to happen on a real connection
(refused, timed out, an error reply, bytes that are no reply, a reply cut off) are the table's."""

from __future__ import annotations

import asyncio
import socket

import pytest
from redis import exceptions as rx
from redis.asyncio.connection import parse_url

from gateway.redis.errors import (
    REDIS_ERRORS,
    ProtocolError,
    ReplyError,
    SharedUnavailable,
    kind_of,
    unavailable,
)
from gateway.redis.lane import open_lane


@pytest.mark.parametrize(
    "err, kind",
    [
        (ReplyError("ERR boom"), "reply"),
        (rx.ResponseError("WRONGTYPE"), "reply"),
        (rx.NoScriptError("NOSCRIPT"), "reply"),
        (rx.ReadOnlyError("READONLY"), "reply"),
        (ProtocolError("?"), "protocol"),
        (rx.InvalidResponse("?"), "protocol"),
        (asyncio.IncompleteReadError(b"ab", 5), "incomplete"),
        (TimeoutError(), "timeout"),
        (rx.TimeoutError("Timeout reading from socket"), "timeout"),
        (ConnectionRefusedError(111, "Connection refused"), "refused"),
        (ConnectionResetError(104, "reset by peer"), "reset"),
        (BrokenPipeError(32, "broken pipe"), "reset"),
        (ConnectionError("not connected to Redis"), "connection"),
        (OSError(113, "No route to host"), "connection"),
        (socket.gaierror(-2, "Name or service not known"), "connection"),
        (rx.ConnectionError("Connection closed by server."), "connection"),
        (rx.AuthenticationError("invalid password"), "connection"),
        (rx.BusyLoadingError("loading"), "connection"),
    ],
)
def test_every_failure_has_one_kind(err, kind):
    assert isinstance(err, REDIS_ERRORS)
    assert kind_of(err) == kind
    translated = unavailable(err, "admitting")
    assert isinstance(translated, SharedUnavailable) and translated.kind == kind
    assert str(translated).startswith(f"admitting: {err.__class__.__name__}")


@pytest.mark.parametrize("bug", [TypeError("x"), ValueError("x"), KeyError("x"), rx.DataError("x")])
def test_a_bug_is_no_redis_failure(bug):
    assert not isinstance(bug, REDIS_ERRORS) and kind_of(bug) is None
    with pytest.raises(AssertionError, match="not a Redis failure"):
        unavailable(bug)


def _lost(log: list):
    return lambda _lane, err: log.append(err)


async def test_nothing_listening_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(REDIS_ERRORS) as ei:
        await open_lane({"host": "127.0.0.1", "port": port}, 1.0, _lost([]))
    assert kind_of(ei.value) == "refused"


async def _server(answer):
    """A TCP server on 127.0.0.1 whose connection handler is ``answer(reader, writer)``."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_server_that_never_answers_is_timeout():
    done = asyncio.Event()

    async def silent(reader, _writer):
        await reader.read(100)
        await done.wait()

    server, port = await _server(silent)
    try:
        with pytest.raises(REDIS_ERRORS) as ei:
            await open_lane({"host": "127.0.0.1", "port": port}, 0.2, _lost([]))
        assert kind_of(ei.value) == "timeout"
    finally:
        done.set()
        server.close()


async def test_bytes_that_are_no_reply_are_protocol_and_a_cut_reply_is_connection():
    async def garbage(reader, writer):
        await reader.read(100)  # PING
        writer.write(b"+PONG\r\n")
        await reader.read(100)
        writer.write(b"?what\r\n")
        await writer.drain()

    async def cut(reader, writer):
        await reader.read(100)
        writer.write(b"+PONG\r\n")
        await reader.read(100)
        writer.write(b"$10\r\nabc")  # 3 of 10 bytes, then the connection closes
        await writer.drain()

    for answer, kind in ((garbage, "protocol"), (cut, "connection")):
        server, port = await _server(answer)
        lost: list[BaseException] = []
        try:
            lane = await open_lane({"host": "127.0.0.1", "port": port}, 2.0, _lost(lost))
            with pytest.raises(REDIS_ERRORS) as ei:
                await lane.call("GET", "k")
            assert kind_of(ei.value) == kind
            assert lost and kind_of(lost[0]) == kind  # the shared state is told: Redis counts as down
        finally:
            server.close()


async def test_an_error_reply_of_a_real_redis_is_reply(redis_server):
    lane = await open_lane(parse_url(redis_server.url), 2.0, _lost([]))
    try:
        with pytest.raises(ReplyError) as ei:
            await lane.call("EVAL", "return redis.error_reply('boom')", 0)
        assert kind_of(ei.value) == "reply" and str(ei.value).endswith("boom") and not ei.value.noscript
        with pytest.raises(ReplyError) as ei:
            await lane.call("EVALSHA", "0" * 40, 0)
        assert ei.value.noscript
        assert await lane.call("PING") == "PONG"  # an error reply answers one command: the lane goes on
    finally:
        lane.close()
