"""Shared state for many gateway processes and machines, on Redis (``redis_url``).

With ``redis_url`` set, every gateway process that uses the same Redis (and ``redis_key_prefix``) shares:

- **Limits** (``SharedLimits``, the same interface as ``gateway.limits.local.Limits``). One admission is one
  Lua script, one round trip: it checks the daily budget, rpm and tpm (GCRA on Redis' clock, so
  ``Retry-After`` comes from Redis), reserves tokens and budget, and takes a concurrency slot or a place
  in the queue. A slot is a *lease*: a member of a sorted set scored by its expiry, which every admission
  first sweeps. A per-process task renews all of its live leases every ``redis_lease_s / 3``, so a process
  that dies (SIGKILL) frees its slots and budget reservations within ``redis_lease_s``. ``release`` and
  ``settle`` (the proxy calls one right after the other) become one more script, one round trip, sent
  without waiting for its answer. A request that finds every slot taken waits up to ``queue_timeout_s``:
  a release publishes on a channel when someone waits, which wakes one waiter in each process; waiters
  also poll (25 ms doubling to 250 ms, never later than the oldest lease's expiry), which covers the
  slots of a dead process that expire without a release. Waiters may be overtaken by newcomers (no
  global FIFO).
- **The daily budget**: one counter per project and UTC day (``used``) plus the reservations of the
  requests in flight; a request is admitted only while used + reserved is under the budget, so the budget
  is overshot by at most one request's reservation. The first process to find a day without its marker
  key (``SET NX``: Redis started empty, or a new day) rebuilds the counters from the ledger
  (``gateway.store.ledger.tokens_used_today``), so processes sharing Redis should share the ledger database.
  The daily cost budget is the same in the same scripts: a counter per project and day, in nano-dollars
  (integers, as INCRBY needs), and its own reservations on the same leases, rebuilt with the token counters
  (``gateway.store.ledger.cost_used_today``).
- **Key revocation and rotation**: ``KeyStore.revoke``/``rotate`` publish; every process subscribes and
  drops its key cache at once (milliseconds; ``key_cache_ttl_s``, at most 1 s, still bounds it when a
  message is lost, and bounds the CLI's revocations, which do not publish).
- **The summaries cache and coalescing** (``gateway.summaries.batcher``): a complete answer is stored under
its set
  key with ``redis_summaries_ttl_s``; the first process to take the set's lock (renewed like a lease)
  makes the model call; the others wait for its answer (pub/sub, polling every 0.5 s; a lock of a dead
  process expires and a waiter takes it over).

**Redis down**: every process keeps serving with its own limits: each limit divided by
``redis_fallback_processes`` (``gateway.limits.local.share_of``; the budget's used part from the last counter
seen). ``/readyz`` answers 200 ``{"status": "degraded", ...}``, the gauge ``gateway_shared_state_up`` is 0,
and one WARNING line says so (one INFO line when it is back). A health check every
``redis_health_interval_s`` reconnects; shared limits then resume by themselves, the tokens used during
the outage are added to the shared counters (unless Redis came back empty: then the ledger rebuilds them),
and every key cache is dropped (revocations published meanwhile were lost).

The two per-request scripts go through ``_Lane``, one pipelined connection speaking RESP directly, because
redis-py's asyncio client measured over the target: admit + release + settle cost 157-365 us of CPU per
request through it (pool, hiredis, EVALSHA) against 28-72 us through ``_Lane`` (``python -m benchmarks
shared``; the target is 150). Everything else (pub/sub, seeding, summaries) uses the redis-py client.
One Redis (or a primary), not Redis Cluster: scripts touch a global key.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
import os
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import redis.asyncio as aredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.config import ConfigError, GatewaySettings, ProjectConfig
from gateway.limits.local import LimitExceeded, ProjectLimits, share_of

if TYPE_CHECKING:
    from gateway.store.keys import KeyStore

log = logging.getLogger("gateway.redis.shared")

DAY_MS = 86_400_000
_POLL_START_S = 0.025
_POLL_MAX_S = 0.25
_SUMMARY_POLL_S = 0.5
_LAST_TTL_S = 120  # the outcome of one coalesced summaries call, for the processes that waited for it
NANO_USD = 1_000_000_000  # cost counters in Redis are integers: nano-dollars


def _nanos(usd: float) -> int:
    return max(0, round(usd * NANO_USD))


class SharedUnavailable(Exception):
    """Redis cannot be used right now; the caller falls back to this process's own state."""


# --- Lua ---------------------------------------------------------------------------------------------
_NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"""

# held: the leases holding a budget reservation (token and/or cost); amounts/total: the token
# reservations per lease and their sum; camounts/ctotal: the same for the cost budget (nano-dollars)
_EXPIRE_RESERVATIONS = """
local function drop_expired(dead, amounts, total)
  local r = tonumber(redis.call('GET', total) or 0)
  if #dead > 0 then
    local sum = 0
    local vals = redis.call('HMGET', amounts, unpack(dead))
    for i = 1, #vals do if vals[i] then sum = sum + tonumber(vals[i]) end end
    if sum > 0 then
      redis.call('HDEL', amounts, unpack(dead))
      r = math.max(0, r - sum)
      redis.call('SET', total, r)
    end
  end
  return r
end
local function expire_reservations(held, amounts, total, camounts, ctotal, now)
  local dead = redis.call('ZRANGEBYSCORE', held, '-inf', now, 'LIMIT', 0, 500)
  local r = drop_expired(dead, amounts, total)
  local cr = drop_expired(dead, camounts, ctotal)
  if #dead > 0 then redis.call('ZREM', held, unpack(dead)) end
  return r, cr
end
-- a lease's reservation in amounts (and its part of total) goes back
local function unreserve(lid, amounts, total)
  local amt = redis.call('HGET', amounts, lid)
  if amt then
    redis.call('HDEL', amounts, lid)
    if redis.call('DECRBY', total, amt) < 0 then redis.call('SET', total, 0) end
  end
end
"""

# KEYS: 1 slots 2 queue 3 held 4 resamt 5 reserved 6 rpm 7 tpm 8 used(day) 9 seeded(day)
#       10 cost(day) 11 cresamt 12 creserved
# ARGV: 1 lid 2 lease_ms 3 max_concurrency 4 rpm 5 tpm 6 tpm_reserve 7 budget 8 budget_reserve 9 day
#       10 cost_budget 11 cost_reserve (nano-dollars)
# -> {0, used, reserved} a slot | {1, used, reserved, ms to the oldest lease's expiry} queued |
#    {2, why, retry_ms, used, reserved} refused (1 budget spent, 2 budget reserved, 3 rpm, 4 tpm,
#    5 cost budget spent, 6 cost budget reserved: then used and reserved are the cost's) |
#    {3} the day's budget counters are not seeded yet
ADMIT = (
    _NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid, lease = ARGV[1], tonumber(ARGV[2])
local budget, cbudget = tonumber(ARGV[7]), tonumber(ARGV[10])
local used, reserved = 0, 0
if budget > 0 or cbudget > 0 then
  if redis.call('EXISTS', KEYS[9]) == 0 then return {3} end
  local creserved
  reserved, creserved = expire_reservations(KEYS[3], KEYS[4], KEYS[5], KEYS[11], KEYS[12], now)
  if cbudget > 0 then
    local cused = tonumber(redis.call('GET', KEYS[10]) or 0)
    if cused + creserved >= cbudget then
      if cused >= cbudget then
        return {2, 5, math.max(1000, (tonumber(ARGV[9]) + 1) * 86400000 - now), cused, creserved}
      end
      return {2, 6, 1000, cused, creserved}
    end
  end
end
if budget > 0 then
  used = tonumber(redis.call('GET', KEYS[8]) or 0)
  if used + reserved >= budget then
    if used >= budget then
      return {2, 1, math.max(1000, (tonumber(ARGV[9]) + 1) * 86400000 - now), used, reserved}
    end
    return {2, 2, 1000, used, reserved}
  end
end
local rpm_tat, tpm_tat
local rpm = tonumber(ARGV[4])
if rpm > 0 then
  rpm_tat = math.max(tonumber(redis.call('GET', KEYS[6]) or 0), now) + 60000 / rpm
  if rpm_tat - now > 60000.001 then return {2, 3, math.ceil(rpm_tat - now - 60000), used, reserved} end
end
local tpm, reserve = tonumber(ARGV[5]), tonumber(ARGV[6])
if tpm > 0 then
  tpm_tat = math.max(tonumber(redis.call('GET', KEYS[7]) or 0), now) + reserve * 60000 / tpm
  if tpm_tat - now > 60000.001 then return {2, 4, math.ceil(tpm_tat - now - 60000), used, reserved} end
end
if rpm_tat then redis.call('SET', KEYS[6], tostring(rpm_tat), 'PX', math.ceil(rpm_tat - now) + 1000) end
if tpm_tat then redis.call('SET', KEYS[7], tostring(tpm_tat), 'PX', math.ceil(tpm_tat - now) + 1000) end
if budget > 0 then
  local br = tonumber(ARGV[8])
  reserved = redis.call('INCRBY', KEYS[5], br)
  redis.call('HSET', KEYS[4], lid, br)
end
if cbudget > 0 then
  redis.call('INCRBY', KEYS[12], ARGV[11])
  redis.call('HSET', KEYS[11], lid, ARGV[11])
end
if budget > 0 or cbudget > 0 then redis.call('ZADD', KEYS[3], now + lease, lid) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + lease, lid)
  return {0, used, reserved}
end
redis.call('ZADD', KEYS[2], now + lease, lid)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {1, used, reserved, math.floor(tonumber(first[2]) - now)}
"""
)

# A queued request tries again for a slot. KEYS: 1 slots 2 queue; ARGV: 1 lid 2 lease_ms 3 max_concurrency
# -> {0} a slot | {1, ms to the oldest lease's expiry}
SLOT = (
    _NOW
    + """
local lid, lease = ARGV[1], tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZREM', KEYS[2], lid)
  redis.call('ZADD', KEYS[1], now + lease, lid)
  return {0}
end
redis.call('ZADD', KEYS[2], now + lease, lid)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {1, math.floor(tonumber(first[2]) - now)}
"""
)

# Release and/or settle. KEYS: 1 slots 2 queue 3 held 4 resamt 5 reserved 6 tpm 7 used(day)
# 8 cresamt 9 creserved 10 cost(day)
# ARGV: 1 lid 2 release 3 settle 4 tpm 5 tpm_reserve 6 actual 7 channel 8 project 9 count_used 10 used_ttl_s
# 11 actual cost (nano-dollars) 12 count_cost
# -> {the day's used tokens, the day's cost} after settling (-1: not counted)
SETTLE = (
    _NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid = ARGV[1]
if ARGV[2] == '1' and redis.call('ZREM', KEYS[1], lid) == 1 then
  if redis.call('ZCOUNT', KEYS[2], now, '+inf') > 0 then redis.call('PUBLISH', ARGV[7], ARGV[8]) end
end
local used, cused = -1, -1
if ARGV[3] == '1' then
  local tpm, actual = tonumber(ARGV[4]), tonumber(ARGV[6])
  local delta = actual - tonumber(ARGV[5])
  if tpm > 0 and delta ~= 0 then
    local tat = math.max(math.max(tonumber(redis.call('GET', KEYS[6]) or 0), now) + delta * 60000 / tpm, now)
    if tat > now then
      redis.call('SET', KEYS[6], tostring(tat), 'PX', math.ceil(tat - now) + 1000)
    else
      redis.call('DEL', KEYS[6])
    end
  end
  unreserve(lid, KEYS[4], KEYS[5])
  unreserve(lid, KEYS[8], KEYS[9])
  redis.call('ZREM', KEYS[3], lid)
  if ARGV[9] == '1' then
    if actual > 0 then
      used = redis.call('INCRBY', KEYS[7], actual)
      redis.call('EXPIRE', KEYS[7], ARGV[10])
    else
      used = tonumber(redis.call('GET', KEYS[7]) or 0)
    end
  end
  if ARGV[12] == '1' then
    if tonumber(ARGV[11]) > 0 then
      cused = redis.call('INCRBY', KEYS[10], ARGV[11])
      redis.call('EXPIRE', KEYS[10], ARGV[10])
    else
      cused = tonumber(redis.call('GET', KEYS[10]) or 0)
    end
  end
end
return {used, cused}
"""
)

# A request that was not admitted after all (queue timeout, cancelled): its queue place, rpm slot, tpm
# and budget reservations go back. KEYS: 1 queue 2 held 3 resamt 4 reserved 5 rpm 6 tpm 7 cresamt
# 8 creserved; ARGV: 1 lid 2 rpm 3 tpm 4 tpm_reserve
REFUND = (
    _NOW
    + _EXPIRE_RESERVATIONS
    + """
local lid = ARGV[1]
redis.call('ZREM', KEYS[1], lid)
local function give_back(key, ms)
  local tat = tonumber(redis.call('GET', key) or 0)
  if tat > now then
    tat = math.max(tat - ms, now)
    if tat > now then redis.call('SET', key, tostring(tat), 'PX', math.ceil(tat - now) + 1000)
    else redis.call('DEL', key) end
  end
end
local rpm, tpm, reserve = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if rpm > 0 then give_back(KEYS[5], 60000 / rpm) end
if tpm > 0 and reserve > 0 then give_back(KEYS[6], reserve * 60000 / tpm) end
unreserve(lid, KEYS[3], KEYS[4])
unreserve(lid, KEYS[7], KEYS[8])
redis.call('ZREM', KEYS[2], lid)
return 0
"""
)

# Renew live leases: 'XX' only those still there (an expired one stays gone); 'ADD' puts them back (a
# reconnection: the requests that kept running while Redis was away count again). KEYS: 1 zset;
# ARGV: 1 lease_ms 2 mode 3.. lids
RENEW = (
    _NOW
    + """
local exp = now + tonumber(ARGV[1])
for i = 3, #ARGV do
  if ARGV[2] == 'XX' then redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i])
  else redis.call('ZADD', KEYS[1], exp, ARGV[i]) end
end
return 0
"""
)

# The first process to find the day unseeded sets the counters from the ledger.
# KEYS: 1 seeded(day) 2.. used(project, day); ARGV: 1 ttl_s 2.. tokens
SEED = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[i], 'EX', ARGV[1]) end
  return 1
end
return 0
"""

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


class _Script:
    __slots__ = ("name", "source", "sha")

    def __init__(self, name: str, source: str) -> None:
        self.name, self.source = name, source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


_LANE_SCRIPTS = {s.name: s for s in (_Script(n, src) for n, src in [
    ("admit", ADMIT), ("slot", SLOT), ("settle", SETTLE), ("refund", REFUND), ("renew", RENEW),
])}  # fmt: skip


# --- RESP on one pipelined connection ----------------------------------------------------------------
class ReplyError(Exception):
    """An error reply from Redis (``-ERR ...``, ``-NOSCRIPT ...``)."""

    @property
    def noscript(self) -> bool:
        return str(self).startswith("NOSCRIPT")


class _Incomplete(Exception):
    pass


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


def _parse(buf: bytearray, pos: int) -> tuple[Any, int]:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        raise _Incomplete
    kind = buf[pos]
    nxt = end + 2
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
            v, nxt = _parse(buf, nxt)
            items.append(v)
        return items, nxt
    if kind == 43:  # '+'
        return buf[pos + 1 : end].decode(), nxt
    if kind == 45:  # '-'
        return ReplyError(buf[pos + 1 : end].decode(errors="replace")), nxt
    raise ConnectionError(f"unexpected byte {kind!r} from Redis")


class _Lane(asyncio.Protocol):
    """One connection, commands written as they come and answers matched in order (pipelining). A command
    unanswered after ``timeout_s`` aborts the connection: every pending command fails and ``on_lost``
    is called (the shared state then counts Redis as down)."""

    def __init__(self, timeout_s: float, on_lost: Callable[[_Lane, BaseException], None]) -> None:
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
        self._transport = transport  # type: ignore[assignment]

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
                value, pos = _parse(buf, pos)
            except _Incomplete:
                break
            except (ValueError, ConnectionError) as e:
                self.abort(ConnectionError(f"bad reply from Redis: {e}"))
                return
            if not pending:
                self.abort(ConnectionError("a reply from Redis nobody asked for"))
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
    def send(self, payload: bytes) -> asyncio.Future:
        if self.closed or self._transport is None:
            raise ConnectionError("not connected to Redis")
        loop = self._loop
        fut = loop.create_future()
        self._pending.append((fut, loop.time()))
        self._transport.write(payload)
        if self._timer is None:
            self._timer = loop.call_later(self._timeout, self._watch)
        return fut

    async def call(self, *args: Any) -> Any:
        return await self.send(pack(*args))

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


async def _open_lane(
    params: dict[str, Any], timeout_s: float, on_lost: Callable[[_Lane, BaseException], None]
) -> _Lane:
    loop = asyncio.get_running_loop()
    lane = _Lane(timeout_s, on_lost)
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


# --- the shared state of one gateway process ---------------------------------------------------------
class SharedState:
    """This process's connection to the shared state: the lane, the redis-py client, pub/sub, lease
    renewal and the health check. Hangs off the Gateway (``gw.shared``); nothing at module level."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        seed_source: Callable[[], Awaitable[dict[str, int]]],
        cost_seed_source: Callable[[], Awaitable[dict[str, float]]] | None = None,
        keys: KeyStore | None = None,
    ) -> None:
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
        self.projects = settings.projects
        self._seed_source = seed_source
        self._cost_seed_source = cost_seed_source  # None: cost counters start from 0
        self.keys = keys
        self.token = os.urandom(6).hex()  # this process: lease ids, summary lock tokens
        self._seq = itertools.count()
        self._state: bool | None = None  # None: not known yet; True: up; False: down
        self.down_since: float | None = None
        self.last_error: str | None = None
        self.outages = 0
        self.fallback_admissions = 0
        self.redis: aredis.Redis | None = None
        self._lane: _Lane | None = None
        self._tasks: set[asyncio.Task] = set()
        self._stopping = False
        self._waiters: dict[str, deque[asyncio.Future]] = {}  # project -> waiting for a release
        self._summary_waiters: dict[str, set[asyncio.Future]] = {}  # set key -> waiting for its answer
        self._locks: dict[str, str] = {}  # summary lock key -> my token (renewed like leases)
        self._seeding: dict[int, asyncio.Future[bool]] = {}
        self._pending_used: dict[tuple[str, int], int] = {}  # tokens used while Redis was down
        self._pending_cost: dict[tuple[str, int], int] = {}  # nano-dollars spent while Redis was down
        self.limits: SharedLimits | None = None
        self.ch_release = f"{self.prefix}:ch:release"
        self.ch_keys = f"{self.prefix}:ch:keys"
        self.ch_summaries = f"{self.prefix}:ch:summaries"
        self._sum_claim: Any = None
        self._sum_done: Any = None
        self._lock_renew: Any = None
        self._seed: Any = None

    # --- state ------------------------------------------------------------------------------------
    @property
    def up(self) -> bool:
        return self._state is True

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"redis": self.where, "up": self.up}
        if not self.up:
            out["since_s"] = round(time.time() - self.down_since, 1) if self.down_since else None
            out["error"] = self.last_error
            out["fallback"] = f"each process enforces 1/{self.fallback_processes} of each limit"
        return out

    def _mark_down(self, err: BaseException | str) -> None:
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
        self.last_error = _describe(err)
        self.outages += 1
        log.warning(
            "shared state: Redis at %s is unreachable (%s): serving with this process's own limits "
            "(1/%d of each) until it is back",
            self.where,
            self.last_error,
            self.fallback_processes,
        )
        if self.limits is not None:
            self.limits.on_down()
        for dq in self._waiters.values():  # waiters retry now, and fall back
            while dq:
                f = dq.popleft()
                if not f.done():
                    f.set_result(False)
        for futs in self._summary_waiters.values():
            for f in futs:
                if not f.done():
                    f.set_result(False)

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

    def _lane_lost(self, lane: _Lane, err: BaseException) -> None:
        if lane is self._lane:
            self._mark_down(err)

    # --- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        self.redis = aredis.from_url(
            self.url,
            socket_timeout=self.timeout_s,
            socket_connect_timeout=self.timeout_s,
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
        )
        r = self.redis
        self._sum_claim = r.register_script(SUMMARY_CLAIM)
        self._sum_done = r.register_script(SUMMARY_DONE)
        self._lock_renew = r.register_script(LOCK_RENEW)
        self._seed = r.register_script(SEED)
        if self.keys is not None:
            self.keys.on_change = self.keys_changed
        try:
            await self._connect()
        except Exception as e:
            self._mark_down(e)
        else:
            self._mark_up()
        for coro, name in (
            (self._health_loop(), "health"),
            (self._renew_loop(), "renew"),
            (self._listen_loop(), "pubsub"),
        ):
            task = asyncio.create_task(coro, name=f"shared-{name}")
            self._tasks.add(task)

    async def stop(self) -> None:
        await asyncio.sleep(0)  # the release/settle of the last requests, scheduled with call_soon
        lane = self._lane
        if lane is not None and lane._pending:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await asyncio.gather(*(f for f, _ in list(lane._pending)), return_exceptions=True)
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

    async def _connect(self) -> None:
        """Open the lane, load the scripts, seed the day's counters (when Redis came back empty) and add
        the tokens used while Redis was down. Raises when Redis is not usable."""
        lane = await _open_lane(self._params, self.timeout_s, self._lane_lost)
        try:
            for s in _LANE_SCRIPTS.values():
                _ignore(lane.send(pack("SCRIPT", "LOAD", s.source)))
            if self.limits is not None:  # the requests still running hold their slots again
                for pl in self.limits.projects.values():
                    if pl._slots:
                        payload = _eval(
                            _LANE_SCRIPTS["renew"], [pl.k_slots], [self.lease_ms, "ADD", *pl._slots]
                        )
                        _ignore(lane.send(payload))
            await lane.call("PING")
            seeded = await self.ensure_seeded(_today())
            await self._push_pending(seeded)
        except BaseException:
            lane.close()
            raise
        old, self._lane = self._lane, lane
        if old is not None:
            old.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            if self._state is True:
                lane = self._lane
                try:
                    if lane is None:
                        raise ConnectionError("no connection")
                    await lane.call("PING")
                except Exception as e:
                    self._mark_down(e)
                continue
            try:
                await self._connect()
            except Exception as e:
                self.last_error = _describe(e)
                continue
            self._mark_up()
            if self.keys is not None:
                self.keys._forget()  # revocations published while Redis was down were lost

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            lane = self._lane
            if self._state is not True or lane is None:
                continue
            try:
                if self.limits is not None:
                    for pl in self.limits.projects.values():
                        for key, lids in pl.live():
                            if lids:
                                payload = _eval(_LANE_SCRIPTS["renew"], [key], [self.lease_ms, "XX", *lids])
                                _ignore(lane.send(payload))
                for key, token in list(self._locks.items()):
                    await self._lock_renew(keys=[key], args=[token, self.lease_ms])
            except Exception as e:  # the health check decides whether Redis is down
                log.debug("shared state: renewal failed: %s", e)

    async def _listen_loop(self) -> None:
        while True:
            if self._state is not True or self.redis is None:
                await asyncio.sleep(self.interval_s)
                continue
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.ch_release, self.ch_keys, self.ch_summaries)
                async for msg in pubsub.listen():
                    self._dispatch(msg)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.debug("shared state: pub/sub interrupted: %s", e)
                await asyncio.sleep(self.interval_s)
            finally:
                try:
                    await pubsub.aclose()
                except Exception:
                    pass

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if msg.get("type") != "message":
            return
        channel, data = msg["channel"], msg["data"]
        if isinstance(channel, bytes):
            channel = channel.decode()
        if isinstance(data, bytes):
            data = data.decode(errors="replace")
        if channel == self.ch_release:
            self.wake(data)
        elif channel == self.ch_keys:
            if self.keys is not None:
                self.keys._forget()
        elif channel == self.ch_summaries:
            for f in self._summary_waiters.get(data, ()):
                if not f.done():
                    f.set_result(True)

    # --- the hot path -----------------------------------------------------------------------------
    def lease_id(self) -> str:
        return f"{self.token}:{next(self._seq):x}"

    def lane(self) -> _Lane:
        lane = self._lane
        if lane is None or self._state is not True:
            raise SharedUnavailable(self.last_error or "Redis is down")
        return lane

    async def run(self, script: str, payload: bytes) -> Any:
        """One lane script call; a Redis failure marks it down and raises SharedUnavailable."""
        lane = self.lane()
        try:
            return await lane.send(payload)
        except ReplyError as e:
            if e.noscript:
                s = _LANE_SCRIPTS[script]
                try:
                    await lane.call("SCRIPT", "LOAD", s.source)
                    return await lane.send(payload)
                except (ReplyError, ConnectionError, OSError, TimeoutError) as e2:
                    self._mark_down(e2)
                    raise SharedUnavailable(str(e2)) from e2
            self._mark_down(e)
            raise SharedUnavailable(str(e)) from e
        except (ConnectionError, OSError, TimeoutError) as e:
            self._mark_down(e)
            raise SharedUnavailable(str(e)) from e

    def wait_release(self, project: str, delay: float) -> Awaitable[bool]:
        """Until a release in ``project`` wakes this waiter (True) or ``delay`` passes (False)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        dq = self._waiters.get(project)
        if dq is None:
            dq = self._waiters[project] = deque()
        dq.append(fut)
        handle = loop.call_later(delay, _resolve, fut, False)

        async def wait() -> bool:
            try:
                return await fut
            finally:
                handle.cancel()
                if fut.cancelled() or not fut.result():
                    try:
                        dq.remove(fut)
                    except ValueError:
                        pass

        return wait()

    def wake(self, project: str) -> None:
        """A slot of ``project`` was released: one waiter of this process tries again."""
        dq = self._waiters.get(project)
        while dq:
            f = dq.popleft()
            if not f.done():
                f.set_result(True)
                return

    # --- budget seeding ---------------------------------------------------------------------------
    def used_key(self, project: str, day: int) -> str:
        return f"{self.prefix}:p:{project}:used:{day}"

    def cost_key(self, project: str, day: int) -> str:
        return f"{self.prefix}:p:{project}:cost:{day}"

    def seeded_key(self, day: int) -> str:
        return f"{self.prefix}:seeded:{day}"

    async def ensure_seeded(self, day: int) -> bool:
        """Seed the day's budget counters from the ledger unless a process did already (one marker key per
        day, SET NX). True when this call seeded them. Concurrent callers share one ledger query."""
        fut = self._seeding.get(day)
        if fut is None:
            fut = asyncio.ensure_future(self._seed_day(day))
            self._seeding[day] = fut
            fut.add_done_callback(
                lambda f: self._seeding.pop(day, None) if self._seeding.get(day) is f else None
            )
        return await asyncio.shield(fut)

    async def _seed_day(self, day: int) -> bool:
        budgets = [n for n, c in self.projects.items() if c.daily_token_budget is not None]
        cbudgets = [n for n, c in self.projects.items() if c.daily_cost_budget_usd is not None]
        if not (budgets or cbudgets) or self.redis is None:
            return False
        if await self.redis.exists(self.seeded_key(day)):
            return False
        used = await self._seed_source() if budgets else {}
        cost = await self._cost_seed_source() if cbudgets and self._cost_seed_source is not None else {}
        done = await self._seed(
            keys=[
                self.seeded_key(day),
                *(self.used_key(p, day) for p in budgets),
                *(self.cost_key(p, day) for p in cbudgets),
            ],
            args=[
                2 * 86400,
                *(int(used.get(p, 0)) for p in budgets),
                *(_nanos(cost.get(p, 0.0)) for p in cbudgets),
            ],
        )
        if done:
            log.info("shared state: daily budgets of day %d rebuilt from the ledger", day)
            if self.limits is not None:
                for p in budgets:
                    self.limits.projects[p].saw_used(day, int(used.get(p, 0)))
                for p in cbudgets:
                    self.limits.projects[p].saw_cost(day, _nanos(cost.get(p, 0.0)))
        return bool(done)

    def add_pending(self, project: str, tokens: int) -> None:
        """Tokens used while Redis was down: added to the shared counter when it is back."""
        if tokens > 0 and self.projects[project].daily_token_budget is not None:
            k = (project, _today())
            self._pending_used[k] = self._pending_used.get(k, 0) + tokens

    def add_pending_cost(self, project: str, usd: float) -> None:
        """US dollars spent while Redis was down: added to the shared cost counter when it is back."""
        if usd > 0 and self.projects[project].daily_cost_budget_usd is not None:
            k = (project, _today())
            self._pending_cost[k] = self._pending_cost.get(k, 0) + _nanos(usd)

    async def _push_pending(self, seeded: bool) -> None:
        pending, self._pending_used = self._pending_used, {}
        pending_cost, self._pending_cost = self._pending_cost, {}
        today = _today()
        if seeded or not (pending or pending_cost) or self.redis is None:
            return  # seeded: the ledger counted them
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                for counts, key in ((pending, self.used_key), (pending_cost, self.cost_key)):
                    for (project, day), n in counts.items():
                        if day == today:
                            pipe.incrby(key(project, day), n)
                            pipe.expire(key(project, day), 2 * 86400)
                await pipe.execute()
        except BaseException:
            for k, v in pending.items():
                self._pending_used[k] = self._pending_used.get(k, 0) + v
            for k, v in pending_cost.items():
                self._pending_cost[k] = self._pending_cost.get(k, 0) + v
            raise

    # --- key invalidation -------------------------------------------------------------------------
    async def keys_changed(self) -> None:
        """KeyStore.revoke/rotate: every process drops its key cache (best effort; the cache TTL bounds
        a lost message)."""
        if self.redis is None or not self.up:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.redis.publish(self.ch_keys, self.token)
        except Exception as e:
            log.warning("shared state: could not publish a key change: %s", _describe(e))

    # --- summaries --------------------------------------------------------------------------------
    def _sum_keys(self, set_key: str) -> tuple[str, str]:
        return f"{self.prefix}:sum:answer:{set_key}", f"{self.prefix}:sum:lock:{set_key}"

    def _sum_outcome_key(self, set_key: str, token: str) -> str:
        return f"{self.prefix}:sum:outcome:{set_key}:{token or '-'}"

    async def summary_get(self, set_key: str) -> bytes | None:
        """The cached complete answer of a set, or None."""
        if not self.up or self.redis is None:
            raise SharedUnavailable("Redis is down")
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.redis.get(self._sum_keys(set_key)[0])
        except Exception as e:
            raise SharedUnavailable(_describe(e)) from e

    async def summary_claim(self, set_key: str) -> tuple[str, Any]:
        """``("answer", blob)``: another process's outcome for the set (its complete answer, or what its
        call gave the requests that waited for it); ``("claimed", token)``: this process holds the set's
        lock and makes the call, then calls ``summary_done``. Waits while another process holds it."""
        answer_key, lock_key = self._sum_keys(set_key)
        token = self.lease_id()
        known = ""
        while True:
            if not self.up:
                raise SharedUnavailable("Redis is down")
            fut = asyncio.get_running_loop().create_future()
            waiters = self._summary_waiters.setdefault(set_key, set())
            waiters.add(fut)
            try:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        r = await self._sum_claim(
                            keys=[answer_key, lock_key, self._sum_outcome_key(set_key, known)],
                            args=[token, self.lease_ms, known],
                        )
                except Exception as e:
                    raise SharedUnavailable(_describe(e)) from e
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
                    self._summary_waiters.pop(set_key, None)

    async def summary_done(self, set_key: str, token: str, blob: bytes, complete: bool) -> None:
        """Store the outcome (a complete answer also as the cache), free the lock, wake the waiters."""
        answer_key, lock_key = self._sum_keys(set_key)
        self._locks.pop(lock_key, None)
        if self.redis is None:
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._sum_done(
                    keys=[answer_key, lock_key, self._sum_outcome_key(set_key, token)],
                    args=[
                        token,
                        blob,
                        "1" if complete else "0",
                        int(self.settings.redis_summaries_ttl_s),
                        _LAST_TTL_S,
                        self.ch_summaries,
                        set_key,
                    ],
                )
        except Exception as e:  # waiters take the lock over once it expires
            log.warning("shared state: could not store a summaries answer: %s", _describe(e))


# --- shared limits -------------------------------------------------------------------------------------
class _FallbackLimits(ProjectLimits):
    """This process's share of a project's limits, used while Redis is down; its usage is added to the
    shared counter once Redis is back."""

    def __init__(
        self, name: str, cfg: ProjectConfig, used_today: int, shared: SharedState, cost_today: float = 0.0
    ) -> None:
        super().__init__(name, cfg, used_today, cost_today=cost_today)
        self._shared = shared

    def _settle(
        self, reserved: int, budget_reserved: int, actual: int, cost_reserved: float = 0.0, cost: float = 0.0
    ) -> None:
        super()._settle(reserved, budget_reserved, actual, cost_reserved, cost)
        self._shared.add_pending(self.name, actual)
        self._shared.add_pending_cost(self.name, cost)


class SharedAdmission:
    """An admission through Redis. ``release`` and ``settle`` are sent together as one script (they are
    called one right after the other), without waiting for the answer."""

    __slots__ = (
        "project", "lid", "day", "reserved_tokens", "budget_reserved", "queue_wait_s", "released",
        "_release_due", "_settle_due", "_actual", "_scheduled", "_cost",
    )  # fmt: skip

    def __init__(self, project: SharedProjectLimits, lid: str, day: int, reserve: int, budget: int) -> None:
        self.project = project
        self.lid = lid
        self.day = day
        self.reserved_tokens = reserve
        self.budget_reserved = budget
        self._cost = 0.0  # US dollars to settle
        self.queue_wait_s = 0.0
        self.released = False
        self._release_due = False
        self._settle_due = False
        self._actual = 0
        self._scheduled = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._release_due = True
            self.project._unslot(self)
            self._schedule()

    def settle(self, actual_tokens: int, cost_usd: float = 0.0) -> None:
        self._settle_due = True
        self._actual += max(0, actual_tokens)
        self._cost += max(0.0, cost_usd)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.project.loop.call_soon(self.project._flush, self)


class SharedProjectLimits:
    """One project's limits through Redis, with ``local`` (this process's share) while Redis is down."""

    def __init__(self, name: str, cfg: ProjectConfig, shared: SharedState, local: ProjectLimits) -> None:
        self.name = name
        self.cfg = cfg
        self.shared = shared
        self.local = local
        self.loop = asyncio.get_running_loop()
        self._in_flight = 0
        self._waiting = 0
        self._slots: set[str] = set()  # live lease ids of this process, renewed every lease/3
        self._queue: set[str] = set()
        self._held: set[str] = set()
        self._used: tuple[int, int] | None = None  # (day, tokens): the shared counter as last seen
        self._cost: tuple[int, int] | None = None  # (day, nano-dollars): the shared cost counter as last seen
        self._budgeted = cfg.daily_token_budget is not None or cfg.daily_cost_budget_usd is not None
        p = f"{shared.prefix}:p:{name}"
        self.k_slots, self.k_queue, self.k_held = f"{p}:slots", f"{p}:queue", f"{p}:held"
        self.k_resamt, self.k_reserved, self.k_rpm, self.k_tpm = (
            f"{p}:resamt",
            f"{p}:reserved",
            f"{p}:rpm",
            f"{p}:tpm",
        )
        self.k_cresamt, self.k_creserved = f"{p}:cresamt", f"{p}:creserved"  # cost reservations
        self._prefix_day = -1
        self._admit_prefix = self._settle_prefix = b""
        self._slot_prefix = _eval_prefix(_LANE_SCRIPTS["slot"], [self.k_slots, self.k_queue], 3)
        self._refund_prefix = _eval_prefix(
            _LANE_SCRIPTS["refund"],
            [self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_rpm, self.k_tpm,
             self.k_cresamt, self.k_creserved],
            4,
        )  # fmt: skip
        self._limit_args = (
            b"%d" % cfg.max_concurrency, b"%d" % (cfg.rpm or 0), b"%d" % (cfg.tpm or 0),
        )  # fmt: skip
        self._lease = b"%d" % shared.lease_ms

    # --- what the metrics read ---------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight + self.local.in_flight

    @property
    def waiting(self) -> int:
        return self._waiting + self.local.waiting

    def budget_remaining(self) -> int | None:
        if self.cfg.daily_token_budget is None:
            return None
        if not self.shared.up:
            return self.local.budget_remaining()
        used = self._used[1] if self._used is not None and self._used[0] == _today() else 0
        return max(0, self.cfg.daily_token_budget - used)

    def saw_used(self, day: int, used: int) -> None:
        self._used = (day, used)

    def saw_cost(self, day: int, nanos: int) -> None:
        self._cost = (day, nanos)

    def live(self) -> list[tuple[str, list[str]]]:
        return [
            (self.k_slots, list(self._slots)),
            (self.k_queue, list(self._queue)),
            (self.k_held, list(self._held)),
        ]

    def on_down(self) -> None:
        """Redis went away: the local share starts from the shared counter as last seen."""
        if self.cfg.daily_token_budget is not None and self._used is not None and self._used[0] == _today():
            self.local._roll_day()
            self.local.used_today = self._used[1] // self.shared.fallback_processes
        if (
            self.cfg.daily_cost_budget_usd is not None
            and self._cost is not None
            and self._cost[0] == _today()
        ):
            self.local._roll_day()
            self.local.cost_today = self._cost[1] / NANO_USD / self.shared.fallback_processes

    # --- admit --------------------------------------------------------------------------------------
    def _prefixes(self, day: int) -> None:
        sh = self.shared
        used, seeded, cost = sh.used_key(self.name, day), sh.seeded_key(day), sh.cost_key(self.name, day)
        self._admit_prefix = _eval_prefix(
            _LANE_SCRIPTS["admit"],
            [self.k_slots, self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_rpm, self.k_tpm,
             used, seeded, cost, self.k_cresamt, self.k_creserved],
            11,
        )  # fmt: skip
        self._settle_prefix = _eval_prefix(
            _LANE_SCRIPTS["settle"],
            [self.k_slots, self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_tpm, used,
             self.k_cresamt, self.k_creserved, cost],
            12,
        )  # fmt: skip
        self._prefix_day = day

    async def admit(
        self, max_tokens: int | None, input_estimate: int = 0, cost_reserve: float = 0.0
    ) -> SharedAdmission | Any:
        sh = self.shared
        if sh._state is not True:
            sh.fallback_admissions += 1
            return await self.local.admit(max_tokens, input_estimate, cost_reserve)
        cfg = self.cfg
        cost_budget = _nanos(cfg.daily_cost_budget_usd) if cfg.daily_cost_budget_usd is not None else 0
        cap = max_tokens or cfg.default_max_tokens
        budget_reserve = max(0, input_estimate) + cap if cfg.daily_token_budget is not None else 0
        reserve = min(cap, cfg.tpm) if cfg.tpm else 0
        day = _today()
        if day != self._prefix_day:
            self._prefixes(day)
        lid = sh.lease_id()
        payload = self._admit_prefix + _args(
            lid, self._lease, *self._limit_args, reserve, cfg.daily_token_budget or 0, budget_reserve, day,
            cost_budget, _nanos(cost_reserve) if cost_budget else 0,
        )  # fmt: skip
        try:
            res = await sh.run("admit", payload)
            if res[0] == 3:
                try:
                    await sh.ensure_seeded(day)
                except Exception as e:
                    raise SharedUnavailable(
                        f"seeding the budget from the ledger failed: {_describe(e)}"
                    ) from e
                res = await sh.run("admit", payload)
                if res[0] == 3:
                    raise SharedUnavailable("the day's budget counters are not seeded")
        except SharedUnavailable:
            sh.fallback_admissions += 1
            return await self.local.admit(max_tokens, input_estimate, cost_reserve)
        status = res[0]
        if status == 2 and res[1] in (5, 6):  # the cost budget: used and reserved are nano-dollars
            self._cost = (day, res[3])
        elif cfg.daily_token_budget is not None:
            self._used = (day, res[3] if status == 2 else res[1])
        if status == 2:
            self._refuse(res, reserve)
        adm = SharedAdmission(self, lid, day, reserve, budget_reserve)
        if self._budgeted:
            self._held.add(lid)
        if status == 0:
            self._slots.add(lid)
            self._in_flight += 1
            return adm
        return await self._queued(adm, res[3] / 1000, max_tokens, input_estimate, cost_reserve)

    def _refuse(self, res: list, reserve: int) -> None:
        why, retry_s, used, reserved = res[1], res[2] / 1000, res[3], res[4]
        cfg, name = self.cfg, self.name
        if why == 1:
            raise LimitExceeded(
                "daily_budget",
                retry_s,
                f"project {name!r} has used its daily token budget ({used}/{cfg.daily_token_budget} tokens)",
            )
        if why == 2:
            raise LimitExceeded(
                "daily_budget",
                retry_s,
                f"project {name!r}: the requests in flight reserve the rest of its daily token budget "
                f"({used} used + {reserved} reserved of {cfg.daily_token_budget})",
            )
        if why in (5, 6):
            budget = cfg.daily_cost_budget_usd
            spent, held = used / NANO_USD, reserved / NANO_USD
            raise LimitExceeded(
                "daily_cost_budget",
                retry_s,
                f"project {name!r} has used its daily cost budget (${spent:.4f} of ${budget:g})"
                if why == 5
                else f"project {name!r}: the requests in flight reserve the rest of its daily cost budget "
                f"(${spent:.4f} spent + ${held:.4f} reserved of ${budget:g})",
            )
        if why == 3:
            raise LimitExceeded(
                "rpm", retry_s, f"project {name!r} is over its rate limit of {cfg.rpm} requests per minute"
            )
        raise LimitExceeded(
            "tpm",
            retry_s,
            f"project {name!r} is over its rate limit of {cfg.tpm} tokens per minute "
            f"(this request reserves {reserve})",
        )

    async def _queued(
        self,
        adm: SharedAdmission,
        hint_s: float,
        max_tokens: int | None,
        input_estimate: int,
        cost_reserve: float = 0.0,
    ) -> SharedAdmission | Any:
        """Every slot is taken: wait for one up to queue_timeout_s (woken by releases, polling)."""
        sh, cfg, loop = self.shared, self.cfg, self.loop
        t0 = time.perf_counter()
        deadline = loop.time() + cfg.queue_timeout_s
        self._queue.add(adm.lid)
        self._waiting += 1
        poll = _POLL_START_S
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                await sh.wait_release(self.name, min(left, poll, max(hint_s, 0.005)))
                res = await sh.run(
                    "slot", self._slot_prefix + _args(adm.lid, self._lease, cfg.max_concurrency)
                )
                if res[0] == 0:
                    break
                hint_s = res[1] / 1000
                poll = min(poll * 2, _POLL_MAX_S)
        except TimeoutError:
            self._refund(adm)
            raise LimitExceeded(
                "concurrency",
                1.0,
                f"project {self.name!r} has {cfg.max_concurrency} requests in flight and the queue "
                f"wait of {cfg.queue_timeout_s:g} s ran out",
            ) from None
        except SharedUnavailable:  # Redis went away while waiting: what it held there expires by itself
            self._queue.discard(adm.lid)
            self._held.discard(adm.lid)
            sh.fallback_admissions += 1
            return await self.local.admit(max_tokens, input_estimate, cost_reserve)
        except BaseException:  # cancelled while queued: it never reached the upstream
            self._refund(adm)
            raise
        finally:
            self._waiting -= 1
        self._queue.discard(adm.lid)
        self._slots.add(adm.lid)
        self._in_flight += 1
        adm.queue_wait_s = time.perf_counter() - t0
        return adm

    def _refund(self, adm: SharedAdmission) -> None:
        self._queue.discard(adm.lid)
        self._held.discard(adm.lid)
        cfg = self.cfg
        payload = self._refund_prefix + _args(adm.lid, cfg.rpm or 0, cfg.tpm or 0, adm.reserved_tokens)
        adm.reserved_tokens = adm.budget_reserved = 0
        try:
            fut = self.shared.lane().send(payload)
        except (SharedUnavailable, ConnectionError):
            return
        fut.add_done_callback(self._sent)

    # --- release and settle -------------------------------------------------------------------------
    def _unslot(self, adm: SharedAdmission) -> None:
        self._in_flight -= 1
        self._slots.discard(adm.lid)

    def _flush(self, adm: SharedAdmission) -> None:
        adm._scheduled = False
        release, settle = adm._release_due, adm._settle_due
        actual, cost = adm._actual, adm._cost
        reserve = adm.reserved_tokens
        adm._release_due = adm._settle_due = False
        if settle:
            adm._actual, adm._cost = 0, 0.0
            adm.reserved_tokens = adm.budget_reserved = 0
            self._held.discard(adm.lid)
        day = _today()
        if day != self._prefix_day:
            self._prefixes(day)
        count = self.cfg.daily_token_budget is not None
        payload = self._settle_prefix + _args(
            adm.lid,
            b"1" if release else b"0",
            b"1" if settle else b"0",
            self.cfg.tpm or 0,
            reserve,
            actual,
            self.shared.ch_release,
            self.name,
            b"1" if count else b"0",
            2 * 86400,
            _nanos(cost),
            b"1" if self.cfg.daily_cost_budget_usd is not None else b"0",
        )
        if not settle:
            actual, cost = 0, 0.0
        try:
            fut = self.shared.lane().send(payload)
        except (SharedUnavailable, ConnectionError):
            self._unsent(actual, cost)
            return
        if release and self._waiting:
            self.shared.wake(self.name)  # a local waiter's retry goes out after this release
        fut.add_done_callback(lambda f: self._settled(f, day, actual, cost, payload))

    def _unsent(self, actual: int, cost: float) -> None:
        """A settlement Redis did not take: counted when it is back."""
        self.shared.add_pending(self.name, actual)
        self.shared.add_pending_cost(self.name, cost)

    def _saw_settled(self, day: int, reply: Any) -> None:
        """The settle script's reply: [the day's used tokens, the day's cost in nano-dollars] (-1: not
        counted)."""
        if isinstance(reply, list) and len(reply) == 2:
            used, cost = reply
            if isinstance(used, int) and used >= 0:
                self._used = (day, used)
            if isinstance(cost, int) and cost >= 0:
                self._cost = (day, cost)

    def _settled(self, fut: asyncio.Future, day: int, actual: int, cost: float, payload: bytes) -> None:
        try:
            reply = fut.result()
        except ReplyError as e:
            if e.noscript:  # Redis restarted: load the scripts and send it again
                self.shared._tasks.add(asyncio.ensure_future(self._resend(payload, day, actual, cost)))
                return
            self._unsent(actual, cost)
            self.shared._mark_down(e)
            return
        except Exception as e:
            self._unsent(actual, cost)
            self.shared._mark_down(e)
            return
        self._saw_settled(day, reply)

    async def _resend(self, payload: bytes, day: int, actual: int, cost: float) -> None:
        try:
            reply = await self.shared.run("settle", payload)
        except SharedUnavailable:
            self._unsent(actual, cost)
        else:
            self._saw_settled(day, reply)
        finally:
            self.shared._tasks.discard(asyncio.current_task())  # type: ignore[arg-type]

    def _sent(self, fut: asyncio.Future) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            exc = fut.exception()
            if not (isinstance(exc, ReplyError) and exc.noscript):
                self.shared._mark_down(exc)  # type: ignore[arg-type]


class SharedLimits:
    """Every project's limits through Redis (the interface of ``gateway.limits.local.Limits``)."""

    def __init__(
        self,
        shared: SharedState,
        projects: dict[str, ProjectConfig],
        used_today: dict[str, int] | None = None,
        cost_today: dict[str, float] | None = None,
    ) -> None:
        used_today = used_today or {}
        cost_today = cost_today or {}
        n = shared.fallback_processes
        self.shared = shared
        self.projects = {
            name: SharedProjectLimits(
                name,
                cfg,
                shared,
                _FallbackLimits(
                    name,
                    share_of(cfg, n),
                    used_today.get(name, 0) // n,
                    shared,
                    cost_today.get(name, 0.0) / n,
                ),
            )
            for name, cfg in projects.items()
        }
        shared.limits = self

    def __getitem__(self, name: str) -> SharedProjectLimits:
        return self.projects[name]

    def on_down(self) -> None:
        for pl in self.projects.values():
            pl.on_down()


# --- helpers -------------------------------------------------------------------------------------------
def _today() -> int:
    return int(time.time() // 86400)


def _eval_prefix(script: _Script, keys: list[str], nargs: int) -> bytes:
    """``EVALSHA sha numkeys keys...`` in RESP, with the array length for ``nargs`` arguments after it."""
    head = [b"EVALSHA", script.sha.encode(), b"%d" % len(keys), *(k.encode() for k in keys)]
    out = [b"*%d\r\n" % (len(head) + nargs)]
    out += [b"$%d\r\n%s\r\n" % (len(b), b) for b in head]
    return b"".join(out)


def _args(*args: Any) -> bytes:
    out = []
    for a in args:
        b = _encode(a)
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _eval(script: _Script, keys: list[str], args: list[Any]) -> bytes:
    return _eval_prefix(script, keys, len(args)) + _args(*args)


def _resolve(fut: asyncio.Future, value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _ignore(fut: asyncio.Future) -> None:
    fut.add_done_callback(lambda f: f.cancelled() or f.exception())


def _describe(err: BaseException | str) -> str:
    if isinstance(err, str):
        return err
    text = str(err).strip()
    return f"{err.__class__.__name__}: {text}" if text else err.__class__.__name__
