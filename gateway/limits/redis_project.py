"""One project's limits through Redis: admission, the queue for a slot, release and settlement, with the Lua
scripts of ``gateway.limits.redis_scripts`` (``gateway.limits.redis`` has the whole; ``gateway.limits.base``
the interface and refusals).

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
- While Redis is down: ``local``, this process's share of the project's limits; with ``redis_outage:
  refuse``, a 503 (``gateway.errors.LimitsUnavailable``) with Retry-After instead.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable
from typing import Any, Protocol

from gateway.config import ProjectConfig
from gateway.errors import LimitsUnavailable
from gateway.limits.base import BY_CODE, refusal
from gateway.limits.local import LocalAdmission, ProjectLimits
from gateway.limits.redis_scripts import (
    ADMIT,
    DAY_TTL_S,
    NANO_USD,
    REFUND,
    SETTLE,
    SLOT,
    nanos,
    utc_day,
)
from gateway.redis.errors import REDIS_ERRORS, ReplyError, SharedUnavailable
from gateway.redis.lane import args, eval_prefix
from gateway.redis.state import SharedState

_POLL_START_S = 0.025
_POLL_MAX_S = 0.25


class SharedLimits(Protocol):
    """What one project's limits use of the whole (``gateway.limits.redis.SharedLimits``, which builds them):
    the connection, the budgets' counters, and the waiters for a release."""

    state: SharedState
    ch_release: str

    def used_key(self, project: str, day: int) -> str: ...

    def cost_key(self, project: str, day: int) -> str: ...

    def seeded_key(self, day: int) -> str: ...

    async def ensure_seeded(self, day: int) -> bool: ...

    def add_pending(
        self, project: str, tokens: int, usd: float, request_id: str, *, flagged: bool
    ) -> None: ...

    def wait_release(self, project: str, delay: float) -> Awaitable[bool]: ...

    def wake(self, project: str) -> None: ...


# --- one project ---------------------------------------------------------------------------------------
class FallbackLimits(ProjectLimits):
    """This process's share of a project's limits, used while Redis is down; its usage is added to the
    shared counter once Redis is back (its admissions' ledger rows say ``shared_pending``)."""

    SHARED_PENDING = True

    def __init__(
        self, name: str, cfg: ProjectConfig, used_today: int, limits: SharedLimits, cost_today: float = 0.0
    ) -> None:
        super().__init__(name, cfg, used_today, cost_today=cost_today)
        self._limits = limits

    def _settle(
        self,
        reserved: int,
        budget_reserved: int,
        actual: int,
        cost_reserved: float = 0.0,
        cost: float = 0.0,
        request_id: str = "",
    ) -> None:
        super()._settle(reserved, budget_reserved, actual, cost_reserved, cost)
        self._limits.add_pending(self.name, actual, cost, request_id, flagged=True)


class SharedAdmission:
    """An admission through Redis (``gateway.limits.base.Admission``). ``release`` and ``settle`` are sent
    together as one script (the pipeline calls one right after the other), without waiting for the answer:
    ``settle`` sends at once, so ``shared_pending`` says right after it whether Redis was there to take it
    (the ledger row, written next, says so too)."""

    __slots__ = (
        "project", "lid", "day", "reserved_tokens", "budget_reserved", "queue_wait_s", "released",
        "_release_due", "_settle_due", "_actual", "_scheduled", "_cost", "request_id", "shared_pending",
    )  # fmt: skip

    def __init__(
        self, project: SharedProjectLimits, lid: str, day: int, reserve: int, budget: int, request_id: str
    ) -> None:
        self.project = project
        self.request_id = request_id
        self.shared_pending = False  # its settlement could not be sent: counted when Redis is back
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
        self.project._flush(self)  # with the release before it, if due (its scheduled flush finds nothing)

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

    def cost_budget_remaining(self) -> float | None:
        budget = self.cfg.daily_cost_budget_usd
        if budget is None:
            return None
        if not self.state.up:  # this process's share, as the whole budget's
            share = self.local.cost_budget_remaining()
            return None if share is None else share * self.state.fallback_processes
        spent = self._cost[1] / NANO_USD if self._cost is not None and self._cost[0] == utc_day() else 0.0
        return max(0.0, budget - spent)

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

    async def _without_redis(
        self, max_tokens: int | None, input_estimate: int, cost_reserve: float, request_id: str
    ) -> LocalAdmission:
        """Redis is down: this process's share of the limits, or, with ``redis_outage: refuse``, a 503 with
        Retry-After (the next reconnection attempt)."""
        st = self.state
        if st.refuse:
            raise LimitsUnavailable(
                f"the shared limits of project {self.name!r} cannot be checked: Redis is unreachable and "
                "the gateway is set to refuse requests then (redis_outage: refuse)",
                code="limits_unavailable",
                retry_after=str(max(1, math.ceil(st.interval_s))),
                limit="redis_outage",
            )
        st.fallback_admissions += 1
        return await self.local.admit(max_tokens, input_estimate, cost_reserve, request_id)

    async def admit(
        self, max_tokens: int | None, input_estimate: int = 0, cost_reserve: float = 0.0, request_id: str = ""
    ) -> SharedAdmission | LocalAdmission:
        """``gateway.limits.base.ProjectLimiter.admit``; while Redis is down, ``_without_redis``."""
        st = self.state
        if st._state is not True:
            return await self._without_redis(max_tokens, input_estimate, cost_reserve, request_id)
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
            return await self._without_redis(max_tokens, input_estimate, cost_reserve, request_id)
        status = res[0]
        if status == 2 and res[1] in (5, 6):  # the cost budget: used and reserved are nano-dollars
            self._cost = (day, res[3])
        elif cfg.daily_token_budget is not None:
            self._used = (day, res[3] if status == 2 else res[1])
        if status == 2:
            raise self._refusal(res, reserve)
        adm = SharedAdmission(self, lid, day, reserve, budget_reserve, request_id)
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
            return await self._without_redis(max_tokens, input_estimate, cost_reserve, adm.request_id)
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
        if not (release or settle):
            return
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
            # a settlement Redis did not take: counted later, and the request's ledger row says so
            if settle:
                adm.shared_pending = True
                self.limits.add_pending(self.name, actual, cost, adm.request_id, flagged=True)
            return
        if release and self._waiting:
            self.limits.wake(self.name)  # a local waiter's retry goes out after this release
        fut.add_done_callback(lambda f: self._settled(f, day, actual, cost, payload, adm.request_id))

    def _saw_settled(self, day: int, reply: Any) -> None:
        """The settle script's reply: [the day's used tokens, the day's cost in nano-dollars] (-1: not
        counted)."""
        if isinstance(reply, list) and len(reply) == 2:
            used, cost = reply
            if isinstance(used, int) and used >= 0:
                self._used = (day, used)
            if isinstance(cost, int) and cost >= 0:
                self._cost = (day, cost)

    def _settled(
        self, fut: asyncio.Future, day: int, actual: int, cost: float, payload: bytes, request_id: str
    ) -> None:
        if fut.cancelled():  # the lane was closed on purpose (stop): counted when a process seeds the day
            return
        err = fut.exception()
        if err is None:
            self._saw_settled(day, fut.result())
            return
        if isinstance(err, ReplyError) and err.noscript:  # Redis restarted: load the scripts, send it again
            self.state.spawn(self._resend(payload, day, actual, cost, request_id))
            return
        if isinstance(err, ReplyError):  # refused: not counted (the row, written already, does not say so)
            self.limits.add_pending(self.name, actual, cost, request_id, flagged=False)
        # A timeout or a lost connection after it went out: not added again. Redis runs what it received
        # (a hung one, once it resumes), and a Redis that lost it lost the day too (the ledger rebuilds it).
        if isinstance(err, REDIS_ERRORS):
            self.state.lost(err)
        else:
            raise err  # not a Redis failure: a bug, reported by the event loop with its traceback

    async def _resend(self, payload: bytes, day: int, actual: int, cost: float, request_id: str) -> None:
        try:
            reply = await self.state.run(SETTLE, payload)
        except SharedUnavailable:
            self.limits.add_pending(self.name, actual, cost, request_id, flagged=False)
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
