"""The key cache: requests that miss it together share one store query, and a revocation is not undone
by a lookup that began before it."""

from __future__ import annotations

import asyncio

from sqlalchemy import event

from gateway.store.db import create_engine, create_tables
from gateway.store.keys import KeyStore


async def test_a_burst_on_a_cold_cache_queries_the_store_once_and_revocation_still_wins(tmp_path):
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'k.db'}")
    await create_tables(engine)
    lookups = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _count(_conn, _cursor, statement, *_args):
        if statement.lstrip().upper().startswith("SELECT") and "gateway_api_keys" in statement:
            lookups.append(statement)

    try:
        keys = KeyStore(engine, b"s" * 32, cache_ttl_s=60)
        key, info = await keys.create("alpha", "bench")
        other, _ = await keys.create("beta", "bench")
        keys.forget_all()  # cold, as after start or a TTL expiry
        lookups.clear()
        got = await asyncio.gather(*(keys.authenticate(k) for k in [key] * 20 + [other] * 5))
        assert [g.project for g in got] == ["alpha"] * 20 + ["beta"] * 5
        assert len(lookups) == 2  # one per key, not one per request
        assert await keys.authenticate(key + "x") is None  # a wrong secret part: no match

        # a lookup in flight when the key is revoked must not put the key back in the cache
        keys.forget_all()
        slow = asyncio.ensure_future(keys.authenticate(key))
        await asyncio.sleep(0)  # its query has started
        assert await keys.revoke(info.id)
        await slow  # whatever it saw, it began before the revocation
        assert await keys.authenticate(key) is None
        assert await keys.authenticate(other) is not None
    finally:
        await engine.dispose()


def test_a_key_is_usable_at_a_clock_as_at_its_time_and_reads_it_only_when_it_expires():
    """``usable_at(clock)`` (the request path's) answers as ``usable(clock())`` for every state of a key,
    and reads no time for a key without an expiry."""
    from datetime import UTC, datetime, timedelta

    from gateway.store.keys import KeyInfo

    now = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
    reads: list[int] = []

    def clock() -> datetime:
        reads.append(1)
        return now

    for expires in (None, now - timedelta(seconds=1), now, now + timedelta(seconds=1)):
        for revoked in (None, now - timedelta(days=1)):
            for rotated in (None, "k2"):
                info = KeyInfo("k1", "p", "n", now - timedelta(days=2), expires, revoked, rotated)
                reads.clear()
                assert info.usable_at(clock) is info.usable(now), (expires, revoked, rotated)
                if expires is None:
                    assert reads == []
