"""The limits in this process only: concurrency with a bounded queue wait, rpm and tpm (aiolimiter), daily
token and cost budgets; and a deployment's rpm/tpm window for routing.

The interface and the refusals' messages are ``gateway.limits.base``'s; ``gateway.limits.redis`` is the same
across processes. The daily cost budget (``daily_cost_budget_usd``) works as the token budget does, in US
dollars: ``cost_reserve`` (the pipeline prices the request's output cap and input estimate) is held while
the request runs, so the budget is overshot by at most one request's reservation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from aiolimiter import AsyncLimiter

from gateway.config import ProjectConfig
from gateway.limits.base import refusal
from gateway.limits.slots import FairSlots

WINDOW_S = 60.0  # a deployment's rpm/tpm window


def _seconds_until_capacity(limiter: AsyncLimiter, amount: float) -> float:
    """How long until ``amount`` fits in the leaky bucket (aiolimiter exposes no public API for this)."""
    limiter.has_capacity(amount)  # leaks the bucket up to now
    level = getattr(limiter, "_level", limiter.max_rate)
    rate = limiter.max_rate / limiter.time_period
    needed = level + amount - limiter.max_rate
    return max(needed / rate, 0.0)


def _adjust_level(limiter: AsyncLimiter, delta: float) -> None:
    """Settle a reservation: return unused tokens to (or charge extra tokens against) the bucket."""
    if hasattr(limiter, "_level"):
        limiter.has_capacity(0)
        limiter._level = max(0.0, limiter._level + delta)


def share_of(cfg: ProjectConfig, processes: int) -> ProjectConfig:
    """The limits one of ``processes`` gateway processes enforces on its own (while the shared state is
    unreachable): each limit divided by ``processes``, rounded down, at least 1."""
    if processes <= 1:
        return cfg

    def part(value: int | None) -> int | None:
        return None if value is None else max(1, value // processes)

    return cfg.model_copy(
        update={
            "max_concurrency": part(cfg.max_concurrency),
            "rpm": part(cfg.rpm),
            "tpm": part(cfg.tpm),
            "daily_token_budget": part(cfg.daily_token_budget),
            "daily_cost_budget_usd": None
            if cfg.daily_cost_budget_usd is None
            else cfg.daily_cost_budget_usd / processes,
        }
    )


def _next_utc_midnight(epoch_s: float) -> float:
    """The epoch seconds of the next 00:00 UTC after ``epoch_s``."""
    return (epoch_s // 86400 + 1) * 86400


@dataclass(slots=True)
class LocalAdmission:
    """``gateway.limits.base.Admission`` in this process."""

    project: ProjectLimits
    reserved_tokens: int  # held in the tpm bucket until settled
    queue_wait_s: float
    budget_reserved: int = 0  # held against the daily budget until settled
    cost_reserved: float = 0.0  # US dollars held against the daily cost budget until settled
    released: bool = False
    request_id: str = ""

    @property
    def shared_pending(self) -> bool:
        """Admitted on a process's own share of shared limits (``gateway.limits.base.Admission``)."""
        return self.project.SHARED_PENDING

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.project._release()

    def settle(self, actual_tokens: int, cost_usd: float = 0.0) -> None:
        self.project._settle(
            self.reserved_tokens,
            self.budget_reserved,
            actual_tokens,
            self.cost_reserved,
            cost_usd,
            self.request_id,
        )
        self.reserved_tokens = self.budget_reserved = 0
        self.cost_reserved = 0.0


class ProjectLimits:
    """One project's limits in this process (``gateway.limits.base.ProjectLimiter``)."""

    SHARED_PENDING = False  # its admissions' usage is in shared counters already (there are none)

    def __init__(
        self,
        name: str,
        cfg: ProjectConfig,
        used_today: int = 0,
        clock: Callable[[], float] = time.time,
        cost_today: float = 0.0,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._rpm = AsyncLimiter(cfg.rpm, 60) if cfg.rpm else None
        self._tpm = AsyncLimiter(cfg.tpm, 60) if cfg.tpm else None
        self.in_flight = 0
        self.waiting = 0
        self._clock = clock
        self._day_ends = _next_utc_midnight(clock())  # epoch seconds; a float compare per request
        self.used_today = used_today
        # Tokens reserved against the daily budget by requests in flight (their input estimate plus their
        # output cap): a request is admitted only while used + reserved is under the budget, so the most
        # the budget can be overshot is one request's reservation, however many run at once.
        self.budget_reserved = 0
        # the same for the daily cost budget, in US dollars
        self.cost_today = cost_today
        self.cost_reserved = 0.0

    def budget_remaining(self) -> int | None:
        if self.cfg.daily_token_budget is None:
            return None
        self._roll_day()
        return max(0, self.cfg.daily_token_budget - self.used_today)

    def cost_budget_remaining(self) -> float | None:
        if self.cfg.daily_cost_budget_usd is None:
            return None
        self._roll_day()
        return max(0.0, self.cfg.daily_cost_budget_usd - self.cost_today)

    def _roll_day(self) -> None:
        now = self._clock()
        if now >= self._day_ends:
            self._day_ends = _next_utc_midnight(now)
            self.used_today = 0
            self.cost_today = 0.0

    async def admit(
        self, max_tokens: int | None, input_estimate: int = 0, cost_reserve: float = 0.0, request_id: str = ""
    ) -> LocalAdmission:
        """``gateway.limits.base.ProjectLimiter.admit``."""
        cfg = self.cfg
        budget_reserve = 0
        if cfg.daily_cost_budget_usd is not None:
            self._check_cost_budget(cfg.daily_cost_budget_usd)
        else:
            cost_reserve = 0.0
        if cfg.daily_token_budget is not None:
            self._roll_day()
            if self.used_today + self.budget_reserved >= cfg.daily_token_budget:
                spent = self.used_today >= cfg.daily_token_budget
                raise refusal(
                    "daily_budget_spent" if spent else "daily_budget_reserved",
                    self._day_ends - self._clock(),
                    name=self.name,
                    used=self.used_today,
                    reserved=self.budget_reserved,
                    budget=cfg.daily_token_budget,
                )
            budget_reserve = max(0, input_estimate) + (max_tokens or cfg.default_max_tokens)
        # Check every limit before consuming any: a request refused by one limit must not use up another.
        if self._rpm is not None and not self._rpm.has_capacity(1):
            raise refusal("rpm", _seconds_until_capacity(self._rpm, 1), name=self.name, rpm=cfg.rpm)
        reserve = 0
        if self._tpm is not None:
            reserve = min(max_tokens or cfg.default_max_tokens, int(self._tpm.max_rate))
            if not self._tpm.has_capacity(reserve):
                raise refusal(
                    "tpm",
                    _seconds_until_capacity(self._tpm, reserve),
                    name=self.name,
                    tpm=cfg.tpm,
                    reserve=reserve,
                )
        # Both have capacity, so neither acquire waits (no await point between the checks and here).
        self.budget_reserved += budget_reserve
        self.cost_reserved += cost_reserve
        if self._rpm is not None:
            await self._rpm.acquire(1)
        if self._tpm is not None:
            await self._tpm.acquire(reserve)
        t0 = time.perf_counter()
        if self._sem.locked():
            self.waiting += 1
            try:
                async with asyncio.timeout(cfg.queue_timeout_s):
                    await self._sem.acquire()
            except TimeoutError:
                self._refund(reserve, budget_reserve, cost_reserve)
                raise refusal(
                    "concurrency",
                    name=self.name,
                    max_concurrency=cfg.max_concurrency,
                    queue_timeout_s=cfg.queue_timeout_s,
                ) from None
            except BaseException:  # cancelled while queued: it never reached the upstream
                self._refund(reserve, budget_reserve, cost_reserve)
                raise
            finally:
                self.waiting -= 1
        else:
            await self._sem.acquire()
        self.in_flight += 1
        return LocalAdmission(
            self, reserve, time.perf_counter() - t0, budget_reserve, cost_reserve, request_id=request_id
        )

    def _check_cost_budget(self, budget: float) -> None:
        """Refuse while the day's cost plus the reservations in flight reach the cost budget."""
        self._roll_day()
        if self.cost_today + self.cost_reserved < budget:
            return
        raise refusal(
            "daily_cost_budget_spent" if self.cost_today >= budget else "daily_cost_budget_reserved",
            self._day_ends - self._clock(),
            name=self.name,
            spent=self.cost_today,
            reserved=self.cost_reserved,
            budget=budget,
        )

    def _refund(self, reserve: int, budget_reserve: int, cost_reserve: float = 0.0) -> None:
        """Give back the rpm slot and the reservations of a request that was not admitted after all."""
        self.budget_reserved = max(0, self.budget_reserved - budget_reserve)
        self.cost_reserved = max(0.0, self.cost_reserved - cost_reserve)
        if self._rpm is not None:
            _adjust_level(self._rpm, -1)
        if self._tpm is not None:
            _adjust_level(self._tpm, -reserve)

    def _release(self) -> None:
        self.in_flight -= 1
        self._sem.release()

    def _settle(
        self,
        reserved: int,
        budget_reserved: int,
        actual: int,
        cost_reserved: float = 0.0,
        cost: float = 0.0,
        request_id: str = "",  # the request settled (FallbackLimits notes it)
    ) -> None:
        if self._tpm is not None and actual != reserved:
            _adjust_level(self._tpm, actual - reserved)
        self.budget_reserved = max(0, self.budget_reserved - budget_reserved)
        self.cost_reserved = max(0.0, self.cost_reserved - cost_reserved)
        self._roll_day()
        self.used_today += actual
        self.cost_today += max(0.0, cost)


class Limits:
    """All projects' limiters in this process, built from the settings (``gateway.limits.base.Limiters``)."""

    def __init__(
        self,
        projects: dict[str, ProjectConfig],
        used_today: dict[str, int] | None = None,
        cost_today: dict[str, float] | None = None,
    ) -> None:
        used_today = used_today or {}
        cost_today = cost_today or {}
        self.projects = {
            n: ProjectLimits(n, c, used_today.get(n, 0), cost_today=cost_today.get(n, 0.0))
            for n, c in projects.items()
        }

    def __getitem__(self, name: str) -> ProjectLimits:
        return self.projects[name]

    def deployment(self, model: str, name: str, rpm: int | None, tpm: int | None) -> DeploymentWindow:
        return DeploymentWindow(rpm, tpm)

    def provider(self, name: str, capacity: int) -> FairSlots:
        return FairSlots(capacity)


class DeploymentWindow:
    """A deployment's rpm/tpm in this process (``gateway.limits.base.DeploymentLimiter``): requests and
    tokens counted over fixed one-minute windows, from the first attempt after the last window ended."""

    __slots__ = ("rpm", "tpm", "start", "requests", "tokens")
    shared = False

    def __init__(self, rpm: int | None, tpm: int | None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self.start = 0.0
        self.requests = 0
        self.tokens = 0

    def limited(self, now: float) -> bool:
        if now - self.start >= WINDOW_S:
            self.start, self.requests, self.tokens = now, 0, 0
            return False
        return (self.rpm is not None and self.requests >= self.rpm) or (
            self.tpm is not None and self.tokens >= self.tpm
        )

    def free_at(self, now: float) -> float:
        return self.start + WINDOW_S if self.limited(now) else now

    async def take(self, now: float, tokens: int, force: bool = False) -> bool:
        return force or not self.limited(now)  # counted by ``begin``

    def begin(self, tokens: int) -> None:
        self.requests += 1
        self.tokens += tokens

    def settle(self, estimate: int, actual: int) -> None:
        if self.tpm is not None:
            self.tokens = max(0, self.tokens + actual - estimate)
