"""What the tests of gateway.redis and gateway.limits.redis share: settings for a ``SharedState`` on the
session's redis-server (tests/gateway/conftest.py ``redis_server``) under a key prefix of its own, and the
``shared_states`` fixture (import it into a test module to use it), which starts processes' worth of shared
state in one event loop and stops them at the end."""

from __future__ import annotations

import uuid

import pytest

from gateway.config import GatewaySettings
from gateway.limits.redis import SharedLimits
from gateway.redis.state import SharedState

# How long a test's gateway waits for Redis before counting it down (the product's default is 0.5 s). A test
# about a hung Redis sets its own; every other test must not see Redis "down" because this shared machine
# left its event loop unscheduled for half a second (seen: a test of shared tpm read a local 1/N share).
REDIS_TIMEOUT_S = 5.0


def settings(url: str, prefix: str, projects: dict | None = None, **overrides) -> GatewaySettings:
    overrides.setdefault("redis_timeout_s", REDIS_TIMEOUT_S)
    return GatewaySettings(
        providers={"oa": {"kind": "openai", "base_url": "http://127.0.0.1:9"}},
        models={"m": {"provider": "oa", "upstream_model": "m"}},
        projects={name: {"models": ["m"], **cfg} for name, cfg in (projects or {"alpha": {}}).items()},
        redis_url=url,
        redis_key_prefix=prefix,
        **overrides,
    )


@pytest.fixture
async def shared_states(redis_server):
    """``start(projects=None, *, url=None, keys=None, seed_source=None, **settings)
    -> (state, limits)``: one process's shared state and shared limits, started (on the session's Redis
    unless ``url``); every one of a test shares one key prefix, as the processes of one gateway do."""
    started: list[SharedState] = []
    prefix = f"t{uuid.uuid4().hex[:12]}"

    async def start(
        projects: dict | None = None,
        *,
        url: str | None = None,
        keys=None,
        seed_source=None,
        **overrides,
    ) -> tuple[SharedState, SharedLimits]:
        s = settings(url or redis_server.url, prefix, projects, **overrides)
        state = SharedState(s, keys=keys)
        limits = SharedLimits(state, s.projects, seed_source=seed_source)
        started.append(state)
        await state.start()
        return state, limits

    start.prefix = prefix  # type: ignore[attr-defined]
    yield start
    for state in started:
        await state.stop()
