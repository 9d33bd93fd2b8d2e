"""Every project's limits through Redis (gateway.limits.redis, a real redis-server): the day's budget
counters are seeded from the ledger once; a ledger that cannot be read keeps a process on its own share;
the leases of a running request are renewed, and those of a process that stopped expire."""

from __future__ import annotations

import asyncio

import pytest
from shared_redis import shared_states  # noqa: F401  (the fixture)

from gateway.core.record import DayUsage
from gateway.errors import StoreUnavailable
from gateway.limits.base import LimitExceeded
from gateway.limits.local import LocalAdmission
from gateway.limits.redis import SharedLimits
from gateway.limits.redis_project import SharedAdmission
from gateway.limits.redis_scripts import utc_day


async def test_the_day_is_seeded_from_the_ledger_once(shared_states):  # noqa: F811
    calls = []

    async def ledger() -> DayUsage:
        calls.append(1)
        await asyncio.sleep(0)  # concurrent callers overlap here
        return DayUsage({"alpha": 40}, {}, [])

    project = {"alpha": {"daily_token_budget": 100}}
    (state, one), (_, two) = (
        await shared_states(project, seed_source=ledger),
        await shared_states(project, seed_source=ledger),
    )
    assert isinstance(one, SharedLimits) and len(calls) == 1  # the second process found the day seeded
    assert one["alpha"].budget_remaining() == 60
    await state.redis.delete(one.seeded_key(utc_day()))  # Redis lost the day (e.g. restarted empty)
    assert sum(await asyncio.gather(*(two.ensure_seeded(utc_day()) for _ in range(5)))) == 5
    assert len(calls) == 2  # one ledger query for the five


async def test_a_ledger_that_cannot_be_read_keeps_the_process_on_its_share(shared_states):  # noqa: F811
    async def unreadable() -> DayUsage:
        raise StoreUnavailable("the ledger could not be read: OperationalError: database is locked")

    state, limits = await shared_states({"alpha": {"daily_token_budget": 100}}, seed_source=unreadable)
    assert not state.up and "seeding the budget from the ledger failed" in state.status()["error"]
    adm = await limits["alpha"].admit(8)
    assert isinstance(adm, LocalAdmission) and state.fallback_admissions == 1


async def test_a_running_requests_slot_is_renewed_and_a_stopped_processs_expires(shared_states):  # noqa: F811
    cfg = {"max_concurrency": 1, "queue_timeout_s": 0.6}  # a queue wait of two leases
    (one_state, one), (_, two) = [await shared_states({"alpha": cfg}, redis_lease_s=0.3) for _ in range(2)]
    held = await one["alpha"].admit(8)
    assert isinstance(held, SharedAdmission)
    with pytest.raises(LimitExceeded) as ei:  # one's lease is renewed while its request runs
        await two["alpha"].admit(8)
    assert ei.value.limit == "concurrency"
    await one_state.stop()  # as a process that died: its slot is not released, its lease runs out
    adm = await two["alpha"].admit(8)
    assert isinstance(adm, SharedAdmission) and adm.queue_wait_s < 0.6
