"""The server secret: no built-in one; generated once next to a SQLite database (mode 0600) and shared by the
gateway and the CLI; a start with another secret than the keys were made with is refused with the fix; and a
revocation made by another process bites within a second."""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest
import yaml
from click.testing import CliRunner
from pg import DB_BACKENDS, SQLITE_ONLY
from sqlalchemy import select

from gateway.config import ConfigError, GatewaySettings, load_settings
from gateway.http.app import Gateway
from gateway.ops.cli import gateway as cli
from gateway.store.db import create_engine, create_tables, meta
from gateway.store.keys import KeyStore
from gateway.store.secret import SECRET_FILE_NAME, configured_secret, fingerprint, resolve_secret

MSGS = [{"role": "user", "content": "hi"}]
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """This module's gateways run on SQLite and on PostgreSQL, except SQLITE_ONLY tests (a secret file)."""
    return request.param


@pytest.fixture(autouse=True)
def _no_secret_in_env(monkeypatch):
    monkeypatch.delenv("FARM_GATEWAY_SECRET", raising=False)


def config_file(settings: GatewaySettings, path: Path, secret: str | None) -> str:
    data = settings.model_dump(mode="json", exclude={"secret"})
    if secret is not None:
        data["secret"] = secret
    path.write_text(yaml.safe_dump(data))
    return str(path)


async def run_cli(*args: str, env: dict | None = None):
    return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env, catch_exceptions=False)


async def cli_process(*args: str, env: dict | None = None) -> tuple[int, str]:
    """The CLI as a real second process (its own engine and connections to the same SQLite file)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}  # FARM_GATEWAY_SECRET: unset
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.ops.cli",
        *args,
        env=full_env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode()


async def ok(gw, key: str) -> bool:
    async with openai.AsyncOpenAI(base_url=gw.v1, api_key=key, max_retries=0) as client:
        try:
            await client.chat.completions.create(model="gpt-fake", messages=MSGS)
            return True
        except openai.AuthenticationError:
            return False


def with_secret(settings: GatewaySettings, secret: str | None) -> GatewaySettings:
    return GatewaySettings(**settings.model_dump(exclude={"secret"}), secret=secret)


def minimal(db: Path, secret: str | None = None) -> GatewaySettings:
    return GatewaySettings(database_url=f"sqlite+aiosqlite:///{db}", secret=secret)


async def start_refused(settings: GatewaySettings) -> str:
    gw = Gateway(settings)
    try:
        with pytest.raises(ConfigError) as ei:
            await gw.start()
    finally:
        await gw.stop()
    return str(ei.value)


# --- no built-in secret: one generated, shared by the gateway and the CLI ---------------------------------


@SQLITE_ONLY  # the secret file exists only beside a SQLite database
async def test_first_start_generates_a_private_secret_file_that_the_cli_shares(
    start_gateway, tmp_path, caplog
):
    caplog.set_level(logging.INFO)
    gw = await start_gateway(secret=None)
    path = tmp_path / SECRET_FILE_NAME
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    secret = path.read_text().strip()
    assert len(secret) >= 40
    said = [r.getMessage() for r in caplog.records if SECRET_FILE_NAME in r.getMessage()]
    assert len(said) == 1 and str(path) in said[0]  # one line, naming the file ...
    assert all(secret not in r.getMessage() for r in caplog.records)  # ... never the secret
    assert await ok(gw, gw.keys["alpha"])

    # `farm gateway keys create` without FARM_GATEWAY_SECRET reads the same file: its key works here
    cfg = config_file(gw.gw.settings, tmp_path / "cfg.yaml", secret=None)
    res = await run_cli("keys", "create", "--config", cfg, "--project", "alpha")
    assert res.exit_code == 0, res.output
    key = res.stdout.strip().splitlines()[-1]
    assert await ok(gw, key)
    assert path.read_text().strip() == secret  # not regenerated

    # another start reads the file: the keys work there too, and nothing is announced again
    caplog.clear()
    gw2 = await start_gateway(secret=None, database_url=gw.gw.settings.database_url)
    assert await ok(gw2, key) and await ok(gw2, gw.keys["alpha"])
    assert not [r for r in caplog.records if SECRET_FILE_NAME in r.getMessage()]


async def test_a_secret_file_open_to_others_or_a_shared_database_without_a_secret_is_refused(tmp_path):
    db = tmp_path / "gw.db"
    secret, source = configured_secret(minimal(db))
    assert source == str(tmp_path / SECRET_FILE_NAME)
    assert configured_secret(minimal(db)) == (secret, source)
    (tmp_path / SECRET_FILE_NAME).chmod(0o644)
    assert f"chmod 600 {tmp_path / SECRET_FILE_NAME}" in await start_refused(minimal(db))
    pg = GatewaySettings(database_url="postgresql+asyncpg://u:pw@db.example/farm")
    with pytest.raises(ConfigError, match="set FARM_GATEWAY_SECRET to the same secret on every gateway"):
        configured_secret(pg)
    assert configured_secret(with_secret(pg, "s3cret-from-env"))[1] == "FARM_GATEWAY_SECRET"


# --- another secret than the keys were made with ----------------------------------------------------------


@SQLITE_ONLY  # checks the secret file too
async def test_another_secret_is_refused_by_the_gateway_the_cli_and_serve(start_gateway, tmp_path):
    gw = await start_gateway()  # conftest's SECRET
    engine = create_engine(gw.gw.settings.database_url)
    try:
        async with engine.connect() as conn:
            stored = (await conn.execute(select(meta.c.value))).scalars().all()
    finally:
        await engine.dispose()
    assert stored == [fingerprint(b"test-secret-0123456789")]
    assert "test-secret" not in stored[0]  # a keyed fingerprint, not the secret

    other = with_secret(gw.gw.settings, "another-secret-9876543210")
    message = await start_refused(other)
    assert "made with another secret" in message and "set FARM_GATEWAY_SECRET" in message
    assert "reset-secret" in message and "another-secret" not in message
    assert "\n" not in message

    # without FARM_GATEWAY_SECRET the generated file is not the keys' secret either
    assert "made with another secret" in await start_refused(with_secret(gw.gw.settings, None))

    cfg = config_file(gw.gw.settings, tmp_path / "cfg.yaml", secret="another-secret-9876543210")
    res = await run_cli("keys", "create", "--config", cfg, "--project", "alpha")
    # exit 2: the configuration (its secret) is wrong
    assert res.exit_code == 2 and "made with another secret" in res.output and "kf_" not in res.output
    assert (await run_cli("keys", "list", "--config", cfg)).exit_code == 0  # needs no secret

    code, out = await cli_process("serve", "--config", cfg, "--port", "0")
    assert code == 2, out  # the configuration's secret
    assert "Error: the gateway keys in this database were made with another secret" in out
    assert "Traceback" not in out and "another-secret-9876543210" not in out


async def test_reset_secret_revokes_every_key_and_records_the_new_secret(start_gateway, tmp_path):
    gw = await start_gateway()
    old_key, url = gw.keys["alpha"], gw.gw.settings.database_url
    new = "the-new-secret-after-a-leak"
    cfg = config_file(gw.gw.settings, tmp_path / "cfg.yaml", secret=new)
    res = await run_cli("keys", "reset-secret", "--config", cfg)  # asks first
    assert res.exit_code == 1 and "Aborted" in res.output
    res = await run_cli("keys", "reset-secret", "--config", cfg, "--yes")
    assert res.exit_code == 0 and "revoked 2 keys" in res.output, res.output
    gw2 = await start_gateway(secret=new, database_url=url)
    assert not await ok(gw2, old_key)
    assert await ok(gw2, gw2.keys["alpha"])


async def test_keys_made_before_fingerprints_need_their_secret(tmp_path):
    db = tmp_path / "old.db"
    engine = create_engine(f"sqlite+aiosqlite:///{db}")
    try:
        await create_tables(engine)
        await KeyStore(engine, b"kernelfarm-gateway-dev-secret-do-not-use-in-production").create("alpha")
    finally:
        await engine.dispose()
    message = await start_refused(minimal(db))  # the old dev secret is gone, and no secret is set
    assert "1 keys made before the gateway recorded its secret" in message and "reset-secret" in message
    engine = create_engine(f"sqlite+aiosqlite:///{db}")
    try:
        assert await resolve_secret(minimal(db, "the-old-env-secret"), engine) == b"the-old-env-secret"
        await resolve_secret(minimal(db, "the-old-env-secret"), engine)  # recorded, then compared
        with pytest.raises(ConfigError, match="another secret"):
            await resolve_secret(minimal(db), engine)
    finally:
        await engine.dispose()


# --- revocation from elsewhere ----------------------------------------------------------------------------


def test_key_cache_ttl_is_at_most_a_second(tmp_path):
    assert GatewaySettings().key_cache_ttl_s == 1.0
    (tmp_path / "c.yaml").write_text("key_cache_ttl_s: 5\n")
    with pytest.raises(ConfigError, match="key_cache_ttl_s"):
        load_settings(tmp_path / "c.yaml")


async def first_refusal(gw, key: str, since: float, limit_s: float) -> float:
    """Seconds from ``since`` until the key is refused, polling every 20 ms (fails after ``limit_s``)."""
    while time.monotonic() - since < limit_s:
        if not await ok(gw, key):
            return time.monotonic() - since
        await asyncio.sleep(0.02)
    raise AssertionError(f"key still accepted {limit_s} s later")


@SQLITE_ONLY  # 6 s of CLI processes; test_postgres.py revokes through PostgreSQL from another engine
async def test_revocation_bites_at_once_here_and_within_a_second_from_another_process(
    start_gateway, tmp_path
):
    ttl = GatewaySettings.model_fields["key_cache_ttl_s"].default
    gw = await start_gateway(key_cache_ttl_s=ttl)
    cfg = config_file(gw.gw.settings, tmp_path / "cfg.yaml", secret="test-secret-0123456789")

    # on the instance that revokes: the very next request
    key, info = await gw.gw.keys.create("alpha", "here")
    assert await ok(gw, key)
    assert await gw.gw.keys.revoke(info.id)
    assert not await ok(gw, key)

    # another key store on the same SQLite file (its own engine: another process as far as SQLite knows)
    engine = create_engine(gw.gw.settings.database_url)
    try:
        other = KeyStore(engine, b"test-secret-0123456789", cache_ttl_s=0)
        key, info = await gw.gw.keys.create("alpha", "elsewhere")
        assert await ok(gw, key)  # cached now
        t0 = time.monotonic()
        assert await other.revoke(info.id)
        assert await first_refusal(gw, key, t0, 3.0) <= ttl + 0.4
    finally:
        await engine.dispose()

    # the CLI as a real second process, while the key is in use: revoke, and rotate without grace
    for command in (["revoke"], ["rotate", "--grace", "0"]):
        key, info = await gw.gw.keys.create("alpha", "cli")
        stop = asyncio.Event()

        async def keep_busy(key: str = key, stop: asyncio.Event = stop) -> None:
            while not stop.is_set():
                await ok(gw, key)
                await asyncio.sleep(0.01)

        hot = asyncio.create_task(keep_busy())
        code, out = await cli_process("keys", command[0], "--config", cfg, info.id, *command[1:])
        t0 = time.monotonic()  # the change was committed before the process exited
        gw.clock.now = datetime.now(UTC)  # the gateway's clock is a fake one; the rotation used the real one
        stop.set()
        await hot
        assert code == 0, out
        assert await first_refusal(gw, key, t0, 3.0) <= ttl + 0.4
