"""The version of the farm store's schema: Alembic migrations in jobs/store/migrations/versions.

The tables in jobs/store/repository.py are what the code reads and writes; the migrations make them
(the first one
creates today's tables and adopts a store made by the releases before migrations: missing tables and
columns added, nothing dropped). ``ensure_schema`` is what every ``Store`` runs when it opens: a store at
the newest revision passes, one without any of the farm's tables is created at once (the zero-setup
SQLite default, or a new PostgreSQL database), and any other (older, unversioned, or newer than this
code) raises ``StoreSchemaError``, one line naming ``farm db upgrade``, which runs ``upgrade_schema``.

Alembic's own table is ``farm_alembic_version``, so a PostgreSQL database shared with the gateway (whose
table is ``gateway_alembic_version``) keeps the two versions apart.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection, Dialect, Engine, make_url

from jobs.errors import StoreError

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
VERSION_TABLE = "farm_alembic_version"
UPGRADE_COMMAND = "farm db upgrade"
_PG_LOCK_KEY = 0x6B66_6172  # pg_advisory_xact_lock key held while migrating ("kfar")


class StoreSchemaError(StoreError, RuntimeError):
    """The store's schema is not the one this code needs; the message (one line) says what to run.
    The CLI exits 4 on it (an infrastructure error: jobs/errors.py)."""


@dataclass(frozen=True)
class SchemaState:
    current: str | None  # the revision the store records (None: not versioned)
    head: str  # the newest revision this code knows
    tables: frozenset[str]  # the farm's tables that exist
    known: bool = True  # whether this code knows ``current``

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def empty(self) -> bool:
        """No farm table and no version: a new store, created without asking."""
        return self.current is None and not self.tables

    def problem(self, url: str) -> str | None:
        """One line saying why this store cannot be used as it is, naming the fix; None when it can."""
        if self.up_to_date:
            return None
        where = display_url(url)
        if self.current is None:
            return (
                f"the farm store {where} has tables from before schema migrations: run "
                f"`{UPGRADE_COMMAND}` (with the same --db) to adopt them, then run this again"
            )
        if not self.known:
            return (
                f"the farm store {where} is at schema revision {self.current}, which this farm does not "
                f"know (it needs {self.head}): a newer release migrated it; run that release"
            )
        return (
            f"the farm store {where} is at schema revision {self.current}, older than the {self.head} "
            f"this farm needs: run `{UPGRADE_COMMAND}` (with the same --db), then run this again"
        )


def display_url(url: str) -> str:
    """The URL without its password."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unparsable URL)"


@lru_cache(maxsize=1)
def _alembic():
    """The Alembic config and script directory of jobs/store/migrations (parsed once per process)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    return cfg, ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    head = _alembic()[1].get_current_head()
    assert head is not None, "jobs/store/migrations has no revisions"
    return head


def migration_options(dialect: Dialect, metadata: MetaData) -> dict[str, Any]:
    """What jobs/store/migrations/env.py and ``upgrade_schema`` configure Alembic with."""
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": dialect.name == "sqlite",  # SQLite alters a table by copying it
        "compare_type": True,
        # only the farm's tables: a PostgreSQL database may hold the gateway's too
        "include_name": lambda name, kind, _parent: kind != "table" or name in metadata.tables,
    }


def _state(conn: Connection, metadata: MetaData) -> SchemaState:
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    present = set(inspect(conn).get_table_names())
    known = True
    if current is not None:
        try:
            known = _alembic()[1].get_revision(current) is not None
        except Exception:  # alembic: "Can't locate revision ..."
            known = False
    return SchemaState(current, head_revision(), frozenset(present & set(metadata.tables)), known)


def schema_state(engine: Engine, metadata: MetaData) -> SchemaState:
    with engine.connect() as conn:
        return _state(conn, metadata)


_MIGRATING = threading.Lock()  # Alembic's `op` and `context` are process globals: one migration at a time


@contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that only one migrating process holds at a time: SQLite's write lock
    (BEGIN IMMEDIATE; the others wait out busy_timeout) or a PostgreSQL advisory lock. The whole
    migration is one transaction (both databases have transactional DDL)."""
    with _MIGRATING, engine.connect() as conn:
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


def _migrate(conn: Connection, metadata: MetaData, target: str) -> None:
    from alembic.runtime.environment import EnvironmentContext

    cfg, script = _alembic()

    def upgrade(rev, _context):
        return script._upgrade_revs(target, rev)

    with EnvironmentContext(cfg, script, fn=upgrade, destination_rev=target) as env:
        env.configure(connection=conn, **migration_options(conn.dialect, metadata))
        with env.begin_transaction():  # the caller's transaction: nothing begun here
            env.run_migrations()


def upgrade_schema(
    engine: Engine, metadata: MetaData, target: str = "head"
) -> tuple[SchemaState, SchemaState]:
    """Run the migrations up to ``target`` (default: the newest), adopting a store from before
    migrations; (state before, state after). Safe to run from several processes at once."""
    with _migration_lock(engine) as conn:
        before = _state(conn, metadata)
        if not before.known:
            raise StoreSchemaError(before.problem(str(engine.url)) or "unknown schema revision")
        if before.current != target and not (target == "head" and before.up_to_date):
            _migrate(conn, metadata, target)
        after = _state(conn, metadata)
    return before, after


def ensure_schema(engine: Engine, metadata: MetaData) -> SchemaState:
    """Check that the store is at the newest revision before it is used. A store without any farm table
    is created here (zero setup); any other out-of-date one raises StoreSchemaError, one line naming
    ``farm db upgrade``."""
    state = schema_state(engine, metadata)
    if state.up_to_date:
        return state
    if state.empty:
        _, state = upgrade_schema(engine, metadata)  # re-checked under the lock: another may be first
        if state.up_to_date:
            return state
    raise StoreSchemaError(state.problem(str(engine.url)) or "farm store schema out of date")
