"""What processes tell each other through Redis besides limits: key revocations and summary claims.

- **Key revocation and rotation** (``KeyRevocations``): ``KeyStore.revoke``/``rotate`` publish the key's id;
  every process subscribes and forgets that key at once (milliseconds; ``key_cache_ttl_s``, at most 1 s,
  still bounds it when a message is lost, and bounds the CLI's revocations, which do not publish); a
  revoked key is never served from the last known good (gateway.store.keys). After Redis was away the
  whole cache is dropped: revocations published meanwhile were lost.
- **The summaries cache and coalescing** (``SummaryClaims``, for ``gateway.summaries.batcher``): a complete
  answer is stored under its set key for ``redis_summaries_ttl_s``; the first process to take the set's lock
  (renewed like a lease) makes the model call; the others wait for its outcome (pub/sub, polling every
  0.5 s; a lock of a dead process expires and a waiter takes it over).

Both go through redis-py (``SharedState.call``); a Redis failure is ``SharedUnavailable``
(``gateway.redis.errors``), and their callers go on without Redis.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import redis.asyncio as aredis

from gateway.config import GatewaySettings
from gateway.redis.errors import SharedUnavailable
from gateway.redis.lane import Lane, Script

log = logging.getLogger("gateway.redis.channels")

_SUMMARY_POLL_S = 0.5
_OUTCOME_TTL_S = 120  # the outcome of one coalesced summaries call, for the processes that waited for it


class SharedState(Protocol):
    """What the channels use of ``gateway.redis.state.SharedState`` (which builds them)."""

    settings: GatewaySettings
    prefix: str
    token: str
    lease_ms: int
    redis: aredis.Redis | None

    @property
    def up(self) -> bool: ...

    def channel(self, name: str) -> str: ...

    def subscribe(self, channel: str, handler: Callable[[str], None]) -> None: ...

    def join(self, participant: Any) -> None: ...

    def lease_id(self) -> str: ...

    async def call(self, what: str, command: Callable[[aredis.Redis], Awaitable[Any]]) -> Any: ...


class KeyCache(Protocol):
    """What key changes reach in each process: its key store's cache (gateway.store.keys.KeyStore), which
    publishes its own changes through ``on_change``."""

    on_change: Callable[[str, bool], Awaitable[None]] | None

    def forget_key(self, key_id: str, *, revoked: bool) -> None: ...

    def forget_all(self) -> None: ...


class KeyRevocations:
    """Key changes published to every process sharing the Redis (see the module docstring)."""

    scripts: tuple[Script, ...] = ()

    def __init__(self, state: SharedState, keys: KeyCache | None) -> None:
        self.state = state
        self.keys = keys
        self.channel = state.channel("keys")
        if keys is not None:
            keys.on_change = self.publish
            state.subscribe(self.channel, self._message)
            state.join(self)

    async def publish(self, key_id: str, revoked: bool) -> None:
        """KeyStore.revoke/rotate: every process forgets the key (best effort; the cache TTL bounds a lost
        message). The message is ``revoked <id>`` or ``changed <id>``."""
        state = self.state
        if not state.up:
            return
        message = f"{'revoked' if revoked else 'changed'} {key_id}"
        try:
            await state.call("publishing a key change", lambda r: r.publish(self.channel, message))
        except SharedUnavailable as e:
            log.warning("shared state: could not publish a key change: %s", e)

    def _message(self, data: str) -> None:
        if self.keys is None:
            return
        what, _, key_id = data.partition(" ")
        if what in ("revoked", "changed") and key_id:
            self.keys.forget_key(key_id, revoked=what == "revoked")
        else:  # a message of another form (an older gateway's): forget every key
            self.keys.forget_all()

    async def connected(self, lane: Lane) -> None:
        if self.keys is not None:
            self.keys.forget_all()  # revocations published while Redis was away were lost

    def down(self) -> None:
        pass

    async def renew(self, lane: Lane) -> None:
        pass


# KEYS: 1 answer 2 lock 3 outcome(known token); ARGV: 1 my token 2 lease_ms 3 known token ('' none)
# -> {1, answer} | {2, outcome} | {3} the lock is mine | {0, the lock holder's token}
SUMMARY_CLAIM = """
local a = redis.call('GET', KEYS[1])
if a then return {1, a} end
if ARGV[3] ~= '' then
  local o = redis.call('GET', KEYS[3])
  if o then return {2, o} end
end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2]) then return {3} end
return {0, redis.call('GET', KEYS[2]) or ''}
"""

# KEYS: 1 answer 2 lock 3 outcome(my token); ARGV: 1 token 2 blob 3 complete 4 answer_ttl 5 outcome_ttl
# 6 channel 7 set key
SUMMARY_DONE = """
if ARGV[3] == '1' then redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[4]) end
if ARGV[2] ~= '' then redis.call('SET', KEYS[3], ARGV[2], 'EX', ARGV[5]) end
if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
redis.call('PUBLISH', ARGV[6], ARGV[7])
return 0
"""

# KEYS: 1 lock; ARGV: 1 token 2 lease_ms
LOCK_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class SummaryClaims:
    """One model call per anomaly set across processes, and its answer cached in Redis."""

    scripts: tuple[Script, ...] = ()  # redis-py runs these (EVALSHA with a reload), not the lane

    def __init__(self, state: SharedState) -> None:
        self.state = state
        self.channel = state.channel("summaries")
        self._waiters: dict[str, set[asyncio.Future]] = {}  # set key -> waiting for its answer
        self._locks: dict[str, str] = {}  # lock key -> my token (renewed like leases)
        self._claim: Any = None
        self._done: Any = None
        self._lock_renew: Any = None
        state.subscribe(self.channel, self._message)
        state.join(self)

    def _scripts(self) -> tuple[Any, Any, Any]:
        if self._claim is None:
            r = self.state.redis
            assert r is not None, "SharedState.start registers the redis-py client"
            self._claim = r.register_script(SUMMARY_CLAIM)
            self._done = r.register_script(SUMMARY_DONE)
            self._lock_renew = r.register_script(LOCK_RENEW)
        return self._claim, self._done, self._lock_renew

    def _keys(self, set_key: str) -> tuple[str, str]:
        p = self.state.prefix
        return f"{p}:sum:answer:{set_key}", f"{p}:sum:lock:{set_key}"

    def _outcome_key(self, set_key: str, token: str) -> str:
        return f"{self.state.prefix}:sum:outcome:{set_key}:{token or '-'}"

    async def get(self, set_key: str) -> bytes | None:
        """The cached complete answer of a set, or None."""
        if not self.state.up:
            raise SharedUnavailable("Redis is down")
        return await self.state.call("reading a summaries answer", lambda r: r.get(self._keys(set_key)[0]))

    async def claim(self, set_key: str) -> tuple[str, Any]:
        """``("answer", blob)``: another process's outcome for the set (its complete answer, or what its
        call gave the requests that waited for it); ``("claimed", token)``: this process holds the set's
        lock and makes the call, then calls ``done``. Waits while another process holds it."""
        state = self.state
        answer_key, lock_key = self._keys(set_key)
        claim = self._scripts()[0]
        token = state.lease_id()
        known = ""
        while True:
            if not state.up:
                raise SharedUnavailable("Redis is down")
            fut = asyncio.get_running_loop().create_future()
            waiters = self._waiters.setdefault(set_key, set())
            waiters.add(fut)
            try:
                keys = [answer_key, lock_key, self._outcome_key(set_key, known)]
                values = [token, state.lease_ms, known]
                r = await state.call(
                    "claiming a summaries set", lambda _r, k=keys, v=values: claim(keys=k, args=v)
                )
                if r[0] in (1, 2):
                    return "answer", r[1]
                if r[0] == 3:
                    self._locks[lock_key] = token
                    return "claimed", token
                holder = r[1].decode() if isinstance(r[1], bytes) else str(r[1] or "")
                known = holder or known
                try:
                    async with asyncio.timeout(_SUMMARY_POLL_S):
                        await fut
                except TimeoutError:
                    pass
            finally:
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(set_key, None)

    async def done(self, set_key: str, token: str, blob: bytes, complete: bool) -> None:
        """Store the outcome (a complete answer also as the cache), free the lock, wake the waiters."""
        state = self.state
        answer_key, lock_key = self._keys(set_key)
        self._locks.pop(lock_key, None)
        if state.redis is None:
            return
        done = self._scripts()[1]
        keys = [answer_key, lock_key, self._outcome_key(set_key, token)]
        values = [
            token, blob, "1" if complete else "0", int(state.settings.redis_summaries_ttl_s), _OUTCOME_TTL_S,
            self.channel, set_key,
        ]  # fmt: skip
        try:
            await state.call("storing a summaries answer", lambda _r: done(keys=keys, args=values))
        except SharedUnavailable as e:  # waiters take the lock over once it expires
            log.warning("shared state: could not store a summaries answer: %s", e)

    def _message(self, set_key: str) -> None:
        for f in self._waiters.get(set_key, ()):
            if not f.done():
                f.set_result(True)

    async def connected(self, lane: Lane) -> None:
        pass

    def down(self) -> None:
        for futs in self._waiters.values():
            for f in futs:
                if not f.done():
                    f.set_result(False)

    async def renew(self, lane: Lane) -> None:
        if self._locks:
            renew = self._scripts()[2]
            for key, token in list(self._locks.items()):
                await self.state.call(
                    "renewing a summaries lock",
                    lambda _r, k=key, t=token: renew(keys=[k], args=[t, self.state.lease_ms]),
                )
