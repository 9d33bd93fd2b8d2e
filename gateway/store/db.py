"""Tables for keys and the token ledger, the async engine factory (SQLite by default, PostgreSQL through
asyncpg), and the schema's version: Alembic migrations in ``gateway/store/migrations``.

The tables below are what the code reads and writes; the migrations make them (the first one creates
today's tables, and adopts a database made by the releases before migrations: missing tables and columns
added, then versioned). ``ensure_schema`` is what every start and command runs: a database at the newest
revision passes, one without any of the gateway's tables is created at once (the zero-setup SQLite default,
or a new PostgreSQL database), and any other (older, unversioned, or newer than this code) is refused with
one line naming ``farm gateway db upgrade``, which runs ``upgrade_schema``.

The logic (the state, the migration lock, upgrade, ensure) is schemakit's, shared with the farm's store;
this module passes it the gateway's tables, migrations folder, version table, lock key and words.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    event,
)
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import schemakit
from gateway.config import ConfigError, StartupError, UnavailableError
from schemakit import display_url as display_url  # the URL without its password (gateway.ops.cli)

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
    # not indexed since revision 0005: no read needs it (today's usage reads by ts, request ids by the key)
    Column("project", String(128), nullable=True),
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
    # (revision 0003) True: admitted on the process's own share of the limits while Redis was unreachable;
    # the usage reaches the shared counters through that process, or through a rebuild from the ledger that
    # lists these rows' ids (gateway.limits.redis). NULL otherwise (most rows: left out of the INSERT)
    Column("shared_pending", Boolean, nullable=True),
    # (revision 0003) the request fields translation left out, comma-separated: fields the gateway does not
    # know and server tools without an equivalent (gateway.translate.policy); NULL when none
    Column("dropped_fields", String(256), nullable=True),
    # (revision 0004) the upstream 429 answers the request met (retried, or the last one it ended on), the
    # time waited between its upstream attempts (backoff, Retry-After), and the output cap it asked for
    # (max_tokens; NULL: none). NULL on the rows written before this revision
    Column("rate_limited", Integer, nullable=True),
    Column("retry_wait_ms", Float, nullable=True),
    Column("max_tokens", Integer, nullable=True),
)

# (revision 0005) The ledger summed per UTC day and group, kept by the ledger writer in the transaction that
# writes the rows (gateway.store.ledger_daily), so that `farm gateway usage` reads a row per day and group
# instead of every request: a group is a project, task, key, public model and agent session ('' where the
# row has none). cost_usd: NULL while no row of the group had a price.
usage_daily = Table(
    "gateway_usage_daily",
    metadata,
    Column("day", Date, primary_key=True),
    Column("project", String(128), primary_key=True),
    Column("task", String(128), primary_key=True),
    Column("key_id", String(32), primary_key=True),
    Column("public_model", String(128), primary_key=True),
    Column("session_id", String(128), primary_key=True),
    Column("requests", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_usd", Float, nullable=True),
    Column("retries", Integer, nullable=False),
    Column("rate_limited", Integer, nullable=False),
    Column("retry_wait_ms", Float, nullable=False),
    Column("ok", Integer, nullable=False),
    Column("error", Integer, nullable=False),
    Column("rejected", Integer, nullable=False),
    Column("cancelled", Integer, nullable=False),
    Index("ix_gateway_usage_daily_task_day", "task", "day"),
    Index("ix_gateway_usage_daily_session_id_day", "session_id", "day"),
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


# --- the schema's version (schemakit: the logic the farm's store shares) ----------------------------------
class SchemaError(UnavailableError):
    """The database's schema is not the one this code needs; the message says what to run."""


class SchemaState(schemakit.SchemaState):
    """The database's schema as read (schemakit.SchemaState), in the gateway's words."""

    wording = schemakit.Wording(
        subject="the gateway database",
        program="this gateway",
        command=UPGRADE_COMMAND,
        same_option="--config",
        retry="start again",
    )


MIGRATIONS = schemakit.Migrations(
    metadata,
    MIGRATIONS_DIR,
    version_table=VERSION_TABLE,
    lock_key=_PG_LOCK_KEY,
    error=SchemaError,
    state_type=SchemaState,
)


def head_revision() -> str:
    """The newest revision in gateway/store/migrations."""
    return MIGRATIONS.head()


def migration_options(dialect: Dialect) -> dict[str, Any]:
    """What gateway/store/migrations/env.py and ``upgrade_schema`` configure Alembic with."""
    return MIGRATIONS.options(dialect)


async def schema_state(engine: AsyncEngine) -> SchemaState:
    return await MIGRATIONS.state_async(engine)


async def upgrade_schema(engine: AsyncEngine, target: str = "head") -> tuple[SchemaState, SchemaState]:
    """Run the migrations up to ``target`` (default: the newest), adopting a database from before
    migrations; (state before, state after). Safe to run from several processes at once."""
    return await MIGRATIONS.upgrade_async(engine, target)


async def ensure_schema(engine: AsyncEngine) -> SchemaState:
    """Check that the database is at the newest revision before a start or a command. A database without
    any gateway table is created here (zero setup); any other out-of-date one raises SchemaError, one
    line naming ``farm gateway db upgrade``. Another first start creating the tables right now is waited
    for (schemakit reads the state again under the migration lock)."""
    return await MIGRATIONS.ensure_async(engine)


# SQLSTATEs of a connection the server refused (asyncpg and psycopg carry them as ``sqlstate``)
_NO_SUCH_DATABASE = "3D000"
_BAD_CREDENTIALS = ("28000", "28P01")


def database_problem(e: BaseException, url: str) -> StartupError | None:
    """What a failure to open the database at ``url`` means for whoever configured it, in one line naming
    ``database_url`` and the fix; None for an error that is not about reaching the database."""
    where = display_url(url)
    u = make_url(url)
    seen: list[BaseException] = []
    cause: BaseException | None = e
    while cause is not None and cause not in seen:  # the driver's error, under SQLAlchemy's wrapping
        seen.append(cause)
        cause = getattr(cause, "orig", None) or cause.__cause__
    for err in seen:
        state = getattr(err, "sqlstate", None)
        if state == _NO_SUCH_DATABASE:
            return UnavailableError(
                f"database {u.database!r} does not exist on {u.host or 'localhost'}:{u.port or 5432} "
                f"(database_url {where}): create it (createdb {u.database}) or fix database_url"
            )
        if state in _BAD_CREDENTIALS:
            return ConfigError(
                f"the database refused the credentials of database_url {where} (user {u.username!r}): "
                f"{first_line(err)}; fix the user or password in database_url"
            )
        if isinstance(err, ModuleNotFoundError):
            return ConfigError(
                f"database_url {where}: its driver needs the Python package {err.name!r}, which is not "
                f"installed (pip install {err.name}), or use another driver"
            )
        if isinstance(err, (OSError, ConnectionError)):
            if u.get_backend_name() == "sqlite":
                return UnavailableError(
                    f"cannot open the SQLite database {u.database} (database_url): {first_line(err)}; "
                    "check that its folder exists and is writable, or fix database_url"
                )
            return UnavailableError(
                f"cannot connect to the database at {u.host or 'localhost'}:{u.port or 5432} "
                f"(database_url {where}): {first_line(err)}; start it, or fix database_url"
            )
        if u.get_backend_name() == "sqlite" and "unable to open database file" in str(err):
            return UnavailableError(
                f"cannot open the SQLite database {u.database} (database_url): check that its folder "
                "exists and is writable, or fix database_url"
            )
    if isinstance(e, (OperationalError, InterfaceError)):  # any other driver's "cannot reach the server"
        what = getattr(e, "orig", None) or e
        return UnavailableError(
            f"cannot use the database at database_url {where}: {first_line(what)}; start it, or fix "
            "database_url"
        )
    return None


_T = TypeVar("_T")
_abandoned: set[asyncio.Task[Any]] = set()  # work past its deadline, cleaning up in the background


async def within_deadline(timeout_s: float, work: Callable[[], Awaitable[_T]]) -> _T:
    """``work()``'s answer, or TimeoutError once ``timeout_s`` has passed without one: the deadline is the
    caller's, cleanup included. ``work`` runs as a task of its own that is cancelled at the deadline and
    not waited for: SQLAlchemy closes a connection cancelled mid-statement gracefully, which on a hung
    server waits 2 s more (asyncpg's close timeout), so ``asyncio.timeout`` around the statement alone
    would answer at the deadline plus 2 s. A caller cancelled itself cancels the work too."""
    task = asyncio.ensure_future(work())
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.shield(task)
    except BaseException:
        if not task.done():
            task.cancel()
            _abandoned.add(task)  # held until it ends; its error (the cancellation) is read, not logged
            task.add_done_callback(_forget)
        raise


def _forget(task: asyncio.Task[Any]) -> None:
    _abandoned.discard(task)
    if not task.cancelled():
        task.exception()


async def ensure_ready(engine: AsyncEngine, url: str, deadline_s: float) -> SchemaState:
    """``ensure_schema`` within ``deadline_s``, for a start or a command: a database that cannot be
    reached, does not exist, refuses the credentials or does not answer in time raises a StartupError of
    one line (``database_problem``), as an out-of-date schema raises SchemaError."""
    try:
        async with asyncio.timeout(deadline_s):
            return await ensure_schema(engine)
    except StartupError:
        raise
    except TimeoutError:
        raise UnavailableError(
            f"the database at database_url {display_url(url)} did not answer within {deadline_s:g} s "
            "(a hung or overloaded server?); check it, or fix database_url"
        ) from None
    except Exception as e:
        problem = database_problem(e, url)
        if problem is None:
            raise
        raise problem from e


def first_line(e: BaseException) -> str:
    """An error's first line of text, or its class name when it has none (one-line messages)."""
    lines = str(e).strip().splitlines()
    return lines[0] if lines else type(e).__name__


async def create_tables(engine: AsyncEngine) -> None:
    """Bring the schema up to date (``upgrade_schema``); for tests and tools that make a database."""
    await upgrade_schema(engine)
