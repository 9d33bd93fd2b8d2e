"""The version of the farm store's schema: Alembic migrations in jobs/store/migrations/versions.

The tables in jobs/store/tables/ are what the code reads and writes; the migrations make them
(the first one
creates today's tables and adopts a store made by the releases before migrations: missing tables and
columns added, nothing dropped). ``ensure_schema`` is what every ``Store`` runs when it opens: a store at
the newest revision passes, one without any of the farm's tables is created at once (the zero-setup
SQLite default, or a new PostgreSQL database), and any other (older, unversioned, or newer than this
code) raises ``StoreSchemaError``, one line naming ``farm db upgrade``, which runs ``upgrade_schema``.

The logic (the state, the migration lock, upgrade, ensure) is schemakit's, shared with the gateway's
database; this module passes it the farm's tables, migrations folder, version table, lock key and words.

Alembic's own table is ``farm_alembic_version``, so a PostgreSQL database shared with the gateway (whose
table is ``gateway_alembic_version``) keeps the two versions apart.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData
from sqlalchemy.engine import Dialect, Engine

import schemakit
from jobs.errors import StoreError
from schemakit import display_url as display_url  # the store as given, less its password (jobs.errors, CLI)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "farm_alembic_version"
UPGRADE_COMMAND = "farm db upgrade"
_PG_LOCK_KEY = 0x6B66_6172  # pg_advisory_xact_lock key held while migrating ("kfar")


class StoreSchemaError(StoreError, RuntimeError):
    """The store's schema is not the one this code needs; the message (one line) says what to run.
    The CLI exits 4 on it (an infrastructure error: jobs/errors.py)."""


class SchemaState(schemakit.SchemaState):
    """The store's schema as read (schemakit.SchemaState), in the farm's words."""

    wording = schemakit.Wording(
        subject="the farm store",
        program="this farm",
        command=UPGRADE_COMMAND,
        same_option="--db",
        retry="run this again",
    )


@cache
def migrations(metadata: MetaData) -> schemakit.Migrations[SchemaState]:
    """The farm's schemakit.Migrations for its tables (``Base.metadata`` of jobs.store.tables, passed in
    so that this module stays below the tables and the engine that checks them)."""
    return schemakit.Migrations(
        metadata,
        MIGRATIONS_DIR,
        version_table=VERSION_TABLE,
        lock_key=_PG_LOCK_KEY,
        error=StoreSchemaError,
        state_type=SchemaState,
    )


def head_revision() -> str:
    """The newest revision in jobs/store/migrations."""
    return schemakit.head_revision(MIGRATIONS_DIR)


def migration_options(dialect: Dialect, metadata: MetaData) -> dict[str, Any]:
    """What jobs/store/migrations/env.py and ``upgrade_schema`` configure Alembic with."""
    return migrations(metadata).options(dialect)


def schema_state(engine: Engine, metadata: MetaData) -> SchemaState:
    return migrations(metadata).state(engine)


def upgrade_schema(
    engine: Engine, metadata: MetaData, target: str = "head", *, url: str | None = None
) -> tuple[SchemaState, SchemaState]:
    """Run the migrations up to ``target`` (default: the newest), adopting a store from before
    migrations; (state before, state after). Safe to run from several processes at once. ``url``: the
    store as the user gave it (a path or a URL), which messages name."""
    return migrations(metadata).upgrade(engine, target, url=url)


def ensure_schema(engine: Engine, metadata: MetaData, *, url: str | None = None) -> SchemaState:
    """Check that the store is at the newest revision before it is used. A store without any farm table
    is created here (zero setup); any other out-of-date one raises StoreSchemaError, one line naming
    ``farm db upgrade``. Another first start creating the tables right now is waited for (schemakit reads
    the state again under the migration lock). ``url``: the store as the user gave it, for messages."""
    return migrations(metadata).ensure(engine, url=url)
