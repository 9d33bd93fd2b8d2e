"""This process's connection to the shared state (gateway.redis.state), on real redis-servers: started
without Redis it is degraded and says why; its participants are told of each connection and outage (one log
line each way); a script Redis forgot is loaded again; a bug in a background loop is logged with its
traceback and the loop goes on."""

from __future__ import annotations

import asyncio
import logging
import socket
import uuid

import pytest
import services
from shared_redis import settings

from gateway.redis.errors import SharedUnavailable
from gateway.redis.lane import Lane, Script, evalsha
from gateway.redis.state import SharedState


class Recorder:
    """A participant that notes what it is told (``renew_fails``: its next renewals raise a bug)."""

    scripts = (Script("double", "return tonumber(ARGV[1]) * 2"),)

    def __init__(self, renew_fails: int = 0) -> None:
        self.events: list[str] = []
        self.renew_fails = renew_fails
        self._changed = asyncio.Event()

    def _note(self, event: str) -> None:
        self.events.append(event)
        self._changed.set()

    async def connected(self, lane: Lane) -> None:
        self._note("connected")

    def down(self) -> None:
        self._note("down")

    async def renew(self, lane: Lane) -> None:
        if self.renew_fails:
            self.renew_fails -= 1
            raise TypeError("a bug in renew")
        self._note("renew")

    async def until(self, event: str, count: int = 1, timeout: float = 5) -> None:
        async with asyncio.timeout(timeout):
            while self.events.count(event) < count:
                self._changed.clear()
                await self._changed.wait()


def _state(url: str, **overrides) -> tuple[SharedState, Recorder]:
    s = settings(url, f"t{uuid.uuid4().hex[:12]}", redis_health_interval_s=0.1, **overrides)
    state = SharedState(s)
    recorder = Recorder()
    state.join(recorder)
    return state, recorder


async def test_started_without_redis_it_is_degraded_and_says_why():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state, recorder = _state(f"redis://127.0.0.1:{port}/0")
    await state.start()
    try:
        status = state.status()
        assert status["up"] is False and "ConnectionRefusedError" in status["error"], status
        assert recorder.events == ["down"]
        with pytest.raises(SharedUnavailable):
            await state.run(Recorder.scripts[0], evalsha(Recorder.scripts[0], [], [2]))
    finally:
        await state.stop()


async def test_participants_are_told_of_each_connection_and_outage(tmp_path, caplog):
    from redis_server import Unavailable, start_server

    try:
        srv = start_server(tmp_path)
    except Unavailable as e:
        services.missing("redis", str(e))
    caplog.set_level(logging.INFO, logger="gateway.redis.state")
    state, recorder = _state(srv.url)
    try:
        await state.start()
        assert state.up and recorder.events == ["connected"]
        await asyncio.to_thread(srv.stop)
        await recorder.until("down")
        assert not state.up
        await asyncio.to_thread(srv.start)  # empty, on the same port
        await recorder.until("connected", 2)
        assert state.up  # once every participant has taken the connection
        double = Recorder.scripts[0]
        assert await state.run(double, evalsha(double, [], [21])) == 42  # loaded on the new connection
    finally:
        await state.stop()
        await asyncio.to_thread(srv.kill)
    messages = [r.getMessage() for r in caplog.records if r.name == "gateway.redis.state"]
    assert sum("is unreachable" in m for m in messages) == 1, messages
    assert sum("reachable again" in m for m in messages) == 1, messages


async def test_a_script_redis_forgot_is_loaded_again(redis_server):
    state, _ = _state(redis_server.url)
    await state.start()
    try:
        double = Recorder.scripts[0]
        assert await state.run(double, evalsha(double, [], [4])) == 8
        assert await state.lane().call("SCRIPT", "FLUSH") == "OK"
        assert await state.run(double, evalsha(double, [], [5])) == 10
        assert state.up
    finally:
        await state.stop()


async def test_a_bug_in_a_background_loop_is_logged_and_the_loop_goes_on(redis_server, caplog):
    caplog.set_level(logging.ERROR, logger="gateway.redis.state")
    prefix = f"t{uuid.uuid4().hex[:12]}"
    s = settings(redis_server.url, prefix, redis_health_interval_s=0.1, redis_lease_s=0.3)
    state = SharedState(s)
    recorder = Recorder(renew_fails=1)
    state.join(recorder)
    await state.start()
    try:
        await recorder.until("renew")  # renewed again after the failed pass
    finally:
        await state.stop()
    (record,) = [r for r in caplog.records if "loop failed" in r.getMessage()]
    assert "the renew loop failed" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[0] is TypeError
