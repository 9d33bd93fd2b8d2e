"""Tables for keys and the token ledger, and the async engine factory (SQLite by default)."""

from __future__ import annotations

from pathlib import Path

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
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

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

# Small facts about the store itself, e.g. "secret_fingerprint" (gateway.secret): name -> value.
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
)

# Columns added after the first release: (table, column, SQL type); added to an existing table at start.
_ADDED_COLUMNS = (("gateway_ledger", "batch_size", "INTEGER"),)


def create_engine(url: str) -> AsyncEngine:
    """An async engine; for SQLite the parent folder is created and WAL mode is switched on."""
    u = make_url(url)
    if u.get_backend_name() == "sqlite" and u.database and u.database != ":memory:":
        Path(u.database).parent.mkdir(parents=True, exist_ok=True)
    engine = create_async_engine(url)
    if u.get_backend_name() == "sqlite":

        @event.listens_for(engine.sync_engine, "connect")
        def _pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=5000")
            cur.close()

    return engine


async def create_tables(engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(metadata.create_all)
        await conn.run_sync(_add_missing_columns)


def _add_missing_columns(conn) -> None:
    insp = inspect(conn)
    for table, column, sql_type in _ADDED_COLUMNS:
        if column not in {c["name"] for c in insp.get_columns(table)}:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {sql_type}"))
