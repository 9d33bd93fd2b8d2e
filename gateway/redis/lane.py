"""The lane: one pipelined connection to Redis speaking RESP directly, for the per-request scripts.

Commands are written as they come and their answers matched in order (pipelining). The admission, release
and settlement scripts of the shared limits go through it because redis-py's asyncio client measured over
the target: admit + release + settle cost 157-365 us of CPU per request through it (connection pool,
hiredis parser, EVALSHA) against 28-72 us here (``python -m benchmarks shared``; the target is 150).
Everything else (pub/sub, seeding, summaries) uses redis-py.

A script is sent as ``EVALSHA`` with a prebuilt prefix (``eval_prefix``: the command, the script's SHA and
its keys, encoded once) and its arguments encoded per call (``args``). The failures of the lane are those
of ``gateway.redis.errors``: ``ReplyError`` for an error reply, ``ProtocolError`` for bytes that are no
reply, ``ConnectionError``/``OSError``/``TimeoutError`` for the connection; the shared state translates
them into ``SharedUnavailable``.
"""

from __future__ import annotations

import asyncio
import hashlib
import ssl
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast

from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection

from gateway.redis.errors import ProtocolError, ReplyError


class Script:
    """A Lua script run on the lane (by its SHA; loaded at each connection and again after NOSCRIPT)."""

    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name, self.source = name, source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name})"


# --- RESP ----------------------------------------------------------------------------------------------
class _Incomplete(Exception):
    """Not a failure: the buffer ends within a reply; the rest comes with the next read."""


def _encode(a: Any) -> bytes:
    if isinstance(a, bytes):
        return a
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, int):
        return b"%d" % a
    return repr(a).encode()


def pack(*args: Any) -> bytes:
    """A command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = _encode(a)
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def args(*values: Any) -> bytes:
    """Bulk strings to follow an ``eval_prefix``."""
    out = []
    for a in values:
        b = _encode(a)
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def eval_prefix(script: Script, keys: list[str], nargs: int) -> bytes:
    """``EVALSHA sha numkeys keys...`` in RESP, with the array length for ``nargs`` arguments after it."""
    head = [b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *(k.encode() for k in keys)]
    out = [b"*%d\r\n" % (len(head) + nargs)]
    out += [b"$%d\r\n%s\r\n" % (len(b), b) for b in head]
    return b"".join(out)


def evalsha(script: Script, keys: list[str], values: list[Any]) -> bytes:
    """One whole ``EVALSHA`` command."""
    return eval_prefix(script, keys, len(values)) + args(*values)


def parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    """One reply from ``buf`` at ``pos``: (the value, the position after it). An error reply is returned as a
    ``ReplyError`` value (it answers one command, it does not fail the connection). Raises ``_Incomplete``
    when the buffer ends within the reply, ``ProtocolError`` for bytes that are no RESP."""
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    nxt = end + 2
    try:
        if kind == 58:  # ':'
            return int(buf[pos + 1 : end]), nxt
        if kind == 36:  # '$'
            n = int(buf[pos + 1 : end])
            if n < 0:
                return None, nxt
            if len(buf) < nxt + n + 2:
                raise _Incomplete
            return bytes(buf[nxt : nxt + n]), nxt + n + 2
        if kind == 42:  # '*'
            n = int(buf[pos + 1 : end])
            if n < 0:
                return None, nxt
            items = []
            for _ in range(n):
                v, nxt = parse(buf, nxt)
                items.append(v)
            return items, nxt
    except ValueError:  # a length or an integer that is no number
        raise ProtocolError(f"a malformed reply from Redis: {bytes(buf[pos:end])[:80]!r}") from None
    if kind == 43:  # '+'
        return buf[pos + 1 : end].decode(), nxt
    if kind == 45:  # '-'
        return ReplyError(buf[pos + 1 : end].decode(errors="replace")), nxt
    raise ProtocolError(f"unexpected byte {kind!r} from Redis")


# --- the connection ------------------------------------------------------------------------------------
class Lane(asyncio.Protocol):
    """One connection, commands written as they come and answers matched in order (pipelining). A command
    unanswered after ``timeout_s`` aborts the connection: every pending command fails and ``on_lost``
    is called (the shared state then counts Redis as down)."""

    def __init__(self, timeout_s: float, on_lost: Callable[[Lane, BaseException], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout_s
        self._on_lost = on_lost
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._pending: deque[tuple[asyncio.Future, float]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # a stream connection's: a full Transport

    def connection_lost(self, exc: BaseException | None) -> None:
        err = ConnectionError(f"connection to Redis lost: {exc}" if exc else "connection to Redis closed")
        was_closed = self.closed
        self.closed = True
        self._fail(err)
        if not was_closed:
            self._on_lost(self, err)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, n = 0, len(buf)
        pending = self._pending
        while pos < n:
            try:
                value, pos = parse(buf, pos)
            except _Incomplete:
                break
            except ProtocolError as e:
                self.abort(e)
                return
            if not pending:
                self.abort(ProtocolError("a reply from Redis nobody asked for"))
                return
            fut = pending.popleft()[0]
            if not fut.done():
                if isinstance(value, ReplyError):
                    fut.set_exception(value)
                else:
                    fut.set_result(value)
        if pos:
            del buf[:pos]

    # use
    @property
    def pending(self) -> list[asyncio.Future]:
        """The commands sent and not answered yet."""
        return [f for f, _ in self._pending]

    def send(self, payload: bytes) -> asyncio.Future:
        """Write one command (or several, pipelined by the caller: one future per reply is needed, so
        send them one by one); its future has the reply or the lane's failure."""
        if self.closed or self._transport is None:
            raise ConnectionError("not connected to Redis")
        loop = self._loop
        fut = loop.create_future()
        self._pending.append((fut, loop.time()))
        self._transport.write(payload)
        if self._timer is None:
            self._timer = loop.call_later(self._timeout, self._watch)
        return fut

    async def call(self, *command: Any) -> Any:
        return await self.send(pack(*command))

    def load(self, scripts: Iterable[Script]) -> None:
        """``SCRIPT LOAD`` each script, without waiting (a later command's answer confirms them)."""
        for s in scripts:
            ignore(self.send(pack("SCRIPT", "LOAD", s.source)))

    def _watch(self) -> None:
        self._timer = None
        if not self._pending or self.closed:
            return
        age = self._loop.time() - self._pending[0][1]
        if age >= self._timeout:
            self.abort(TimeoutError(f"Redis did not answer within {self._timeout:g} s"))
        else:
            self._timer = self._loop.call_later(self._timeout - age, self._watch)

    def _fail(self, err: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._pending:
            fut = self._pending.popleft()[0]
            if not fut.done():
                fut.set_exception(err)
                fut.exception()  # retrieved: a settle nobody awaits must not warn

    def abort(self, reason: BaseException | None = None) -> None:
        err = reason or ConnectionError("connection to Redis closed")
        if not self.closed:
            self.closed = True
            self._fail(err)
            if self._transport is not None:
                self._transport.abort()
            self._on_lost(self, err)

    def close(self) -> None:
        """Closed on purpose (stop): no ``on_lost``."""
        self.closed = True
        self._fail(ConnectionError("connection to Redis closed"))
        if self._transport is not None:
            self._transport.abort()


async def open_lane(
    params: dict[str, Any], timeout_s: float, on_lost: Callable[[Lane, BaseException], None]
) -> Lane:
    """Connect to the Redis of ``params`` (redis-py's ``parse_url`` of ``redis_url``: TCP, TLS or a unix
    socket), authenticate, select the database and PING, all within ``timeout_s``."""
    loop = asyncio.get_running_loop()
    lane = Lane(timeout_s, on_lost)
    async with asyncio.timeout(timeout_s):
        cls = params.get("connection_class")
        if cls is UnixDomainSocketConnection:
            await loop.create_unix_connection(lambda: lane, params["path"])
        else:
            ctx = None
            if cls is SSLConnection:
                ctx = ssl.create_default_context(cafile=params.get("ssl_ca_certs"))
                if str(params.get("ssl_cert_reqs", "required")).lower() in ("none", "cert_none"):
                    ctx.check_hostname = False
                    ctx.verify_mode = ssl.CERT_NONE
            host = params.get("host", "localhost")
            await loop.create_connection(lambda: lane, host, int(params.get("port", 6379)), ssl=ctx)
        try:
            if params.get("password"):
                user = params.get("username")
                await lane.call("AUTH", *([user] if user else []), params["password"])
            if int(params.get("db") or 0):
                await lane.call("SELECT", int(params["db"]))
            await lane.call("PING")
        except BaseException:
            lane.close()
            raise
    return lane


def ignore(fut: asyncio.Future) -> None:
    """Nobody awaits ``fut``: its failure (the lane's, reported through ``on_lost``) is retrieved."""
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)
