"""One project's limits through Redis: admission, the queue for a slot, release and settlement, with their
Lua scripts (``gateway.limits.redis`` has the whole; ``gateway.limits.base`` the interface and refusals).

- **Admission** is one script (``ADMIT``), one round trip: it checks the daily budgets, rpm and tpm (GCRA on
  Redis' clock, so Retry-After comes from Redis), reserves tokens and budget, and takes a concurrency slot
  or a place in the queue. A refusal is a code; ``gateway.limits.base.RULES`` turns it into the 429 the
  in-process limiter gives. A slot is a *lease*: a member of a sorted set scored by its expiry, which every
  admission first sweeps, renewed every ``redis_lease_s / 3`` while the request runs.
- ``release`` and ``settle`` (the pipeline calls one right after the other) become one more script
  (``SETTLE``), sent without waiting for its answer.
- A request that finds every slot taken waits up to ``queue_timeout_s`` (``SLOT``): a release publishes on
  a channel when someone waits, which wakes one waiter in each process; waiters also poll (25 ms doubling
  to 250 ms, never later than the oldest lease's expiry), which covers the slots of a dead process. No
  global FIFO: a newcomer can overtake. A request that gives up or is cancelled while queued gets
  everything back (``REFUND``).
- While Redis is down: ``local``, this process's share of the project's limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from gateway.config import ProjectConfig
from gateway.limits.base import BY_CODE, refusal
from gateway.limits.local import LocalAdmission, ProjectLimits
from gateway.redis.errors import REDIS_ERRORS, ReplyError, SharedUnavailable
from gateway.redis.lane import Script, args, eval_prefix
from gateway.redis.state import SharedState

_POLL_START_S = 0.025
_POLL_MAX_S = 0.25
DAY_TTL_S = 2 * 86400  # a day's counters outlive it by a day
NANO_USD = 1_000_000_000  # cost counters in Redis are integers: nano-dollars


def nanos(usd: float) -> int:
    return max(0, round(usd * NANO_USD))


def utc_day() -> int:
    return int(time.time() // 86400)


# --- Lua ---------------------------------------------------------------------------------------------
NOW = """
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
#    {2, code, retry_ms, used, reserved} refused: code is a RULES code (gateway.limits.base.BY_CODE; for
#    the cost budget's, 5 and 6, used and reserved are the cost's); retry_ms is 0 where the rule fixes it |
#    {3} the day's budget counters are not seeded yet
ADMIT = Script(
    "admit",
    NOW
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
      return {2, 6, 0, cused, creserved}
    end
  end
end
if budget > 0 then
  used = tonumber(redis.call('GET', KEYS[8]) or 0)
  if used + reserved >= budget then
    if used >= budget then
      return {2, 1, math.max(1000, (tonumber(ARGV[9]) + 1) * 86400000 - now), used, reserved}
    end
    return {2, 2, 0, used, reserved}
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
""",
)

# A queued request tries again for a slot. KEYS: 1 slots 2 queue; ARGV: 1 lid 2 lease_ms 3 max_concurrency
# -> {0} a slot | {1, ms to the oldest lease's expiry}
SLOT = Script(
    "slot",
    NOW
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
""",
)

# Release and/or settle. KEYS: 1 slots 2 queue 3 held 4 resamt 5 reserved 6 tpm 7 used(day)
# 8 cresamt 9 creserved 10 cost(day)
# ARGV: 1 lid 2 release 3 settle 4 tpm 5 tpm_reserve 6 actual 7 channel 8 project 9 count_used 10 used_ttl_s
# 11 actual cost (nano-dollars) 12 count_cost
# -> {the day's used tokens, the day's cost} after settling (-1: not counted)
SETTLE = Script(
    "settle",
    NOW
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
""",
)

# A request that was not admitted after all (queue timeout, cancelled): its queue place, rpm slot, tpm
# and budget reservations go back. KEYS: 1 queue 2 held 3 resamt 4 reserved 5 rpm 6 tpm 7 cresamt
# 8 creserved; ARGV: 1 lid 2 rpm 3 tpm 4 tpm_reserve
REFUND = Script(
    "refund",
    NOW
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
""",
)


class SharedLimits(Protocol):
    """What one project's limits use of the whole (``gateway.limits.redis.SharedLimits``, which builds them):
    the connection, the budgets' counters, and the waiters for a release."""

    state: SharedState
    ch_release: str

    def used_key(self, project: str, day: int) -> str: ...

    def cost_key(self, project: str, day: int) -> str: ...

    def seeded_key(self, day: int) -> str: ...

    async def ensure_seeded(self, day: int) -> bool: ...

    def add_pending(self, project: str, tokens: int, usd: float = 0.0) -> None: ...

    def wait_release(self, project: str, delay: float) -> Awaitable[bool]: ...

    def wake(self, project: str) -> None: ...


# --- one project ---------------------------------------------------------------------------------------
class FallbackLimits(ProjectLimits):
    """This process's share of a project's limits, used while Redis is down; its usage is added to the
    shared counter once Redis is back."""

    def __init__(
        self, name: str, cfg: ProjectConfig, used_today: int, limits: SharedLimits, cost_today: float = 0.0
    ) -> None:
        super().__init__(name, cfg, used_today, cost_today=cost_today)
        self._limits = limits

    def _settle(
        self, reserved: int, budget_reserved: int, actual: int, cost_reserved: float = 0.0, cost: float = 0.0
    ) -> None:
        super()._settle(reserved, budget_reserved, actual, cost_reserved, cost)
        self._limits.add_pending(self.name, actual, cost)


class SharedAdmission:
    """An admission through Redis (``gateway.limits.base.Admission``). ``release`` and ``settle`` are sent
    together as one script (they are called one right after the other), without waiting for the answer."""

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
    """One project's limits through Redis (``gateway.limits.base.ProjectLimiter``), with ``local`` (this
    process's share) while Redis is down."""

    def __init__(self, name: str, cfg: ProjectConfig, limits: SharedLimits, local: ProjectLimits) -> None:
        self.name = name
        self.cfg = cfg
        self.limits = limits
        self.state = state = limits.state
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
        p = f"{state.prefix}:p:{name}"
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
        self._slot_prefix = eval_prefix(SLOT, [self.k_slots, self.k_queue], 3)
        self._refund_prefix = eval_prefix(
            REFUND,
            [self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_rpm, self.k_tpm,
             self.k_cresamt, self.k_creserved],
            4,
        )  # fmt: skip
        self._limit_args = (
            b"%d" % cfg.max_concurrency, b"%d" % (cfg.rpm or 0), b"%d" % (cfg.tpm or 0),
        )  # fmt: skip
        self._lease = b"%d" % state.lease_ms

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
        if not self.state.up:
            return self.local.budget_remaining()
        used = self._used[1] if self._used is not None and self._used[0] == utc_day() else 0
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
        n = self.state.fallback_processes
        if self.cfg.daily_token_budget is not None and self._used is not None and self._used[0] == utc_day():
            self.local._roll_day()
            self.local.used_today = self._used[1] // n
        if (
            self.cfg.daily_cost_budget_usd is not None
            and self._cost is not None
            and self._cost[0] == utc_day()
        ):
            self.local._roll_day()
            self.local.cost_today = self._cost[1] / NANO_USD / n

    # --- admit --------------------------------------------------------------------------------------
    def _prefixes(self, day: int) -> None:
        lim = self.limits
        used, seeded, cost = lim.used_key(self.name, day), lim.seeded_key(day), lim.cost_key(self.name, day)
        self._admit_prefix = eval_prefix(
            ADMIT,
            [self.k_slots, self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_rpm, self.k_tpm,
             used, seeded, cost, self.k_cresamt, self.k_creserved],
            11,
        )  # fmt: skip
        self._settle_prefix = eval_prefix(
            SETTLE,
            [self.k_slots, self.k_queue, self.k_held, self.k_resamt, self.k_reserved, self.k_tpm, used,
             self.k_cresamt, self.k_creserved, cost],
            12,
        )  # fmt: skip
        self._prefix_day = day

    async def admit(
        self, max_tokens: int | None, input_estimate: int = 0, cost_reserve: float = 0.0
    ) -> SharedAdmission | LocalAdmission:
        """``gateway.limits.base.ProjectLimiter.admit``; this process's share while Redis is down."""
        st = self.state
        if st._state is not True:
            st.fallback_admissions += 1
            return await self.local.admit(max_tokens, input_estimate, cost_reserve)
        cfg = self.cfg
        cost_budget = nanos(cfg.daily_cost_budget_usd) if cfg.daily_cost_budget_usd is not None else 0
        cap = max_tokens or cfg.default_max_tokens
        budget_reserve = max(0, input_estimate) + cap if cfg.daily_token_budget is not None else 0
        reserve = min(cap, cfg.tpm) if cfg.tpm else 0
        day = utc_day()
        if day != self._prefix_day:
            self._prefixes(day)
        lid = st.lease_id()
        payload = self._admit_prefix + args(
            lid, self._lease, *self._limit_args, reserve, cfg.daily_token_budget or 0, budget_reserve, day,
            cost_budget, nanos(cost_reserve) if cost_budget else 0,
        )  # fmt: skip
        try:
            res = await st.run(ADMIT, payload)
            if res[0] == 3:
                await self.limits.ensure_seeded(day)
                res = await st.run(ADMIT, payload)
                if res[0] == 3:
                    raise SharedUnavailable("the day's budget counters are not seeded", "seed")
        except SharedUnavailable:
            st.fallback_admissions += 1
            return await self.local.admit(max_tokens, input_estimate, cost_reserve)
        status = res[0]
        if status == 2 and res[1] in (5, 6):  # the cost budget: used and reserved are nano-dollars
            self._cost = (day, res[3])
        elif cfg.daily_token_budget is not None:
            self._used = (day, res[3] if status == 2 else res[1])
        if status == 2:
            raise self._refusal(res, reserve)
        adm = SharedAdmission(self, lid, day, reserve, budget_reserve)
        if self._budgeted:
            self._held.add(lid)
        if status == 0:
            self._slots.add(lid)
            self._in_flight += 1
            return adm
        return await self._queued(adm, res[3] / 1000, max_tokens, input_estimate, cost_reserve)

    def _refusal(self, res: list, reserve: int) -> Exception:
        """The ADMIT script's refusal ``{2, code, retry_ms, used, reserved}`` as the rule table has it."""
        reason, wait_s, used, reserved = BY_CODE[res[1]], res[2] / 1000, res[3], res[4]
        cfg = self.cfg
        if reason.startswith("daily_cost_budget"):
            return refusal(
                reason, wait_s, name=self.name, spent=used / NANO_USD, reserved=reserved / NANO_USD,
                budget=cfg.daily_cost_budget_usd,
            )  # fmt: skip
        return refusal(
            reason, wait_s, name=self.name, used=used, reserved=reserved, budget=cfg.daily_token_budget,
            rpm=cfg.rpm, tpm=cfg.tpm, reserve=reserve,
        )  # fmt: skip

    async def _queued(
        self,
        adm: SharedAdmission,
        hint_s: float,
        max_tokens: int | None,
        input_estimate: int,
        cost_reserve: float = 0.0,
    ) -> SharedAdmission | LocalAdmission:
        """Every slot is taken: wait for one up to queue_timeout_s (woken by releases, polling)."""
        st, cfg, loop = self.state, self.cfg, self.loop
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
                await self.limits.wait_release(self.name, min(left, poll, max(hint_s, 0.005)))
                res = await st.run(SLOT, self._slot_prefix + args(adm.lid, self._lease, cfg.max_concurrency))
                if res[0] == 0:
                    break
                hint_s = res[1] / 1000
                poll = min(poll * 2, _POLL_MAX_S)
        except TimeoutError:
            self._refund(adm)
            raise refusal(
                "concurrency",
                name=self.name,
                max_concurrency=cfg.max_concurrency,
                queue_timeout_s=cfg.queue_timeout_s,
            ) from None
        except SharedUnavailable:  # Redis went away while waiting: what it held there expires by itself
            self._queue.discard(adm.lid)
            self._held.discard(adm.lid)
            st.fallback_admissions += 1
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
        payload = self._refund_prefix + args(adm.lid, cfg.rpm or 0, cfg.tpm or 0, adm.reserved_tokens)
        adm.reserved_tokens = adm.budget_reserved = 0
        try:
            fut = self.state.send(payload)
        except SharedUnavailable:
            return  # what it held expires with its lease
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
        day = utc_day()
        if day != self._prefix_day:
            self._prefixes(day)
        count = self.cfg.daily_token_budget is not None
        payload = self._settle_prefix + args(
            adm.lid,
            b"1" if release else b"0",
            b"1" if settle else b"0",
            self.cfg.tpm or 0,
            reserve,
            actual,
            self.limits.ch_release,
            self.name,
            b"1" if count else b"0",
            DAY_TTL_S,
            nanos(cost),
            b"1" if self.cfg.daily_cost_budget_usd is not None else b"0",
        )
        if not settle:
            actual, cost = 0, 0.0
        try:
            fut = self.state.send(payload)
        except SharedUnavailable:
            self.limits.add_pending(self.name, actual, cost)  # a settlement Redis did not take: counted later
            return
        if release and self._waiting:
            self.limits.wake(self.name)  # a local waiter's retry goes out after this release
        fut.add_done_callback(lambda f: self._settled(f, day, actual, cost, payload))

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
        if fut.cancelled():  # the lane was closed on purpose (stop): counted when a process seeds the day
            return
        err = fut.exception()
        if err is None:
            self._saw_settled(day, fut.result())
            return
        if isinstance(err, ReplyError) and err.noscript:  # Redis restarted: load the scripts, send it again
            self.state.spawn(self._resend(payload, day, actual, cost))
            return
        self.limits.add_pending(self.name, actual, cost)
        if isinstance(err, REDIS_ERRORS):
            self.state.lost(err)
        else:
            raise err  # not a Redis failure: a bug, reported by the event loop with its traceback

    async def _resend(self, payload: bytes, day: int, actual: int, cost: float) -> None:
        try:
            reply = await self.state.run(SETTLE, payload)
        except SharedUnavailable:
            self.limits.add_pending(self.name, actual, cost)
        else:
            self._saw_settled(day, reply)

    def _sent(self, fut: asyncio.Future) -> None:
        if fut.cancelled():
            return
        err = fut.exception()
        if err is not None and not (isinstance(err, ReplyError) and err.noscript):
            if isinstance(err, REDIS_ERRORS):
                self.state.lost(err)
            else:
                raise err  # a bug, reported by the event loop
