"""One project's limits through Redis (gateway.limits.redis_project, a real redis-server) refuse as the
in-process limiter (gateway.limits.local) does: for every rule of gateway.limits.base.RULES, the same
limit, the same message and the same Retry-After rule, from the one table."""

from __future__ import annotations

import pytest
from shared_redis import shared_states  # noqa: F401  (the fixture)

from gateway.config import ProjectConfig
from gateway.core.record import DayUsage
from gateway.limits.base import ONE_SECOND, RULES, LimitExceeded
from gateway.limits.local import ProjectLimits
from gateway.limits.redis_project import SharedAdmission


async def _admit(limiter, times: int, **admit) -> list:
    """``times`` admissions, held."""
    return [await limiter.admit(**admit) for _ in range(times)]


# reason -> (the project's limits, what it has used today: (tokens, US dollars), admissions before the one
# refused, the admit arguments)
CASES = {
    "rpm": ({"rpm": 2}, (0, 0.0), 2, {"max_tokens": 8}),
    "tpm": ({"tpm": 100}, (0, 0.0), 1, {"max_tokens": 80}),
    "daily_budget_spent": ({"daily_token_budget": 100}, (100, 0.0), 0, {"max_tokens": 8}),
    "daily_budget_reserved": (
        {"daily_token_budget": 100}, (0, 0.0), 2, {"max_tokens": 60, "input_estimate": 10},
    ),
    "daily_cost_budget_spent": ({"daily_cost_budget_usd": 1.0}, (0, 1.0), 0, {"max_tokens": 8}),
    "daily_cost_budget_reserved": (
        {"daily_cost_budget_usd": 1.0}, (0, 0.0), 2, {"max_tokens": 8, "cost_reserve": 0.6},
    ),
    "concurrency": ({"max_concurrency": 1, "queue_timeout_s": 0.05}, (0, 0.0), 1, {"max_tokens": 8}),
}  # fmt: skip


@pytest.mark.parametrize("reason", sorted(RULES))
async def test_redis_refuses_with_the_in_process_limiters_message(reason, shared_states):  # noqa: F811
    cfg, (tokens, usd), before, admit = CASES[reason]
    local = ProjectLimits("alpha", ProjectConfig(models=["m"], **cfg), used_today=tokens, cost_today=usd)

    async def seed() -> DayUsage:
        return DayUsage({"alpha": tokens}, {"alpha": usd}, [])

    _, limits = await shared_states({"alpha": cfg}, seed_source=seed)
    shared = limits["alpha"]
    refusals = []
    for limiter in (local, shared):
        held = await _admit(limiter, before, **admit)
        with pytest.raises(LimitExceeded) as ei:
            await limiter.admit(**admit)
        refusals.append(ei.value)
        for adm in held:
            adm.release()
    assert all(isinstance(a, SharedAdmission) for a in held)  # through Redis, not its fallback
    (mine, theirs), rule = refusals, RULES[reason]
    assert theirs.limit == mine.limit == rule.limit
    assert theirs.message == mine.message
    if rule.retry == ONE_SECOND:
        assert mine.retry_after_s == theirs.retry_after_s == 1.0
    else:  # until the bucket has room, or 00:00 UTC: each limiter's own clock
        assert mine.retry_after_s > 0 and theirs.retry_after_s > 0
