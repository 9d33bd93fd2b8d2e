"""The limits' interface, and the one table of refusals both implementations use.

Two implementations, chosen when the gateway starts (``gateway.http.app``):

- ``gateway.limits.local``: in this process only (``Limits``), as each process sees its own requests;
- ``gateway.limits.redis``: the same limits across every gateway process that shares a Redis
  (``redis_url``; ``SharedLimits``), each process falling back to its share of every limit while Redis is
  unreachable.

What the gateway calls (typing Protocols, below): ``limits[project]`` is a ``ProjectLimiter``; its
``admit(max_tokens, input_estimate, cost_reserve)`` gives an ``Admission`` or raises ``LimitExceeded``
(a 429 naming the limit, with Retry-After); the admission has ``queue_wait_s``, ``release()`` (the
concurrency slot, once the upstream is done) and ``settle(actual_tokens, cost_usd)`` (the tpm and budget
reservations become the real usage). ``limits.deployment(model, name, rpm, tpm)`` is a
``DeploymentLimiter``: a deployment's own rpm/tpm, which routing (``gateway.upstream.routing``, given them by
the gateway) skips a deployment at rather than refusing the request. ``limits.provider(name, capacity)`` is
a ``ProviderSlots``: a provider's connection slots, shared fairly between projects, which its client
(``gateway.upstream.client``) holds one of per request in flight.

**Refusals**: ``RULES`` is every way admission can refuse: the limit it names (``x-farm-limit``), the code
the Redis admission script returns for it, the message, and its Retry-After. The in-process limiter and the
Redis one both build their ``LimitExceeded`` with ``refusal`` from it, so a message exists once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from gateway.config import ProjectConfig


class LimitExceeded(Exception):
    """A refused admission: ``limit`` names it, ``retry_after_s`` is when to try again."""

    def __init__(self, limit: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.message = message

    @property
    def retry_after_header(self) -> str:
        return str(max(1, math.ceil(self.retry_after_s)))


# --- the refusals --------------------------------------------------------------------------------------
ROOM = "until the request fits"  # rpm/tpm: computed by the limiter (its bucket; Redis' clock when shared)
MIDNIGHT = "until 00:00 UTC"  # a spent daily budget: computed by the limiter, at least 1 s
ONE_SECOND = "1 s"  # the rest is held by requests in flight, or the queue wait ran out: try again soon


@dataclass(frozen=True, slots=True)
class Rule:
    limit: str  # x-farm-limit, the metrics label, and the 429's code (``<limit>_limit_exceeded``)
    code: int  # what the Redis admission script returns for it (0: decided in Python by both)
    message: str  # str.format of the limiter's figures (see ``refusal``)
    retry: str  # ROOM, MIDNIGHT or ONE_SECOND


RULES: dict[str, Rule] = {
    "daily_budget_spent": Rule(
        "daily_budget", 1,
        "project {name!r} has used its daily token budget ({used}/{budget} tokens)",
        MIDNIGHT,
    ),
    "daily_budget_reserved": Rule(
        "daily_budget", 2,
        "project {name!r}: the requests in flight reserve the rest of its daily token budget "
        "({used} used + {reserved} reserved of {budget})",
        ONE_SECOND,
    ),
    "rpm": Rule(
        "rpm", 3, "project {name!r} is over its rate limit of {rpm} requests per minute", ROOM
    ),
    "tpm": Rule(
        "tpm", 4,
        "project {name!r} is over its rate limit of {tpm} tokens per minute "
        "(this request reserves {reserve})",
        ROOM,
    ),
    "daily_cost_budget_spent": Rule(
        "daily_cost_budget", 5,
        "project {name!r} has used its daily cost budget (${spent:.4f} of ${budget:g})",
        MIDNIGHT,
    ),
    "daily_cost_budget_reserved": Rule(
        "daily_cost_budget", 6,
        "project {name!r}: the requests in flight reserve the rest of its daily cost budget "
        "(${spent:.4f} spent + ${reserved:.4f} reserved of ${budget:g})",
        ONE_SECOND,
    ),
    "concurrency": Rule(
        "concurrency", 0,
        "project {name!r} has {max_concurrency} requests in flight and the queue wait of "
        "{queue_timeout_s:g} s ran out",
        ONE_SECOND,
    ),
}  # fmt: skip

BY_CODE: dict[int, str] = {r.code: key for key, r in RULES.items() if r.code}


def refusal(reason: str, wait_s: float = 0.0, **figures: object) -> LimitExceeded:
    """The ``LimitExceeded`` of ``RULES[reason]``: its message filled with ``figures`` (name, used,
    reserved, budget, rpm, tpm, reserve, spent, max_concurrency, queue_timeout_s: whichever it names), its
    Retry-After ``wait_s`` (the limiter's, for ROOM and MIDNIGHT) or 1 s."""
    rule = RULES[reason]
    retry_s = 1.0 if rule.retry == ONE_SECOND else wait_s
    return LimitExceeded(rule.limit, retry_s, rule.message.format(**figures))


# --- the interface -------------------------------------------------------------------------------------
class Admission(Protocol):
    """An admitted request's hold on its project's limits."""

    queue_wait_s: float  # how long it waited for a concurrency slot

    @property
    def shared_pending(self) -> bool:
        """Admitted on this process's own share of shared limits (Redis unreachable): its usage reaches the
        shared counters later (gateway.limits.redis), and its ledger row says so."""
        ...

    def release(self) -> None:
        """The upstream is done: the concurrency slot goes back (once; later calls do nothing)."""
        ...

    def settle(self, actual_tokens: int, cost_usd: float = 0.0) -> None:
        """The request's real tokens and cost replace its tpm and budget reservations."""
        ...


class ProjectLimiter(Protocol):
    """One project's limits."""

    name: str
    cfg: ProjectConfig

    @property
    def in_flight(self) -> int: ...  # admitted and not released (this process's; a gauge)

    @property
    def waiting(self) -> int: ...  # queued for a concurrency slot (this process's; a gauge)

    def budget_remaining(self) -> int | None:
        """Tokens left in today's budget (None: no budget)."""
        ...

    def cost_budget_remaining(self) -> float | None:
        """US dollars left in today's cost budget (None: no cost budget)."""
        ...

    async def admit(
        self, max_tokens: int | None, input_estimate: int = 0, cost_reserve: float = 0.0, request_id: str = ""
    ) -> Admission:
        """Admit one request (``request_id``, the ledger's) that may produce ``max_tokens`` (None: the
        project's default) after an input
        of about ``input_estimate`` tokens, costing at most about ``cost_reserve`` US dollars, or raise
        ``LimitExceeded`` (from ``RULES``). Order: cost budget, token budget, rpm, tpm, concurrency (which
        waits up to ``queue_timeout_s``); a request refused by one limit uses up none of the others."""
        ...


class DeploymentLimiter(Protocol):
    """A deployment's own rpm/tpm (``models.<m>.deployments[].rpm/tpm``), over one-minute windows: routing
    skips a deployment at them while another is usable (and sends to it anyway when none is). ``now``: the
    router's clock (monotonic seconds)."""

    shared: bool  # True: ``take`` is awaited before each attempt (the counters are in Redis)

    def limited(self, now: float) -> bool:
        """At its rpm or tpm, as far as this process knows."""
        ...

    def free_at(self, now: float) -> float:
        """When a limited deployment may be picked again (``now`` when it is not limited)."""
        ...

    async def take(self, now: float, tokens: int, force: bool = False) -> bool:
        """May an attempt of ``tokens`` go now? False: at its limits (then ``limited`` says so until it
        frees). ``force``: it goes anyway (every deployment is limited or cooling; a probe). A shared
        limiter counts the attempt here, atomically with the check."""
        ...

    def begin(self, tokens: int) -> None:
        """An attempt of ``tokens`` begins (counted here unless ``take`` counted it)."""
        ...

    def settle(self, estimate: int, actual: int) -> None:
        """The request's real tokens replace its estimate in the window."""
        ...


class ProviderSlots(Protocol):
    """A provider's ``capacity`` connection slots (``max_connections``), shared fairly between projects:
    free slots are taken at once; when they are scarce, a freed slot goes to the waiting project that holds
    the fewest (gateway.limits.slots)."""

    capacity: int
    free: int

    @property
    def waiting(self) -> int: ...  # requests waiting for a slot

    def held(self, project: str) -> int: ...

    async def acquire(self, project: str) -> float:
        """Take a slot for ``project``; returns the seconds waited for it."""
        ...

    def release(self, project: str) -> None:
        """Give a slot of ``project`` back (to the fairest waiter, if any)."""
        ...


class Limiters(Protocol):
    """Every project's limits, the deployments' and the providers' slots."""

    @property
    def projects(self) -> Mapping[str, ProjectLimiter]: ...

    def __getitem__(self, project: str) -> ProjectLimiter: ...

    def deployment(self, model: str, name: str, rpm: int | None, tpm: int | None) -> DeploymentLimiter:
        """The limiter of deployment ``name`` of public model ``model`` (at least one of rpm, tpm set)."""
        ...

    def provider(self, name: str, capacity: int) -> ProviderSlots:
        """The slots of provider ``name``'s ``capacity`` connections."""
        ...
