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
  The marker holds a fresh id per rebuild.
- **Leases**: every ``redis_lease_s / 3`` this process renews the slots, queue places and budget
  reservations of its requests (``RENEW``), so a process that dies (SIGKILL) frees them within
  ``redis_lease_s``.

**Redis down**: every process keeps serving with its own limits: each limit divided by
``redis_fallback_processes`` (``gateway.limits.local.share_of``; a budget's used part from the last counter
seen). The tokens and cost used meanwhile are kept per request, and added to the shared counters once Redis
is back, each request once (``PUSH``), whichever way it came back. The ledger rows whose usage the shared
counters may lack say so (``shared_pending``), and the usage is kept per request, of three kinds:

- ``L``: never in Redis (admitted on the process's own share, or settled while Redis was known down; the
  pipeline settles before it writes the row, so the row is flagged as it is written);
- ``R``: settled in Redis, its row written while this process has no Redis (the ledger writer passes each
  batch through ``mark_rows`` then, and every unwritten row on a new connection): in that Redis if it kept
  its data, lost if it came back empty;
- ``U``: refused by Redis after the row was written (an error reply; rare): its row is not flagged.

A settlement sent that got no answer (a timeout, a lost connection) counts as taken: Redis runs what it
received (a hung one, once it resumes), and a Redis that lost it lost the day too.

- *back with its data* (its marker, a fresh id per rebuild, is the one this process knew): ``L`` and ``U``
  are added;
- *back empty*: the first process back rebuilds the counters from the ledger, in one statement that also
  lists the ids of today's flagged rows (``counted``: the same snapshot as the sums), and ``L`` and ``R``
  are added unless their rows were read, so each request counts once however the writes and the rebuild
  interleave.

After recovery, with nothing in flight, the counters equal the ledger. Not counted: a ``U`` after a rebuild,
and a row whose write was already under way when Redis went and ended after a rebuild read the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import ProjectConfig
from gateway.core.record import DayUsage
from gateway.errors import StoreUnavailable
from gateway.limits.local import share_of
from gateway.limits.redis_deployment import DEPLOY_SETTLE, DEPLOY_TAKE, SharedDeploymentWindow
from gateway.limits.redis_project import FallbackLimits, SharedProjectLimits
from gateway.limits.redis_scripts import ADMIT, DAY_TTL_S, NOW, REFUND, SETTLE, SLOT, nanos, utc_day
from gateway.limits.slots import FairSlots
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

# The first process to find the day unseeded sets the counters from the ledger and lists the request ids of
# its shared_pending rows, whose usage the counters now hold (run through redis-py).
# KEYS: 1 seeded(day) 2 counted(day) 3.. used(project, day), then cost(project, day)
# ARGV: 1 ttl_s 2 the seed's id 3 n, the number of counters 4..3+n their values, then the request ids
SEED = """
if not redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[1]) then return 0 end
local n = tonumber(ARGV[3])
for i = 1, n do redis.call('SET', KEYS[2 + i], ARGV[3 + i], 'EX', ARGV[1]) end
redis.call('DEL', KEYS[2])
for i = 4 + n, #ARGV, 1000 do
  redis.call('SADD', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
return 1
"""

# The usage a process counted while Redis was away, each request once (module docstring): -1 while the day
# is not seeded (a rebuild would overwrite what is added), else how many requests were added.
# KEYS: 1 seeded(day) 2 counted(day) 3.. counters; ARGV: 1 ttl_s, then per request 7 values: the index in
# KEYS of its tokens counter (0: none), tokens, of its cost counter (0: none), nano-dollars, its request id,
# the seed id known when it was kept ('' none), its kind (``_Pending``)
PUSH = """
local seed = redis.call('GET', KEYS[1])
if not seed then return -1 end
local added = 0
for i = 2, #ARGV, 7 do
  local kind, known = ARGV[i + 6], ARGV[i + 5]
  local lost = kind == 'L' or (kind == 'R' and known ~= seed) or (kind == 'U' and known == seed)
  if lost and redis.call('SADD', KEYS[2], ARGV[i + 4]) == 1 then
    for j = i, i + 2, 2 do
      local k = tonumber(ARGV[j])
      if k > 0 then
        redis.call('INCRBY', KEYS[k], ARGV[j + 1])
        redis.call('EXPIRE', KEYS[k], ARGV[1])
      end
    end
    added = added + 1
  end
end
redis.call('EXPIRE', KEYS[2], ARGV[1])
return added
"""


@dataclass(frozen=True, slots=True)
class _Pending:
    """One request's usage that the shared counters lack (Redis was away when it settled)."""

    project: str
    day: int
    tokens: int
    nanos: int
    request_id: str
    seed: str  # the day's seed id this process knew then ('': none)
    kind: str  # 'L' never in Redis, 'R' in the Redis of ``seed`` (both: the row says shared_pending), 'U'
    # refused by Redis after its row was written (the row does not say so)


# --- every project -------------------------------------------------------------------------------------
class SharedLimits:
    """Every project's limits through Redis (``gateway.limits.base.Limiters``); a participant of the shared
    state (``gateway.redis.state``): seeds the day's budget counters, renews this process's leases, takes
    them again after a reconnection, and wakes this process's waiters on a release.

    ``today``: the day's usage in the ledger at start; ``seed_source``: reads it again (raising
    ``gateway.errors.StoreUnavailable`` when it cannot be read); None: counters start from 0.
    ``before_connect``: run on a new connection before anything else (the gateway has its ledger writer
    pass the rows it has not written yet through ``mark_rows``: see the module docstring)."""

    scripts = (ADMIT, SLOT, SETTLE, REFUND, RENEW, DEPLOY_TAKE, DEPLOY_SETTLE)

    def __init__(
        self,
        state: SharedState,
        projects: dict[str, ProjectConfig],
        today: DayUsage | None = None,
        *,
        seed_source: Callable[[], Awaitable[DayUsage]] | None = None,
        before_connect: Callable[[], None] | None = None,
    ) -> None:
        used_today = today.tokens if today is not None else {}
        cost_today = today.cost if today is not None else {}
        n = state.fallback_processes
        self.state = state
        self.configs = projects
        self._seed_source = seed_source
        self._before_connect = before_connect
        self._seed: Any = None  # SEED registered with redis-py
        self._push: Any = None  # PUSH registered with redis-py
        self._seeding: dict[int, asyncio.Future[bool]] = {}
        self._seed_ids: dict[int, str] = {}  # day -> the id of its seed, as last seen in Redis
        self._pending: list[_Pending] = []  # usage the shared counters lack, per request
        self._pushing = False  # a push is scheduled (``_keep`` while Redis is up)
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

    def provider(self, name: str, capacity: int) -> FairSlots:
        """This process's connections to the provider: its slots are this process's too."""
        return FairSlots(capacity)

    # --- the shared state's participant ----------------------------------------------------------------
    async def connected(self, lane: Lane) -> None:
        """A new connection: the requests still running hold their slots again, the day is seeded (when
        Redis came back empty) and the tokens used while it was away are added."""
        for pl in self.projects.values():
            if pl._slots:
                ignore(lane.send(evalsha(RENEW, [pl.k_slots], [self.state.lease_ms, "ADD", *pl._slots])))
        if self._before_connect is not None:  # rows settled before this connection: marked as unwritten
            self._before_connect()
        await self.ensure_seeded(utc_day())
        await self._push_pending()

    def down(self) -> None:
        for pl in self.projects.values():
            pl.on_down()
        for dq in self._waiters.values():  # waiters retry now, and fall back
            while dq:
                f = dq.popleft()
                if not f.done():
                    f.set_result(False)

    async def renew(self, lane: Lane) -> None:
        if self._pending and not self._pushing:  # kept while a connection was being made: added now
            self._pushing = True
            self.state.spawn(self._push_later(), name="shared-limits-push")
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

    def counted_key(self, day: int) -> str:
        """The request ids of the outage usage the day's counters hold (PUSH, SEED)."""
        return f"{self.state.prefix}:counted:{day}"

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
        marker = self.seeded_key(day)
        current = await st.call("checking the day's budget counters", lambda r: r.get(marker))
        if current is not None:
            self._seed_ids[day] = current.decode()
            return False
        try:
            today = await self._seed_source() if self._seed_source is not None else DayUsage({}, {}, [])
        except StoreUnavailable as e:
            raise SharedUnavailable(f"seeding the budget from the ledger failed: {e}", "seed") from e
        if self._seed is None:
            self._seed = st.redis.register_script(SEED)
        seed, seed_id = self._seed, uuid.uuid4().hex
        used, cost = today.tokens, today.cost
        keys = [
            marker,
            self.counted_key(day),
            *(self.used_key(p, day) for p in budgets),
            *(self.cost_key(p, day) for p in cbudgets),
        ]
        counters = [*(int(used.get(p, 0)) for p in budgets), *(nanos(cost.get(p, 0.0)) for p in cbudgets)]
        values = [DAY_TTL_S, seed_id, len(counters), *counters, *today.shared_pending]
        done = await st.call("seeding the day's budget counters", lambda _r: seed(keys=keys, args=values))
        if done:
            self._seed_ids[day] = seed_id
            log.info("shared state: daily budgets of day %d rebuilt from the ledger", day)
            for p in budgets:
                self.projects[p].saw_used(day, int(used.get(p, 0)))
            for p in cbudgets:
                self.projects[p].saw_cost(day, nanos(cost.get(p, 0.0)))
            return True
        current = await st.call("checking the day's budget counters", lambda r: r.get(marker))
        if current is not None:  # another process seeded it meanwhile
            self._seed_ids[day] = current.decode()
        return False

    def add_pending(self, project: str, tokens: int, usd: float, request_id: str, *, flagged: bool) -> None:
        """One request's tokens and US dollars that Redis did not take (it was away): added when it is back
        (``_push_pending``). ``flagged``: its ledger row says ``shared_pending`` (else it was written
        already)."""
        self._keep(project, tokens, nanos(usd) if usd > 0 else 0, request_id, "L" if flagged else "U")

    def mark_rows(self, rows: list[dict]) -> None:
        """Ledger rows about to be written while Redis is not up (and, on a new connection, every row not
        written yet): those of requests settled in Redis are flagged ``shared_pending`` and their usage kept
        as in the Redis of the seed known now, to be added only if that Redis is gone and the rebuild from
        the ledger did not read their rows (``PUSH``). The ledger writer runs it on each batch."""
        if self.state.up:
            return
        for row in rows:
            if row.get("shared_pending") or row.get("project") not in self.configs:
                continue  # flagged already (its usage is kept), or not a project of this gateway
            tokens = (row.get("input_tokens") or 0) + (row.get("output_tokens") or 0)
            cost = row.get("cost_usd") or 0.0
            if self._keep(row["project"], tokens, nanos(cost) if cost > 0 else 0, row["request_id"], "R"):
                row["shared_pending"] = True

    def _keep(self, project: str, tokens: int, cost: int, request_id: str, kind: str) -> bool:
        """Keep one request's usage for ``_push_pending`` (what its project has budgets for); whether any."""
        cfg = self.configs[project]
        tokens = tokens if tokens > 0 and cfg.daily_token_budget is not None else 0
        cost = cost if cfg.daily_cost_budget_usd is not None else 0
        if not (tokens or cost):
            return False
        day = utc_day()
        self._pending.append(
            _Pending(project, day, tokens, cost, request_id, self._seed_ids.get(day, ""), kind)
        )
        if self.state.up and not self._pushing:  # e.g. a request admitted on the share that ended after the
            self._pushing = True  # reconnection: added now, not at the next one
            self.state.spawn(self._push_later(), name="shared-limits-push")
        return True

    async def _push_later(self) -> None:
        try:
            while self._pending and self.state.up:  # and what came meanwhile
                await self._push_pending()
        except SharedUnavailable:
            pass  # kept for the next connection
        finally:
            self._pushing = False

    @property
    def pending_requests(self) -> int:
        """Requests whose usage waits to be added to the shared counters (a gauge)."""
        return len(self._pending)

    async def _push_pending(self) -> None:
        """Add the usage counted while Redis was away, each request once (``PUSH``); a day not seeded yet is
        seeded first. What cannot be added now is kept for the next connection (and the error raised)."""
        day = utc_day()
        pending, self._pending = [p for p in self._pending if p.day == day], []  # past days: too late
        if not pending or self.state.redis is None:
            return
        keys = [self.seeded_key(day), self.counted_key(day)]
        index: dict[str, int] = {}

        def at(key: str) -> int:
            if key not in index:
                keys.append(key)
                index[key] = len(keys)
            return index[key]

        values: list[Any] = [DAY_TTL_S]
        for p in pending:
            values += [
                at(self.used_key(p.project, day)) if p.tokens else 0, p.tokens,
                at(self.cost_key(p.project, day)) if p.nanos else 0, p.nanos,
                p.request_id, p.seed, p.kind,
            ]  # fmt: skip
        if self._push is None:
            self._push = self.state.redis.register_script(PUSH)
        push = self._push
        try:
            for _ in range(3):
                added = await self.state.call(
                    "adding the usage counted while Redis was away", lambda _r: push(keys=keys, args=values)
                )
                if added >= 0:
                    log.info("shared state: %d requests' usage counted while Redis was away added", added)
                    return
                await self.ensure_seeded(day)  # not seeded: a rebuild would overwrite what is added
            raise SharedUnavailable("the day's budget counters are not seeded", "seed")
        except BaseException:  # not added: kept for the next connection (and re-raised)
            self._pending = pending + self._pending
            raise
