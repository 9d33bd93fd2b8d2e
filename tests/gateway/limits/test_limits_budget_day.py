"""The daily token budget resets at 00:00 UTC (driven by an injected clock, no gateway needed)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gateway.config import ProjectConfig
from gateway.limits.base import LimitExceeded
from gateway.limits.local import ProjectLimits


async def test_the_budget_resets_at_utc_midnight_and_the_refusal_says_how_long_until_then():
    now = [datetime(2026, 11, 29, 23, 59, 0, tzinfo=UTC).timestamp()]
    p = ProjectLimits("alpha", ProjectConfig(models=["m"], daily_token_budget=100), clock=lambda: now[0])
    a = await p.admit(10)
    a.release()
    a.settle(100)
    assert p.budget_remaining() == 0
    with pytest.raises(LimitExceeded) as e:
        await p.admit(10)
    assert e.value.limit == "daily_budget" and e.value.retry_after_s == pytest.approx(60)
    now[0] += 59.5  # 23:59:59.5: still the same day
    assert p.budget_remaining() == 0
    now[0] += 1  # 00:00:00.5 the next day
    assert p.budget_remaining() == 100
    a = await p.admit(10)
    a.release()
    a.settle(30)
    assert p.used_today == 30
