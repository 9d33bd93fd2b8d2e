"""This process's connection to the shared state: the lane, the redis-py client, health and pub/sub.

``SharedState`` knows Redis, not what is shared through it. What is shared joins as a ``Participant``:
the shared limits (``gateway.limits.redis``), key revocations and summary claims (``gateway.redis.channels``).
A participant names the lane scripts it runs (loaded at each connection), is told when a connection is
made (``connected``: its leases taken again, its counters seeded) and when Redis is lost (``down``), renews
its leases every ``redis_lease_s / 3`` (``renew``), and reads its pub/sub channels (``subscribe``).

**Health**: Redis counts as down from the first failure of either client (the lane's timeout
``redis_timeout_s``, a refused connection, an error reply): one WARNING line, ``/readyz`` 200 ``degraded``,
every participant told. A check every ``redis_health_interval_s`` reconnects (one INFO line). Every Redis
failure is translated by ``gateway.redis.errors`` (``SharedUnavailable``); the background loops here have
one last-resort guard each (``_keep``), which logs a bug with its traceback and starts the loop again.

One Redis (or a primary), not Redis Cluster: scripts touch keys of several projects.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import redis.asyncio as aredis
from redis.asyncio.connection import parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.config import ConfigError, GatewaySettings
from gateway.redis.channels import KeyCache, KeyRevocations, SummaryClaims
from gateway.redis.errors import REDIS_ERRORS, ReplyError, SharedUnavailable, describe, unavailable
from gateway.redis.lane import Lane, Script, open_lane

log = logging.getLogger("gateway.redis.state")


class Participant(Protocol):
    """Something shared through Redis (see the module docstring)."""

    scripts: tuple[Script, ...]  # lane scripts it runs: loaded at each connection

    async def connected(self, lane: Lane) -> None:
        """A new connection, before it counts as up (raise ``SharedUnavailable`` if it cannot be used)."""
        ...

    def down(self) -> None:
        """Redis was just lost: waiters give up, fallbacks take over."""
        ...

    async def renew(self, lane: Lane) -> None:
        """Every ``redis_lease_s / 3`` while up: keep this process's leases alive."""
        ...


class SharedState:
    """This process's connection to the shared state. Hangs off the Gateway (``gw.shared``); nothing at
    module level. ``summaries`` and ``revocations`` are its channels (``gateway.redis.channels``)."""

    def __init__(self, settings: GatewaySettings, *, keys: KeyCache | None = None) -> None:
        assert settings.redis_url
        self.settings = settings
        self.url = settings.redis_url
        try:
            self._params = parse_url(self.url)
        except ValueError as e:
            raise ConfigError(f"redis_url: {e}") from None
        p = self._params
        self.where = p.get("path") or f"{p.get('host', 'localhost')}:{p.get('port', 6379)}"
        self.prefix = settings.redis_key_prefix
        self.lease_s = settings.redis_lease_s
        self.lease_ms = int(settings.redis_lease_s * 1000)
        self.timeout_s = settings.redis_timeout_s
        self.interval_s = settings.redis_health_interval_s
        self.fallback_processes = settings.redis_fallback_processes
        self.refuse = settings.redis_outage == "refuse"  # while down: refuse, instead of each process's share
        self.token = os.urandom(6).hex()  # this process: lease ids, summary lock tokens
        self._seq = itertools.count()
        self._state: bool | None = None  # None: not known yet; True: up; False: down
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.outages = 0
        self.fallback_admissions = 0  # requests admitted by a fallback while Redis was down (metrics)
        self.redis: aredis.Redis | None = None
        self._lane: Lane | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._participants: list[Participant] = []
        self._scripts: dict[str, Script] = {}
        self._handlers: dict[str, Callable[[str], None]] = {}  # pub/sub channel -> handler of its messages
        self.revocations = KeyRevocations(self, keys)
        self.summaries = SummaryClaims(self)

    # --- participants ------------------------------------------------------------------------------
    def join(self, participant: Participant) -> None:
        self._participants.append(participant)
        for s in participant.scripts:
            self._scripts[s.sha] = s
        lane = self._lane
        if lane is not None and not lane.closed:  # joined after start: its scripts on this connection too
            lane.load(participant.scripts)

    def subscribe(self, channel: str, handler: Callable[[str], None]) -> None:
        """``handler(message)`` for each message on ``channel`` (from the next subscription on)."""
        self._handlers[channel] = handler

    def channel(self, name: str) -> str:
        return f"{self.prefix}:ch:{name}"

    # --- state ------------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._state is True

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"redis": self.where, "up": self.up}
        if not self.up:
            out["since_s"] = round(time.time() - self.down_since, 1) if self.down_since else None
            out["error"] = self.last_error
            out["fallback"] = self.outage_policy()
        return out

    def outage_policy(self) -> str:
        """What the limits do while Redis is down (``redis_outage``), in words."""
        if self.refuse:
            return "requests are refused (503, redis_outage: refuse)"
        return f"each process enforces 1/{self.fallback_processes} of each limit"

    def lost(self, err: BaseException | str) -> None:
        """Redis failed (``err``): count it down, close the lane, tell every participant."""
        if self._stopping:
            return
        was = self._state
        self._state = False
        lane, self._lane = self._lane, None
        if lane is not None and not lane.closed:
            lane.abort(err if isinstance(err, BaseException) else ConnectionError(err))
        if was is False:
            return
        self.down_since = time.time()
        self.last_error = describe(err)
        self.outages += 1
        log.warning(
            "shared state: Redis at %s is unreachable (%s): %s until it is back",
            self.where,
            self.last_error,
            self.outage_policy(),
        )
        for p in self._participants:
            p.down()

    def _mark_up(self) -> None:
        was = self._state
        self._state = True
        if was is False:
            log.info(
                "shared state: Redis at %s is reachable again after %.1f s: shared limits resumed",
                self.where,
                time.time() - (self.down_since or time.time()),
            )
        elif was is None:
            log.info(
                "shared state: limits, key revocations and summaries shared through Redis at %s", self.where
            )
        self.down_since = None
        self.last_error = None

    def _lane_lost(self, lane: Lane, err: BaseException) -> None:
        if lane is self._lane:
            self.lost(err)

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.redis = aredis.from_url(
            self.url,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        try:
            await self._connect()
        except (*REDIS_ERRORS, SharedUnavailable) as e:
            self.lost(e)
        else:
            self._mark_up()
        for name, loop in (
            ("health", self._health_loop),
            ("renew", self._renew_loop),
            ("pubsub", self._listen),
        ):
            self.spawn(self._keep(name, loop), f"shared-{name}")

    async def stop(self) -> None:
        await asyncio.sleep(0)  # the release/settle of the last requests, scheduled with call_soon
        lane = self._lane
        if lane is not None and lane.pending:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await asyncio.gather(*lane.pending, return_exceptions=True)
            except TimeoutError:
                pass
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if lane is not None:
            lane.close()
        self._lane = None
        if self.redis is not None:
            await self.redis.aclose()

    def spawn(self, coro: Awaitable[Any], name: str | None = None) -> asyncio.Task:
        """A background task of the shared state (cancelled by ``stop``)."""
        task = asyncio.ensure_future(coro)
        if name is not None:
            task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _connect(self) -> None:
        """Open the lane, load the scripts, let every participant take the connection (its leases again, its
        counters seeded). Raises (a Redis failure, or ``SharedUnavailable``) when Redis is not usable."""
        lane = await open_lane(self._params, self.timeout_s, self._lane_lost)
        try:
            lane.load(self._scripts.values())
            await lane.call("PING")  # answered after the scripts are loaded
            for p in self._participants:
                await p.connected(lane)
        except BaseException:
            lane.close()
            raise
        old, self._lane = self._lane, lane
        if old is not None:
            old.close()

    async def _keep(self, name: str, loop: Callable[[], Awaitable[None]]) -> None:
        """Run a background loop for the process's life."""
        while True:
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # last resort: a bug in one pass must not end the health check, the lease
                # renewal or pub/sub for the rest of the process's life (Redis failures are caught inside)
                log.exception(
                    "shared state: the %s loop failed; it starts again in %g s", name, self.interval_s
                )
                await asyncio.sleep(self.interval_s)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            _cancelled_meanwhile()
            if self._state is True:
                lane = self._lane
                try:
                    if lane is None:
                        raise ConnectionError("no connection")
                    await lane.call("PING")
                except REDIS_ERRORS as e:
                    self.lost(e)
                continue
            try:
                await self._connect()
            except (*REDIS_ERRORS, SharedUnavailable) as e:
                self.last_error = describe(e)
                continue
            self._mark_up()

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            _cancelled_meanwhile()
            lane = self._lane
            if self._state is not True or lane is None:
                continue
            try:
                for p in self._participants:
                    await p.renew(lane)
            except (*REDIS_ERRORS, SharedUnavailable) as e:  # the health check decides whether Redis is down
                log.debug("shared state: renewal failed: %s", describe(e))

    async def _listen(self) -> None:
        while True:
            _cancelled_meanwhile()
            if self._state is not True or self.redis is None or not self._handlers:
                await asyncio.sleep(self.interval_s)
                continue
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*self._handlers)
                _cancelled_meanwhile()
                async for msg in pubsub.listen():
                    self._dispatch(msg)
            except REDIS_ERRORS as e:
                print("LISTEN CAUGHT", repr(e))
                log.debug("shared state: pub/sub interrupted: %s", describe(e))
                await asyncio.sleep(self.interval_s)
            finally:
                try:
                    await pubsub.aclose()
                except REDIS_ERRORS:
                    pass

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("type") != "message":
            return
        channel, data = msg["channel"], msg["data"]
        if isinstance(channel, bytes):
            channel = channel.decode()
        if isinstance(data, bytes):
            data = data.decode(errors="replace")
        handler = self._handlers.get(channel)
        if handler is not None:
            handler(data)

    # --- use --------------------------------------------------------------------------------------
    def lease_id(self) -> str:
        return f"{self.token}:{next(self._seq):x}"

    def lane(self) -> Lane:
        """The lane while Redis is up; else ``SharedUnavailable``."""
        lane = self._lane
        if lane is None or self._state is not True:
            raise SharedUnavailable(self.last_error or "Redis is down")
        return lane

    async def run(self, script: Script, payload: bytes) -> Any:
        """One lane script call (``payload``: its whole EVALSHA); a Redis failure counts Redis down and raises
        ``SharedUnavailable``. A Redis that restarted (NOSCRIPT) gets the script again, and the call."""
        lane = self.lane()
        try:
            try:
                return await lane.send(payload)
            except ReplyError as e:
                if not e.noscript:
                    raise
                await lane.call("SCRIPT", "LOAD", script.source)
                return await lane.send(payload)
        except REDIS_ERRORS as e:
            self.lost(e)
            raise unavailable(e, f"script {script.name}") from e

    def send(self, payload: bytes) -> asyncio.Future:
        """Send without waiting (the reply's future: a failure there is ``gateway.redis.errors``'s); raises
        ``SharedUnavailable`` while Redis is down."""
        try:
            return self.lane().send(payload)
        except ConnectionError as e:  # closed between the check and the write
            raise unavailable(e) from e

    async def call(self, what: str, command: Callable[[aredis.Redis], Awaitable[Any]]) -> Any:
        """One redis-py command within ``redis_timeout_s``; a failure is ``SharedUnavailable`` (``what``
        failed), and Redis is not counted down for it (the health check decides)."""
        if self.redis is None:
            raise SharedUnavailable("not started")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await command(self.redis)
        except REDIS_ERRORS as e:
            raise unavailable(e, what) from e


def _cancelled_meanwhile() -> None:
    """Raise the cancellation of this task if one was swallowed: redis-py can swallow a cancellation that
    arrives while it connects (``subscribe`` then returns as if nothing happened, and the loop would go on
    for ever, ``stop`` waiting for it)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
