"""The shared state's failures, translated here and nowhere else.

Two clients talk to Redis: the lane (``gateway.redis.lane``, the pipelined connection of the per-request
scripts) and redis-py (pub/sub, seeding, summaries, publishing). Whatever either raises about Redis becomes a
``SharedUnavailable`` at the boundary of ``gateway.redis`` and ``gateway.limits.redis`` (their callers fall
back to this process's own state), with the ``kind`` of the one table below::

    kind        raised by                                       means
    reply       ReplyError (lane), ResponseError (redis-py)     Redis answered with an error: a script's,
                                                                OOM, READONLY, NOSCRIPT, a refused AUTH
    protocol    ProtocolError (lane), InvalidResponse           bytes that are no RESP reply, or a reply
                                                                nobody asked for
    incomplete  asyncio.IncompleteReadError                     the connection ended within a reply
    timeout     TimeoutError, redis-py's TimeoutError           no answer within ``redis_timeout_s``
    refused     ConnectionRefusedError                          nothing listens at ``redis_url``
    reset       ConnectionResetError, BrokenPipeError,          the connection was dropped
                ConnectionAbortedError
    connection  ConnectionError, OSError (DNS, TLS, routing),   no connection, or it was closed
                redis-py's ConnectionError (and its
                AuthenticationError, BusyLoadingError)

Nothing else is caught as a Redis failure: a ``TypeError`` or redis-py's ``DataError`` (a wrong argument)
is a bug and goes up as one. ``except REDIS_ERRORS`` is how code here catches exactly the table's types.
"""

from __future__ import annotations

import asyncio

from redis import exceptions as rx


class SharedUnavailable(Exception):
    """Redis cannot be used right now; the caller falls back to this process's own state. ``kind``: the
    failure's row in the table above (``down`` when Redis was already counted down)."""

    def __init__(self, message: str, kind: str = "down") -> None:
        super().__init__(message)
        self.kind = kind


class ReplyError(Exception):
    """An error reply from Redis on the lane (``-ERR ...``, ``-NOSCRIPT ...``)."""

    @property
    def noscript(self) -> bool:
        return str(self).startswith("NOSCRIPT")


class ProtocolError(Exception):
    """The lane read bytes that are no RESP reply, or a reply nobody asked for."""


# (the exception types, in order: the first row that matches decides) -> kind
FAILURES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((ReplyError, rx.ResponseError), "reply"),
    ((ProtocolError, rx.InvalidResponse), "protocol"),
    ((asyncio.IncompleteReadError,), "incomplete"),
    ((TimeoutError, rx.TimeoutError), "timeout"),
    ((ConnectionRefusedError,), "refused"),
    ((ConnectionResetError, BrokenPipeError, ConnectionAbortedError), "reset"),
    ((ConnectionError, OSError, rx.ConnectionError), "connection"),
)

REDIS_ERRORS: tuple[type[BaseException], ...] = tuple(t for types, _ in FAILURES for t in types)


def kind_of(err: BaseException) -> str | None:
    """The table's kind of ``err``, or None when it is not a Redis failure."""
    if isinstance(err, SharedUnavailable):
        return err.kind
    for types, kind in FAILURES:
        if isinstance(err, types):
            return kind
    return None


def unavailable(err: BaseException, doing: str | None = None) -> SharedUnavailable:
    """The ``SharedUnavailable`` for a Redis failure (one of ``REDIS_ERRORS``): ``doing`` says what failed."""
    if isinstance(err, SharedUnavailable):
        return err
    kind = kind_of(err)
    assert kind is not None, f"not a Redis failure: {err!r}"
    text = describe(err)
    return SharedUnavailable(f"{doing}: {text}" if doing else text, kind)


def describe(err: BaseException | str) -> str:
    """One line for logs and ``/readyz``: the exception's class and its message."""
    if isinstance(err, str):
        return err
    text = str(err).strip()
    return f"{err.__class__.__name__}: {text}" if text else err.__class__.__name__
