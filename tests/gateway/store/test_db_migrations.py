"""The schema is Alembic's (gateway/store/migrations), on SQLite and on PostgreSQL: an empty database is
created
at the newest revision, equal to the tables of gateway/store/db.py; a database from before migrations is
refused by every start and command, naming `farm gateway db upgrade`, which adopts it (its rows kept); a
database
from a newer release is refused; first starts at once create the tables once."""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pg import DB_BACKENDS
from sqlalchemy import Table, insert, inspect, select, text

from gateway.config import GatewaySettings, StartupError
from gateway.http.app import Gateway
from gateway.ops.cli import gateway as cli
from gateway.store.db import (
    VERSION_TABLE,
    SchemaError,
    api_keys,
    create_engine,
    ensure_schema,
    head_revision,
    ledger,
    metadata,
    migration_options,
    schema_state,
    upgrade_schema,
)

SECRET = "migration-test-secret-0123"
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


@pytest.fixture
async def empty_url(db_backend, tmp_path, request) -> str:
    """A database without any table (PostgreSQL: a copy of template1)."""
    if db_backend == "postgresql":
        return await request.getfixturevalue("pg_server").create_database(template=None)
    return f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"


@pytest.fixture
async def engine(empty_url):
    e = create_engine(empty_url)
    yield e
    await e.dispose()


def _differences(conn) -> list:
    """What Alembic's autogenerate finds between the database and the tables of gateway/store/db.py."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts=migration_options(conn.dialect))
    return compare_metadata(ctx, metadata)


def _old_style(conn) -> None:
    """What the releases before migrations made (``metadata.create_all``), as a database of the first
    release had it: no gateway_meta, no gateway_ledger.batch_size; with a key and a ledger row."""
    from sqlalchemy import MetaData

    old = MetaData()
    Table("gateway_api_keys", old, *(c._copy() for c in api_keys.columns))
    since = {"batch_size", "deployment", "fallback_from", "translation", "cost_usd"}  # added later
    since |= {"cached_input_tokens", "cache_write_tokens", "shared_pending", "dropped_fields"}
    since |= {"rate_limited", "retry_wait_ms", "max_tokens"}
    Table("gateway_ledger", old, *(c._copy() for c in ledger.columns if c.name not in since))
    old.create_all(conn)
    now = datetime.now(UTC)
    conn.execute(
        insert(old.tables["gateway_api_keys"]).values(
            id="0123456789ab", project="alpha", name="old", key_hash="0" * 64, created_at=now
        )
    )
    row = {"request_id": "old-row", "ts": now, "endpoint": "chat", "status": "ok", "latency_ms": 1.0}
    conn.execute(insert(old.tables["gateway_ledger"]).values(stream=False, tokens_estimated=False, **row))


def _config(tmp_path: Path, url: str) -> str:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({"database_url": url, "secret": SECRET}))
    return str(path)


async def _cli(*args: str):
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args))


async def _start_refused(url: str, tmp_path: Path) -> str:
    gw = Gateway(GatewaySettings(database_url=url, secret=SECRET, ledger_spool_dir=str(tmp_path / "spool")))
    try:
        with pytest.raises(StartupError) as ei:
            await gw.start()
    finally:
        await gw.stop()
    return str(ei.value)


async def test_an_empty_database_is_created_at_the_newest_revision_as_db_py_has_it(engine):
    before = await schema_state(engine)
    assert before.empty and before.current is None and not before.up_to_date
    state = await ensure_schema(engine)  # the zero-setup start: no command needed
    assert state.up_to_date and state.current == head_revision() == "0005"
    assert state.tables == set(metadata.tables)
    async with engine.connect() as conn:
        assert await conn.run_sync(_differences) == []  # the migrations make exactly these tables
        names = set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        assert VERSION_TABLE in names and "alembic_version" not in names
    assert (await ensure_schema(engine)).up_to_date  # a second start changes nothing
    before, after = await upgrade_schema(engine)
    assert before == after


async def test_an_old_style_database_is_refused_until_db_upgrade_adopts_it(
    engine, empty_url, tmp_path, start_gateway
):
    async with engine.begin() as conn:
        await conn.run_sync(_old_style)
    state = await schema_state(engine)
    assert state.current is None and not state.empty and "gateway_meta" not in state.tables

    with pytest.raises(SchemaError) as ei:
        await ensure_schema(engine)
    message = str(ei.value)
    assert "`farm gateway db upgrade`" in message and "before schema migrations" in message
    assert "\n" not in message
    assert await _start_refused(empty_url, tmp_path) == message  # Gateway.start (so `serve`) too
    cfg = _config(tmp_path, empty_url)
    res = await _cli("keys", "list", "--config", cfg)  # and so does every command on the database
    # exit 4: infrastructure (the database needs an upgrade), not the configuration
    assert res.exit_code == 4 and "farm gateway db upgrade" in res.output and "Traceback" not in res.output
    async with engine.connect() as conn:  # nothing was changed by the refusals
        assert "batch_size" not in {c["name"] for c in await conn.run_sync(_columns)}

    res = await _cli("db", "upgrade", "--config", cfg)
    assert res.exit_code == 0, res.output
    assert f"schema upgraded from tables from before migrations to {head_revision()}" in res.output
    res = await _cli("db", "upgrade", "--config", cfg)
    assert res.exit_code == 0 and f"already at the newest revision, {head_revision()}" in res.output

    state = await schema_state(engine)
    assert state.up_to_date and state.tables == set(metadata.tables)
    async with engine.connect() as conn:
        assert await conn.run_sync(_differences) == []  # adopted: the same tables as a new database
        assert (await conn.execute(select(api_keys.c.name))).scalars().all() == ["old"]
        (row,) = (await conn.execute(select(ledger))).mappings().all()
        assert row["request_id"] == "old-row" and row["batch_size"] is None
    gw = await start_gateway(database_url=empty_url)  # the gateway starts on it now, and writes
    gw.gw.ledger.submit({**row, "request_id": "new-row", "ts": datetime.now(UTC), "batch_size": 3})
    rows = [(r["request_id"], r["batch_size"]) for r in await gw.rows()]
    assert rows == [("old-row", None), ("new-row", 3)]


def _columns(conn) -> list[dict]:
    return inspect(conn).get_columns("gateway_ledger")


async def test_a_database_from_a_newer_release_is_refused(engine, empty_url, tmp_path):
    await ensure_schema(engine)
    async with engine.begin() as conn:
        await conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    with pytest.raises(SchemaError, match="at schema revision 0099, which this gateway does not know"):
        await ensure_schema(engine)
    with pytest.raises(SchemaError, match="0099"):
        await upgrade_schema(engine)  # never "downgraded" by an older release
    res = await _cli("db", "upgrade", "--config", _config(tmp_path, empty_url))
    assert res.exit_code == 4 and "does not know" in res.output


async def test_first_starts_at_once_create_the_tables_once(empty_url):
    engines = [create_engine(empty_url) for _ in range(4)]
    try:
        states = await asyncio.gather(*(ensure_schema(e) for e in engines))
        assert all(s.up_to_date for s in states)
        async with engines[0].connect() as conn:
            versions = (await conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}"))).all()
        assert versions == [(head_revision(),)]
    finally:
        for e in engines:
            await e.dispose()


@pytest.mark.parametrize("db_backend", ["sqlite"])
async def test_serve_refuses_an_old_style_database_in_one_line_naming_db_upgrade(engine, empty_url, tmp_path):
    async with engine.begin() as conn:
        await conn.run_sync(_old_style)
    await engine.dispose()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for k in [k for k in env if k.startswith("FARM_GATEWAY_")]:
        del env[k]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.ops.cli", "serve",
        "--config", _config(tmp_path, empty_url), "--port", "0",
        env=env, cwd=tmp_path, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out = (await asyncio.wait_for(proc.communicate(), 60))[0].decode()
    assert proc.returncode == 4, out  # infrastructure: the database needs an upgrade
    errors = [line for line in out.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "run `farm gateway db upgrade` (with the same --config)" in errors[0], out
    assert "Traceback" not in out


def test_an_older_revision_is_named_with_the_command_and_the_password_never():
    from gateway.store.db import SchemaState

    url = "postgresql+asyncpg://gw:s3cret-pw@db.example/farm"
    message = SchemaState("0001", "0002", frozenset(metadata.tables)).problem(url)
    assert "at schema revision 0001, older than the 0002 this gateway needs" in message
    assert "run `farm gateway db upgrade` (with the same --config)" in message
    assert "s3cret-pw" not in message and "gw:***@db.example/farm" in message
    assert SchemaState("0002", "0002", frozenset()).problem(url) is None
