"""Tables for keys and the token ledger, the async engine factory (SQLite by default, PostgreSQL through
asyncpg), and the schema's version: Alembic migrations in ``gateway/store/migrations``.

The tables below are what the code reads and writes; the migrations make them (the first one creates
today's tables, and adopts a database made by the releases before migrations: missing tables and columns
added, then versioned). ``ensure_schema`` is what every start and command runs: a database at the newest
revision passes, one without any of the gateway's tables is created at once (the zero-setup SQLite default,
or a new PostgreSQL database), and any other (older, unversioned, or newer than this code) is refused with
one line naming ``farm gateway db upgrade``, which runs ``upgrade_schema``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    event,
    inspect,
    text,
)
from sqlalchemy.engine import Connection, Dialect, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from gateway.config import ConfigError

metadata = MetaData()

api_keys = Table(
    "gateway_api_keys",
    metadata,
    Column("id", String(32), primary_key=True),  # public key id, part of the key string
    Column("project", String(128), nullable=False, index=True),
    Column("name", String(128), nullable=False, default=""),
    Column("key_hash", String(64), nullable=False),  # hex HMAC-SHA256(server secret, key)
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Column("rotated_to", String(32), nullable=True),
)

# Small facts about the store itself, e.g. "secret_fingerprint" (gateway.store.secret): name -> value.
meta = Table(
    "gateway_meta",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", String(256), nullable=False),
)

ledger = Table(
    "gateway_ledger",
    metadata,
    Column("request_id", String(64), primary_key=True),
    Column("ts", DateTime(timezone=True), nullable=False, index=True),
    Column("endpoint", String(32), nullable=False),
    Column("upstream_request_id", String(128), nullable=True),
    Column("project", String(128), nullable=True, index=True),
    Column("key_id", String(32), nullable=True),
    Column("public_model", String(128), nullable=True),
    Column("upstream_model", String(128), nullable=True),
    Column("provider", String(64), nullable=True),
    Column("task", String(128), nullable=True),
    Column("session_id", String(128), nullable=True),
    Column("stream", Boolean, nullable=False, default=False),
    Column("status", String(16), nullable=False),  # ok | error | rejected | cancelled
    Column("http_status", Integer, nullable=True),
    Column("error_class", String(64), nullable=True),
    Column("retries", Integer, nullable=False, default=0),
    Column("input_tokens", Integer, nullable=False, default=0),
    Column("output_tokens", Integer, nullable=False, default=0),
    Column("tokens_estimated", Boolean, nullable=False, default=False),
    Column("latency_ms", Float, nullable=False),
    Column("upstream_ms", Float, nullable=True),
    Column("ttft_ms", Float, nullable=True),
    Column("queue_wait_ms", Float, nullable=False, default=0.0),
    # summaries endpoint: anomalies sent in this model call (None for the proxied endpoints)
    Column("batch_size", Integer, nullable=True),
    # routing and cost (revision 0002): the deployment that answered, the public model asked for when a
    # fallback answered, the wire-format translation ("messages->chat"), the cost from the price table
    Column("deployment", String(128), nullable=True),
    Column("fallback_from", String(128), nullable=True),
    Column("translation", String(32), nullable=True),
    Column("cost_usd", Float, nullable=True),
    # parts of input_tokens (revision 0002): cache reads (OpenAI's cached tokens, Anthropic's
    # cache_read_input_tokens) and Anthropic's cache writes (cache_creation_input_tokens)
    Column("cached_input_tokens", Integer, nullable=True),
    Column("cache_write_tokens", Integer, nullable=True),
)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Alembic's own table, prefixed like the others: a PostgreSQL database may be shared with other programs.
VERSION_TABLE = "gateway_alembic_version"
UPGRADE_COMMAND = "farm gateway db upgrade"
_PG_LOCK_KEY = 0x6B66_6777  # pg_advisory_xact_lock key held while migrating ("kfgw")


def create_engine(url: str) -> AsyncEngine:
    """An async engine; for SQLite the parent folder is created and WAL mode is switched on; a PostgreSQL
    session (asyncpg) runs in UTC, so dates (``farm gateway usage``) are UTC days as the budgets are."""
    u = make_url(url)
    kwargs: dict[str, Any] = {}
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    if u.get_backend_name() == "postgresql" and u.get_driver_name() == "asyncpg":
        kwargs["connect_args"] = {
            "server_settings": {"timezone": "UTC", "application_name": "kernelfarm-gateway"}
        }
    engine = create_async_engine(url, **kwargs)
    if u.get_backend_name() == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn, _record):  # pragma: no cover
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=5000")
            try:
                cur.execute("PRAGMA journal_mode=WAL")  # kept by the file: set by its first connection
            except Exception as e:  # a new file that another connection is writing (first starts at once):
                if "locked" not in str(e):  # SQLite does not wait here; that or a later one switches it
                    raise
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

    return engine


# --- the schema's version ----------------------------------------------------------------------------------
class SchemaError(ConfigError):
    """The database's schema is not the one this code needs; the message says what to run."""


@dataclass(frozen=True)
class SchemaState:
    current: str | None  # the revision the database records (None: not versioned)
    head: str  # the newest revision this code knows
    tables: frozenset[str]  # the gateway's tables that exist
    known: bool = True  # whether this code knows ``current``

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def empty(self) -> bool:
        """No gateway table and no version: a new database, created without asking."""
        return self.current is None and not self.tables

    def problem(self, url: str) -> str | None:
        """One line saying why this database cannot be used as it is, naming the fix; None when it can."""
        if self.up_to_date:
            return None
        where = display_url(url)
        if self.current is None:
            return (
                f"the gateway database {where} has tables from before schema migrations: run "
                f"`{UPGRADE_COMMAND}` (with the same --config) to adopt them, then start again"
            )
        if not self.known:
            return (
                f"the gateway database {where} is at schema revision {self.current}, which this gateway "
                f"does not know (it needs {self.head}): a newer release migrated it; run that release"
            )
        return (
            f"the gateway database {where} is at schema revision {self.current}, older than the {self.head} "
            f"this gateway needs: run `{UPGRADE_COMMAND}` (with the same --config), then start again"
        )


def display_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "(unparsable URL)"


@lru_cache(maxsize=1)
def _alembic():
    """The Alembic config and script directory of gateway/store/migrations (parsed once per process)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    return cfg, ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    head = _alembic()[1].get_current_head()
    assert head is not None, "gateway/store/migrations has no revisions"
    return head


def migration_options(dialect: Dialect) -> dict[str, Any]:
    """What gateway/store/migrations/env.py and ``upgrade_schema`` configure Alembic with."""
    return {
        "target_metadata": metadata,
        "version_table": VERSION_TABLE,
        "render_as_batch": dialect.name == "sqlite",  # SQLite alters a table by copying it
        "compare_type": True,
    }


def _state(conn: Connection) -> SchemaState:
    from alembic.runtime.migration import MigrationContext

    current = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
    present = set(inspect(conn).get_table_names())
    script = _alembic()[1]
    known = True
    if current is not None:
        try:
            known = script.get_revision(current) is not None
        except Exception:  # alembic: "Can't locate revision ..."
            known = False
    return SchemaState(current, head_revision(), frozenset(present & set(metadata.tables)), known)


async def schema_state(engine: AsyncEngine) -> SchemaState:
    async with engine.connect() as conn:
        return await conn.run_sync(_state)


_MIGRATING = threading.Lock()  # Alembic's `op` and `context` are process globals: one migration at a time


@asynccontextmanager
async def _migration_lock(engine: AsyncEngine) -> AsyncIterator[AsyncConnection]:
    """A connection in a transaction that only one migrating process holds at a time: SQLite's write lock
    (BEGIN IMMEDIATE; the others wait out busy_timeout) or a PostgreSQL advisory lock. The whole
    migration is one transaction (both databases have transactional DDL)."""
    while not _MIGRATING.acquire(blocking=False):  # cancellable, and never blocks the event loop
        await asyncio.sleep(0.01)
    try:
        async with engine.connect() as conn:
            backend = conn.dialect.name
            if backend == "sqlite":
                await conn.exec_driver_sql("BEGIN IMMEDIATE")
            elif backend == "postgresql":
                await conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
            try:
                yield conn
            except BaseException:
                await conn.rollback()
                raise
            await conn.commit()
    finally:
        _MIGRATING.release()


def _migrate(conn: Connection, target: str) -> None:
    from alembic.runtime.environment import EnvironmentContext

    cfg, script = _alembic()

    def upgrade(rev, _context):
        return script._upgrade_revs(target, rev)

    with EnvironmentContext(cfg, script, fn=upgrade, destination_rev=target) as env:
        env.configure(connection=conn, **migration_options(conn.dialect))
        with env.begin_transaction():  # the caller's transaction: nothing begun here
            env.run_migrations()


async def upgrade_schema(engine: AsyncEngine, target: str = "head") -> tuple[SchemaState, SchemaState]:
    """Run the migrations up to ``target`` (default: the newest), adopting a database from before
    migrations; (state before, state after). Safe to run from several processes at once."""
    async with _migration_lock(engine) as conn:
        before = await conn.run_sync(_state)
        if not before.known:
            raise SchemaError(before.problem(str(engine.url)) or "unknown schema revision")
        if before.current != target and not (target == "head" and before.up_to_date):
            await conn.run_sync(_migrate, target)
        after = await conn.run_sync(_state)
    return before, after


async def ensure_schema(engine: AsyncEngine) -> SchemaState:
    """Check that the database is at the newest revision before a start or a command. A database without
    any gateway table is created here (zero setup); any other out-of-date one raises SchemaError, one
    line naming ``farm gateway db upgrade``."""
    state = await schema_state(engine)
    if state.up_to_date:
        return state
    # Read again under the migration lock: another first start may be creating the schema right now, and
    # two catalog reads outside the lock (each its own snapshot on PostgreSQL) can see its tables without
    # its version table, which looked like a database from before migrations.
    async with _migration_lock(engine) as conn:
        state = await conn.run_sync(_state)
    if state.up_to_date:
        return state
    if state.empty:
        _, state = await upgrade_schema(engine)  # re-checked under the lock: another process may be first
        if state.up_to_date:
            return state
    raise SchemaError(state.problem(str(engine.url)) or "gateway database schema out of date")


async def create_tables(engine: AsyncEngine) -> None:
    """Bring the schema up to date (``upgrade_schema``); for tests and tools that make a database."""
    await upgrade_schema(engine)
