"""Fixtures: a real fake upstream on 127.0.0.1, and gateways built from settings on port 0.

A gateway's database is a fresh SQLite file, or, in a test module that overrides ``db_backend`` with
``pg.DB_BACKENDS`` as params (e.g. test_sdk_endpoints.py), also a fresh database on the session's
PostgreSQL server (tests/gateway/pg.py on tests/pgserver.py; where none can be started, tests/services.py
fails them in CI and skips them elsewhere)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anthropic
import openai
import pytest
import services
from aiohttp import web
from sqlalchemy import select

from gateway.config import GatewaySettings
from gateway.http.app import create_app
from gateway.http.server import GatewayRunner
from gateway.store.db import create_engine, ledger, upgrade_schema
from testkit.gateway.fake_upstream import FakeUpstream
from tests.gateway.serving import ServedGateway
from tests.gateway.shared_redis import REDIS_TIMEOUT_S

SECRET = "test-secret-0123456789"


class FakeClock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def make_settings(fake: FakeUpstream, db_path: Path, **overrides) -> GatewaySettings:
    projects = {
        "alpha": {
            "models": ["gpt-fake", "claude-fake"],
            "max_concurrency": 8,
            "queue_timeout_s": 5,
            "default_task": "alpha-default",
            "tasks": ["checklist"],
        },
        "beta": {"models": ["gpt-beta"], "max_concurrency": 8, "default_task": "beta-default"},
    }
    for name, extra in overrides.pop("projects", {}).items():
        projects[name] = {**projects[name], **extra}
    providers = {
        "oa": {"kind": "openai", "base_url": fake.base_url, "read_timeout_s": 5, "connect_timeout_s": 2},
        "an": {"kind": "anthropic", "base_url": fake.base_url, "read_timeout_s": 5, "connect_timeout_s": 2},
    }
    for name, extra in overrides.pop("providers", {}).items():
        providers[name] = {**providers.get(name, {}), **extra}
    data = {
        "host": "127.0.0.1",
        "port": 0,
        "database_url": f"sqlite+aiosqlite:///{db_path}",
        "secret": SECRET,
        "providers": providers,
        "models": {
            "gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"},
            "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
            "claude-fake": {"provider": "an", "upstream_model": "claude-upstream"},
        },
        "projects": projects,
        "retry": {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "jitter_s": 0.0, "max_total_wait_s": 5},
        "ledger_flush_interval_s": 0.05,
        "key_cache_ttl_s": 0,
        "redis_timeout_s": REDIS_TIMEOUT_S,
        # the product's 1 s deadline for a key lookup (a hung database) fired at load 11 on this shared
        # machine (a 503 in a test of retries); a test about a hung database sets its own
        "key_lookup_timeout_s": 10,
    }
    data.update(overrides)
    return GatewaySettings(**data)


@dataclass(kw_only=True)
class RunningGateway(ServedGateway):
    db_path: Path
    clock: FakeClock

    @property
    def v1(self) -> str:
        return f"{self.url}/v1"

    async def rows(self, flush: bool = True) -> list[dict]:
        """Flush the writer (unless not ``flush``), then read the ledger back, oldest first, through an
        engine of its own (as another process would; it works after ``stop`` too)."""
        if flush:
            await self.gw.ledger.flush()
        engine = create_engine(self.gw.settings.database_url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(select(ledger).order_by(ledger.c.ts))
                return [dict(r._mapping) for r in result]
        finally:
            await engine.dispose()

    async def stop(self) -> None:
        await self.runner.cleanup()


@pytest.fixture
async def fake():
    f = FakeUpstream()
    await f.start()
    yield f
    await f.close()


@pytest.fixture(scope="session")
def pg_server(postgres):
    """The gateway's databases on the session's PostgreSQL server (tests/conftest.py ``postgres``, shared
    with the farm's tests; tests/gateway/pg.py); missing: tests/services.py decides."""
    from pg import Unavailable, gateway_pg

    try:
        return gateway_pg(postgres)
    except Unavailable as e:
        services.missing("postgresql", str(e))


@pytest.fixture
def db_backend() -> str:
    """Where ``start_gateway`` keeps keys and the ledger; a module overrides it to run on both."""
    return "sqlite"


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> Path:
    """An SQLite database migrated to the gateway's newest schema once; tests start from copies of it
    (as tests/gateway/pg.py copies its template database on PostgreSQL)."""
    import asyncio

    path = tmp_path_factory.mktemp("gw-template") / "gw.db"

    async def migrate() -> None:
        engine = create_engine(f"sqlite+aiosqlite:///{path}")
        try:
            await upgrade_schema(engine)
        finally:
            await engine.dispose()

    asyncio.run(migrate())
    assert not Path(f"{path}-wal").exists(), "the template's WAL was not folded back into the file"
    return path


@pytest.fixture
async def db_url(db_backend, tmp_path, request, sqlite_template) -> str:
    """A fresh database at the newest schema on ``db_backend`` (SQLite: ``tmp_path / "l.db"``)."""
    if db_backend == "postgresql":
        return await request.getfixturevalue("pg_server").create_database()
    shutil.copyfile(sqlite_template, tmp_path / "l.db")
    return f"sqlite+aiosqlite:///{tmp_path / 'l.db'}"


@pytest.fixture
async def start_gateway(fake, tmp_path, db_backend, request, sqlite_template):
    started: list[RunningGateway] = []
    pg = request.getfixturevalue("pg_server") if db_backend == "postgresql" else None

    async def start(**overrides) -> RunningGateway:
        n = len(started)
        if pg is not None and "database_url" not in overrides:
            overrides["database_url"] = await pg.create_database()  # a fresh one, at the newest schema
        if not overrides.get("database_url", "sqlite").startswith("sqlite"):
            overrides.setdefault("ledger_spool_dir", str(tmp_path / f"gw{n}-spool"))  # as beside a file
        elif "database_url" not in overrides:  # its own file: a copy of the migrated template
            shutil.copyfile(sqlite_template, tmp_path / f"gw{n}.db")
        settings = make_settings(fake, tmp_path / f"gw{n}.db", **overrides)
        clock = FakeClock()
        app = create_app(settings, clock=clock)
        runner = GatewayRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        rg = RunningGateway(
            app, runner, runner.addresses[0][1], db_path=tmp_path / f"gw{len(started)}.db", clock=clock
        )
        for project in ("alpha", "beta"):
            key, _ = await rg.gw.keys.create(project, "test")
            rg.keys[project] = key
        started.append(rg)
        return rg

    yield start
    fake.release.set()
    for rg in started:
        await rg.stop()


@pytest.fixture
async def gateway(start_gateway) -> RunningGateway:
    return await start_gateway()


def _strip_authorization(request) -> None:
    request.headers.pop("Authorization", None)


@pytest.fixture
async def oai():
    """``oai(gw, project="alpha", header="bearer"|"x-api-key")``: an openai SDK client (no SDK retries)."""
    clients: list[openai.AsyncOpenAI] = []

    def make(gw: RunningGateway, project: str = "alpha", header: str = "bearer", **kw) -> openai.AsyncOpenAI:
        key = gw.keys[project] if project in gw.keys else project
        if header == "bearer":
            client = openai.AsyncOpenAI(base_url=gw.v1, api_key=key, max_retries=0, **kw)
        else:  # the SDK always sends a Bearer header; strip it so only x-api-key carries the key
            http = openai.DefaultAsyncHttpxClient(event_hooks={"request": [_async(_strip_authorization)]})
            client = openai.AsyncOpenAI(
                base_url=gw.v1,
                api_key="placeholder",
                max_retries=0,
                default_headers={"x-api-key": key},
                http_client=http,
                **kw,
            )
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


@pytest.fixture
async def anth():
    """``anth(gw, project="alpha", header="x-api-key"|"bearer")``: an anthropic SDK client, no SDK retries."""
    clients: list[anthropic.AsyncAnthropic] = []

    def make(
        gw: RunningGateway, project: str = "alpha", header: str = "x-api-key", **kw
    ) -> anthropic.AsyncAnthropic:
        key = gw.keys[project] if project in gw.keys else project
        if header == "x-api-key":
            client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0, **kw)
        else:
            client = anthropic.AsyncAnthropic(base_url=gw.url, auth_token=key, max_retries=0, **kw)
        clients.append(client)
        return client

    yield make
    for c in clients:
        await c.close()


def _async(fn):
    async def hook(request):
        fn(request)

    return hook


@pytest.fixture(scope="session")
def settings_factory():
    """``make_settings`` for fixtures that build a gateway themselves (e.g. in a thread of their own)."""
    return make_settings


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """One redis-server for the session (tests/gateway/redis_server.py); missing: tests/services.py decides.
    Tests keep apart by ``redis_key_prefix``; a test that stops Redis starts its own (``start_server``)."""
    from redis_server import Unavailable, start_server

    try:
        server = start_server(tmp_path_factory.mktemp("redis"))
    except Unavailable as e:
        services.missing("redis", str(e))
    yield server
    server.stop()
