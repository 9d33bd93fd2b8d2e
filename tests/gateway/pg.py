"""The gateway's databases on the session's one PostgreSQL server (tests/pgserver.py, started by the
``postgres`` fixture of tests/conftest.py and shared with the farm's store tests). A template database is
migrated to the gateway's newest schema once; each test gets a fresh copy of it (CREATE DATABASE ...
TEMPLATE: milliseconds). Where no server can be started, the tests that need one skip with the reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from pgserver import PgServer, Unavailable

DB_BACKENDS = ["sqlite", "postgresql"]  # params for a test module's own ``db_backend`` fixture
# a test of such a module that needs SQLite (a file next to the database, sqlite3 itself)
SQLITE_ONLY = pytest.mark.parametrize("db_backend", ["sqlite"])
TEMPLATE = "gw_template"

__all__ = ["DB_BACKENDS", "SQLITE_ONLY", "TEMPLATE", "GatewayPg", "Unavailable", "gateway_pg"]


def _run_sync(coro):
    """Run a coroutine to completion from sync code, whether or not an event loop runs in this thread."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


class GatewayPg:
    """The gateway's view of the shared server: asyncpg URLs, databases copied from its template."""

    def __init__(self, server: PgServer) -> None:
        self.server = server

    def url(self, database: str) -> str:
        """The gateway's URL (SQLAlchemy, asyncpg) of one of the server's databases."""
        return self.server.url(database, driver="asyncpg")

    async def create_database(self, template: str | None = TEMPLATE) -> str:
        """A new database, a copy of ``template`` (default: the one at the newest schema; None: an empty
        one); returns its URL."""
        return self.url(self.server.create_database("gw", template))

    async def _make_template(self) -> None:
        import psycopg

        from gateway.store.db import create_engine, upgrade_schema

        with psycopg.connect(self.server.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        engine = create_engine(self.url(TEMPLATE))
        try:
            await upgrade_schema(engine)
        finally:
            await engine.dispose()  # a template must have no connections when it is copied


def gateway_pg(server: PgServer) -> GatewayPg:
    """The gateway's template database on ``server``; Unavailable says why it cannot be made."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        raise Unavailable("asyncpg is not installed (`.venv/bin/pip install asyncpg`)") from None
    gw = GatewayPg(server)
    try:
        _run_sync(gw._make_template())
    except Exception as e:
        raise Unavailable(f"PostgreSQL server started but not usable: {e.__class__.__name__}: {e}") from e
    return gw
