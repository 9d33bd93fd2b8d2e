"""Alembic's environment for the farm store's migrations.

``farm db upgrade`` (jobs.store.schema.upgrade_schema) runs the migrations in-process with the same
options (migration_options) and does not read this file. It is here for Alembic's own commands, e.g.
writing the next revision from the tables in jobs/store/tables/ against a store at head:

    .venv/bin/alembic -c jobs/store/migrations/alembic.ini -x url=sqlite:///.farm/farm.db \
        revision --autogenerate -m "what changed"

Without ``-x url=...`` the farm's settings name the store (FARM_DB, default .farm/farm.db). A new
revision must leave a store made by the older ones equal to the tables in jobs/store/tables/
(tests/jobs/test_store_migrations.py compares them).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from jobs.store.engine import make_engine
from jobs.store.schema import migration_options
from jobs.store.tables import Base


def _run(conn: Connection) -> None:
    context.configure(connection=conn, **migration_options(conn.dialect, Base.metadata))
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        from jobs.settings import FarmSettings

        url = FarmSettings().db
    return url


if context.is_offline_mode():
    raise SystemExit("the farm store's migrations run against a database (no --sql mode)")
connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = make_engine(_url(), check_schema=False)
    try:
        with engine.begin() as conn:
            _run(conn)
    finally:
        engine.dispose()
