"""Key revocations and summary claims between processes (gateway.redis.channels), on a real redis-server:
one process's shared state each, one Redis, one key prefix."""

from __future__ import annotations

import asyncio
import time

import pytest
from shared_redis import shared_states  # noqa: F401  (the fixture)

from gateway.redis.errors import SharedUnavailable
from gateway.store.db import create_engine
from gateway.store.keys import KEY_RE, KeyStore


async def test_one_process_makes_the_call_and_the_other_gets_its_answer(shared_states):  # noqa: F811
    (a, _), (b, _) = await shared_states(), await shared_states()
    assert await a.summaries.get("set-1") is None
    kind, token = await a.summaries.claim("set-1")
    assert kind == "claimed"
    waiting = asyncio.create_task(b.summaries.claim("set-1"))  # a holds the lock: b waits for its outcome
    await a.summaries.done("set-1", token, b"the drafts", complete=True)
    assert await waiting == ("answer", b"the drafts")
    assert await b.summaries.get("set-1") == b"the drafts"  # a complete answer is the cache too
    assert await a.summaries.claim("set-1") == ("answer", b"the drafts")


async def test_an_answer_with_a_gap_is_not_cached(shared_states):  # noqa: F811
    (a, _), (b, _) = await shared_states(), await shared_states()
    kind, token = await b.summaries.claim("set-2")
    await b.summaries.done("set-2", token, b"some drafts", complete=False)
    assert await a.summaries.get("set-2") is None
    kind, _ = await a.summaries.claim("set-2")  # the lock is free: the next request makes a call of its own
    assert kind == "claimed"


async def test_claims_need_redis(shared_states):  # noqa: F811
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    state, _ = await shared_states(url=f"redis://127.0.0.1:{port}/0")
    with pytest.raises(SharedUnavailable):
        await state.summaries.claim("set-3")
    with pytest.raises(SharedUnavailable):
        await state.summaries.get("set-3")


async def test_a_key_revoked_in_one_process_is_refused_by_the_other_at_once(shared_states, db_url):  # noqa: F811
    secret = b"test-secret-0123456789"
    stores = [KeyStore(create_engine(db_url), secret, cache_ttl_s=1.0) for _ in range(2)]
    try:
        for store in stores:
            await shared_states(keys=store)
        one, two = stores
        key, _ = await one.create("alpha", "test")
        assert await two.authenticate(key) is not None  # cached in two: trusted for 1 s without a lookup
        assert await one.revoke(KEY_RE.match(key).group(1))  # published
        deadline = time.monotonic() + 0.5
        while await two.authenticate(key) is not None:
            assert time.monotonic() < deadline, "two still trusts the revoked key"
            await asyncio.sleep(0.01)
    finally:
        for store in stores:
            await store._engine.dispose()
