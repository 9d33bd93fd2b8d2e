"""The limits across every gateway process sharing a Redis (``redis_url``).

``SharedLimits`` is ``gateway.limits.base.Limiters`` through Redis, and a participant of the shared state
(``gateway.redis.state``): it seeds the day's budget counters, renews this process's leases, takes them
again after a reconnection, and wakes this process's waiters on a release. Its parts:
``gateway.limits.redis_project`` (one project: admission, queue, release, settlement; its Lua scripts in
``gateway.limits.redis_scripts``) and ``gateway.limits.redis_deployment`` (a deployment's rpm/tpm for
routing).

- **The daily budgets**: one counter per project and UTC day (tokens; cost in nano-dollars, integers as
  INCRBY needs) plus the reservations of the requests in flight; a request is admitted only while used +
  reserved is under the budget, so a budget is overshot by at most one request's reservation. The first
  process to find a day without its marker key (``SEED``, ``SET NX``: Redis started empty, or a new day)
  rebuilds the counters from the ledger, so processes sharing Redis should share the ledger database.
- **Leases**: every ``redis_lease_s / 3`` this process renews the slots, queue places and budget
  reservations of its requests (``RENEW``), so a process that dies (SIGKILL) frees them within
  ``redis_lease_s``.

**Redis down**: every process keeps serving with its own limits: each limit divided by
``redis_fallback_processes`` (``gateway.limits.local.share_of``; a budget's used part from the last counter
seen), and the tokens and cost used meanwhile are added to the shared counters once Redis is back (unless it
came back empty: then the ledger rebuilds them).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.config import ProjectConfig
from gateway.errors import StoreUnavailable
from gateway.limits.local import share_of
from gateway.limits.redis_deployment import DEPLOY_SETTLE, DEPLOY_TAKE, SharedDeploymentWindow
from gateway.limits.redis_project import FallbackLimits, SharedProjectLimits
from gateway.limits.redis_scripts import ADMIT, DAY_TTL_S, NOW, REFUND, SETTLE, SLOT, nanos, utc_day
from gateway.redis.errors import SharedUnavailable
from gateway.redis.lane import Lane, Script, evalsha, ignore, resolve
from gateway.redis.state import SharedState

log = logging.getLogger("gateway.limits.redis")

# Renew live leases: 'XX' only those still there (an expired one stays gone); 'ADD' puts them back (a
# reconnection: the requests that kept running while Redis was away count again). KEYS: 1 zset;
# ARGV: 1 lease_ms 2 mode 3.. lids
RENEW = Script(
    "renew",
    NOW
    + """
local exp = now + tonumber(ARGV[1])
for i = 3, #ARGV do
  if ARGV[2] == 'XX' then redis.call('ZADD', KEYS[1], 'XX', exp, ARGV[i])
  else redis.call('ZADD', KEYS[1], exp, ARGV[i]) end
end
return 0
""",
)

# The first process to find the day unseeded sets the counters from the ledger (run through redis-py).
# KEYS: 1 seeded(day) 2.. used(project, day), then cost(project, day); ARGV: 1 ttl_s 2.. their values
SEED = """
if redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  for i = 2, #KEYS do redis.call('SET', KEYS[i], ARGV[i], 'EX', ARGV[1]) end
  return 1
end
return 0
"""


# --- every project -------------------------------------------------------------------------------------
class SharedLimits:
    """Every project's limits through Redis (``gateway.limits.base.Limiters``); a participant of the shared
    state (``gateway.redis.state``): seeds the day's budget counters, renews this process's leases, takes
    them again after a reconnection, and wakes this process's waiters on a release.

    ``seed_source`` / ``cost_seed_source``: the day's tokens / US dollars per project from the ledger
    (raising ``gateway.errors.StoreUnavailable`` when it cannot be read); None: counters start from 0."""

    scripts = (ADMIT, SLOT, SETTLE, REFUND, RENEW, DEPLOY_TAKE, DEPLOY_SETTLE)

    def __init__(
        self,
        state: SharedState,
        projects: dict[str, ProjectConfig],
        used_today: dict[str, int] | None = None,
        cost_today: dict[str, float] | None = None,
        *,
        seed_source: Callable[[], Awaitable[dict[str, int]]] | None = None,
        cost_seed_source: Callable[[], Awaitable[dict[str, float]]] | None = None,
    ) -> None:
        used_today = used_today or {}
        cost_today = cost_today or {}
        n = state.fallback_processes
        self.state = state
        self.configs = projects
        self._seed_source = seed_source
        self._cost_seed_source = cost_seed_source
        self._seed: Any = None  # SEED registered with redis-py
        self._seeding: dict[int, asyncio.Future[bool]] = {}
        self._pending_used: dict[tuple[str, int], int] = {}  # tokens used while Redis was down
        self._pending_cost: dict[tuple[str, int], int] = {}  # nano-dollars spent while Redis was down
        self._waiters: dict[str, deque[asyncio.Future]] = {}  # project -> waiting for a release
        self.ch_release = state.channel("release")
        self.projects = {
            name: SharedProjectLimits(
                name,
                cfg,
                self,
                FallbackLimits(
                    name, share_of(cfg, n), used_today.get(name, 0) // n, self, cost_today.get(name, 0.0) / n
                ),
            )
            for name, cfg in projects.items()
        }
        state.subscribe(self.ch_release, self.wake)
        state.join(self)

    def __getitem__(self, name: str) -> SharedProjectLimits:
        return self.projects[name]

    def deployment(self, model: str, name: str, rpm: int | None, tpm: int | None) -> SharedDeploymentWindow:
        return SharedDeploymentWindow(self.state, model, name, rpm, tpm)

    # --- the shared state's participant ----------------------------------------------------------------
    async def connected(self, lane: Lane) -> None:
        """A new connection: the requests still running hold their slots again, the day is seeded (when
        Redis came back empty) and the tokens used while it was away are added."""
        for pl in self.projects.values():
            if pl._slots:
                ignore(lane.send(evalsha(RENEW, [pl.k_slots], [self.state.lease_ms, "ADD", *pl._slots])))
        seeded = await self.ensure_seeded(utc_day())
        await self._push_pending(seeded)

    def down(self) -> None:
        for pl in self.projects.values():
            pl.on_down()
        for dq in self._waiters.values():  # waiters retry now, and fall back
            while dq:
                f = dq.popleft()
                if not f.done():
                    f.set_result(False)

    async def renew(self, lane: Lane) -> None:
        for pl in self.projects.values():
            for key, lids in pl.live():
                if lids:
                    ignore(lane.send(evalsha(RENEW, [key], [self.state.lease_ms, "XX", *lids])))

    # --- waiting for a release -----------------------------------------------------------------------
    def wait_release(self, project: str, delay: float) -> Awaitable[bool]:
        """Until a release in ``project`` wakes this waiter (True) or ``delay`` passes (False)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        dq = self._waiters.get(project)
        if dq is None:
            dq = self._waiters[project] = deque()
        dq.append(fut)
        handle = loop.call_later(delay, resolve, fut, False)

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

    # --- the daily budgets' counters -------------------------------------------------------------------
    def used_key(self, project: str, day: int) -> str:
        return f"{self.state.prefix}:p:{project}:used:{day}"

    def cost_key(self, project: str, day: int) -> str:
        return f"{self.state.prefix}:p:{project}:cost:{day}"

    def seeded_key(self, day: int) -> str:
        return f"{self.state.prefix}:seeded:{day}"

    async def ensure_seeded(self, day: int) -> bool:
        """Seed the day's budget counters from the ledger unless a process did already (one marker key per
        day, SET NX). True when this call seeded them. Concurrent callers share one ledger query. Raises
        ``SharedUnavailable`` when Redis or the ledger cannot be read."""
        fut = self._seeding.get(day)
        if fut is None:
            fut = asyncio.ensure_future(self._seed_day(day))
            self._seeding[day] = fut
            fut.add_done_callback(
                lambda f: self._seeding.pop(day, None) if self._seeding.get(day) is f else None
            )
        return await asyncio.shield(fut)

    async def _seed_day(self, day: int) -> bool:
        budgets = [n for n, c in self.configs.items() if c.daily_token_budget is not None]
        cbudgets = [n for n, c in self.configs.items() if c.daily_cost_budget_usd is not None]
        st = self.state
        if not (budgets or cbudgets) or st.redis is None:
            return False
        if await st.call("checking the day's budget counters", lambda r: r.exists(self.seeded_key(day))):
            return False
        try:
            used = await self._seed_source() if budgets and self._seed_source is not None else {}
            cost = await self._cost_seed_source() if cbudgets and self._cost_seed_source is not None else {}
        except StoreUnavailable as e:
            raise SharedUnavailable(f"seeding the budget from the ledger failed: {e}", "seed") from e
        if self._seed is None:
            self._seed = st.redis.register_script(SEED)
        seed = self._seed
        keys = [
            self.seeded_key(day),
            *(self.used_key(p, day) for p in budgets),
            *(self.cost_key(p, day) for p in cbudgets),
        ]
        values = [
            DAY_TTL_S,
            *(int(used.get(p, 0)) for p in budgets),
            *(nanos(cost.get(p, 0.0)) for p in cbudgets),
        ]
        done = await st.call("seeding the day's budget counters", lambda _r: seed(keys=keys, args=values))
        if done:
            log.info("shared state: daily budgets of day %d rebuilt from the ledger", day)
            for p in budgets:
                self.projects[p].saw_used(day, int(used.get(p, 0)))
            for p in cbudgets:
                self.projects[p].saw_cost(day, nanos(cost.get(p, 0.0)))
        return bool(done)

    def add_pending(self, project: str, tokens: int, usd: float = 0.0) -> None:
        """Tokens and US dollars used while Redis was down: added to the shared counters when it is back."""
        cfg = self.configs[project]
        k = (project, utc_day())
        if tokens > 0 and cfg.daily_token_budget is not None:
            self._pending_used[k] = self._pending_used.get(k, 0) + tokens
        if usd > 0 and cfg.daily_cost_budget_usd is not None:
            self._pending_cost[k] = self._pending_cost.get(k, 0) + nanos(usd)

    async def _push_pending(self, seeded: bool) -> None:
        pending, self._pending_used = self._pending_used, {}
        pending_cost, self._pending_cost = self._pending_cost, {}
        day_now = utc_day()
        if seeded or not (pending or pending_cost) or self.state.redis is None:
            return  # seeded: the ledger counted them

        async def push(r: Any) -> None:
            async with r.pipeline(transaction=False) as pipe:
                for counts, key in ((pending, self.used_key), (pending_cost, self.cost_key)):
                    for (project, day), n in counts.items():
                        if day == day_now:
                            pipe.incrby(key(project, day), n)
                            pipe.expire(key(project, day), DAY_TTL_S)
                await pipe.execute()

        try:
            await self.state.call("adding the usage counted while Redis was down", push)
        except BaseException:  # not added: kept for the next connection (and re-raised)
            for k, v in pending.items():
                self._pending_used[k] = self._pending_used.get(k, 0) + v
            for k, v in pending_cost.items():
                self._pending_cost[k] = self._pending_cost.get(k, 0) + v
            raise
