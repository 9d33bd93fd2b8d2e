"""Alembic's environment for the gateway's migrations.

``farm gateway db upgrade`` (gateway.store.db.upgrade_schema) runs the migrations in-process with the same
options (gateway.store.db.migration_options) and does not read this file. It is here for Alembic's own
commands, e.g. writing the next revision from the tables in gateway/store/db.py against a database at head:

    .venv/bin/alembic -c gateway/store/migrations/alembic.ini -x url=sqlite+aiosqlite:///.farm/gateway.db \
        revision --autogenerate -m "what changed"

Without ``-x url=...`` the gateway's own settings name the database (FARM_GATEWAY_DATABASE_URL, or the
file FARM_GATEWAY_CONFIG names). A new revision must leave a database made by the older ones equal to the
tables in gateway/store/db.py (tests/gateway/store/test_db_migrations.py compares them).
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from gateway.store.db import create_engine, migration_options


def _run(conn: Connection) -> None:
    context.configure(connection=conn, **migration_options(conn.dialect))
    with context.begin_transaction():
        context.run_migrations()


async def _online(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        from gateway.config import load_settings

        url = load_settings(None).database_url  # FARM_GATEWAY_DATABASE_URL / FARM_GATEWAY_CONFIG
    return url


if context.is_offline_mode():
    raise SystemExit("the gateway's migrations run against a database (no --sql mode)")
connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    asyncio.run(_online(_url()))
