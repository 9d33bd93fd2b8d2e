"""The key store through a database outage (gateway.store.keys): a key verified within ``key_stale_ttl_s``
still authenticates (the last known good), a key not seen lately gets a 503 with Retry-After, a hung
database costs one lookup deadline and then is not asked again for a moment, a revocation seen through
Redis bites at once, and once the database is back it decides again. Real SQLite and PostgreSQL; the
outage is the store's engine pointed at a port where nothing listens, or one that never answers."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import event

from gateway.core.metrics import GatewayMetrics
from gateway.errors import StoreUnavailable
from gateway.redis.channels import KeyRevocations
from gateway.store import db
from gateway.store.db import create_engine
from gateway.store.keys import KeyStore
from tests.gateway.serving import free_port

SECRET = b"s" * 32


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _dead_url(db_backend: str, tmp_path) -> str:
    if db_backend == "postgresql":
        return f"postgresql+asyncpg://u:p@127.0.0.1:{free_port()}/gone"
    return f"sqlite+aiosqlite:///{tmp_path}/no-such-dir/nothing/keys.db"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.service("postgresql"))])
def db_backend(request) -> str:
    return request.param


async def test_a_key_seen_lately_authenticates_through_an_outage_and_an_unseen_one_gets_a_503(
    db_url, db_backend, tmp_path
):
    engine = create_engine(db_url)
    clock = Clock()
    keys = KeyStore(engine, SECRET, cache_ttl_s=1, stale_ttl_s=60, lookup_timeout_s=5, monotonic=clock)
    seen, seen_info = await keys.create("alpha", "seen")
    unseen, _ = await keys.create("alpha", "unseen")
    keys.forget_all()
    assert (await keys.authenticate(seen)).id == seen_info.id  # verified by the database

    dead = create_engine(_dead_url(db_backend, tmp_path))
    keys._engine = dead  # the database goes away
    try:
        clock.now += 2  # past the fresh cache: the store is asked, and cannot answer
        assert (await keys.authenticate(seen)).id == seen_info.id  # the last known good
        assert keys.stale_served == 1
        with pytest.raises(StoreUnavailable) as ei:
            await keys.authenticate(unseen)
        assert ei.value.status == 503 and ei.value.retry_after == "1"
        with pytest.raises(StoreUnavailable):  # a key that is not the one verified: cannot be checked now
            await keys.authenticate(seen + "x")
        clock.now += 60  # past key_stale_ttl_s: no longer vouched for
        with pytest.raises(StoreUnavailable):
            await keys.authenticate(seen)
        metrics = GatewayMetrics(CollectorRegistry())  # what /metrics says of it
        metrics.bind_keys(keys)
        assert metrics.registry.get_sample_value("gateway_keys_stale_served_total") == 1
        assert metrics.registry.get_sample_value("gateway_keys_store_unavailable_total") == 3
    finally:
        keys._engine = engine
        await dead.dispose()

    # back: the database decides again (a revocation made meanwhile by the CLI, which publishes nothing)
    try:
        cli = KeyStore(engine, SECRET, cache_ttl_s=0)
        assert await cli.revoke(seen_info.id)
        clock.now += 2  # past the moment the store is not asked after a failure
        assert await keys.authenticate(seen) is None
        assert await keys.authenticate(unseen) is not None
    finally:
        await engine.dispose()


@pytest.mark.service("postgresql")
async def test_a_hung_database_costs_one_lookup_deadline_then_is_not_asked_for_a_moment(pg_server):
    engine = create_engine(await pg_server.create_database())
    clock = Clock()
    keys = KeyStore(engine, SECRET, cache_ttl_s=1, stale_ttl_s=60, lookup_timeout_s=0.5, monotonic=clock)
    key, info = await keys.create("alpha", "k")
    unseen, _ = await keys.create("alpha", "u")
    keys.forget_all()
    await keys.authenticate(key)

    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    hung = create_engine(f"postgresql+asyncpg://u:p@127.0.0.1:{silent.getsockname()[1]}/x")
    attempts = []
    event.listen(hung.sync_engine, "do_connect", lambda *a: attempts.append(1))
    keys._engine = hung
    try:
        clock.now += 2
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert (await keys.authenticate(key)).id == info.id  # after the 0.5 s deadline: the last known good
        assert loop.time() - started < 10  # the lookup's deadline, not the driver's own 60 s
        assert len(attempts) == 1
        # for a moment after the failure the store is not asked: answered at once, from memory
        assert (await keys.authenticate(key)).id == info.id
        with pytest.raises(StoreUnavailable, match="did not answer a moment ago"):
            await keys.authenticate(unseen)
        assert len(attempts) == 1 and keys.stale_served == 2
        clock.now += 1.5  # then it is tried again
        with pytest.raises(StoreUnavailable, match="no answer within 0.5 s"):
            await keys.authenticate(unseen)
        assert len(attempts) == 2
    finally:
        keys._engine = engine
        await hung.dispose()
        silent.close()
        await engine.dispose()


@pytest.mark.service("postgresql")
async def test_a_server_that_stops_answering_on_an_open_connection_costs_one_lookup_deadline(pg_server):
    """Every PostgreSQL process stopped with the pool's connection open (a hung server, not a refused
    connection): the last known good answers after the lookup's deadline, while the cancelled statement's
    connection is still being closed (SQLAlchemy closes it gracefully, which waits 2 s more on a hung
    server: that wait is not the request's)."""
    engine = create_engine(await pg_server.create_database())
    clock = Clock()
    keys = KeyStore(engine, SECRET, cache_ttl_s=1, stale_ttl_s=60, lookup_timeout_s=0.5, monotonic=clock)
    key, info = await keys.create("alpha", "k")
    keys.forget_all()
    await keys.authenticate(key)  # the pool holds an open connection
    try:
        with pg_server.server.frozen():
            clock.now += 2
            assert (await keys.authenticate(key)).id == info.id  # the last known good
            assert len(db._abandoned) == 1  # answered before the cancelled statement's cleanup ended
        for task in list(db._abandoned):  # once the server answers again it ends
            with contextlib.suppress(asyncio.CancelledError):
                await task
    finally:
        await engine.dispose()


async def test_a_revocation_seen_through_redis_bites_during_the_outage(db_url, db_backend, tmp_path):
    """Another process revoked the key (its message reached this one): the key is refused as revoked,
    never served from the last known good; a rotation only makes it looked up again."""
    engine = create_engine(db_url)
    clock = Clock()
    keys = KeyStore(engine, SECRET, cache_ttl_s=1, stale_ttl_s=60, monotonic=clock)
    revoked, revoked_info = await keys.create("alpha", "r")
    rotated, rotated_info = await keys.create("alpha", "o")
    kept, _ = await keys.create("alpha", "k")
    for k in (revoked, rotated, kept):
        assert await keys.authenticate(k) is not None

    channel = KeyRevocations.__new__(KeyRevocations)  # its message handler alone, as the subscriber calls it
    channel.keys = keys
    channel._message(f"revoked {revoked_info.id}")
    channel._message(f"changed {rotated_info.id}")

    dead = create_engine(_dead_url(db_backend, tmp_path))
    keys._engine = dead
    try:
        assert await keys.authenticate(revoked) is None  # bites at once: a 401, not the last known good
        with pytest.raises(StoreUnavailable):  # changed: must be looked up again, and cannot be
            await keys.authenticate(rotated)
        clock.now += 2
        assert await keys.authenticate(kept) is not None  # every other key goes on
        channel._message("an older gateway's message")  # no key named: every key is forgotten
        with pytest.raises(StoreUnavailable):
            await keys.authenticate(kept)
    finally:
        keys._engine = engine
        await dead.dispose()
        await engine.dispose()
