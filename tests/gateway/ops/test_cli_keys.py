"""Keys (revoke, rotate with grace, expiry) through the CLI, the usage table, and config validation."""

from __future__ import annotations

import asyncio

import openai
import pytest
import yaml
from click.testing import CliRunner
from pg import DB_BACKENDS

from gateway.config import ConfigError, load_settings
from gateway.ops.cli import DEFAULT_CONFIG
from gateway.ops.cli import gateway as cli

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway of this module runs on SQLite and on PostgreSQL (conftest.start_gateway)."""
    return request.param


def write_config(gw, tmp_path) -> str:
    data = gw.gw.settings.model_dump(mode="json")
    data["secret"] = gw.gw.settings.secret.get_secret_value()
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


async def run_cli(*args: str):
    """Run the click CLI in a thread (it calls asyncio.run) and return the result."""
    result = await asyncio.to_thread(CliRunner().invoke, cli, list(args), catch_exceptions=False)
    return result


async def ok(client) -> bool:
    try:
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
        return True
    except openai.AuthenticationError:
        return False


async def test_revoked_key_stops_working(gateway, tmp_path, oai):
    cfg = write_config(gateway, tmp_path)
    res = await run_cli("keys", "create", "--config", cfg, "--project", "alpha", "--name", "ci")
    assert res.exit_code == 0, res.output
    key = res.stdout.strip().splitlines()[-1]
    assert key.startswith("kf_")
    key_id = key.split("_")[1]
    assert await ok(oai(gateway, project=key))
    listed = await run_cli("keys", "list", "--config", cfg)
    assert key_id in listed.stdout and key not in listed.stdout  # ids only, never the key
    res = await run_cli("keys", "revoke", "--config", cfg, key_id)
    assert res.exit_code == 0
    assert not await ok(oai(gateway, project=key))
    assert "revoked" in (await run_cli("keys", "list", "--config", cfg)).stdout


async def test_rotated_key_works_during_grace_only(gateway, tmp_path, oai):
    cfg = write_config(gateway, tmp_path)
    old = (
        (await run_cli("keys", "create", "--config", cfg, "--project", "alpha"))
        .stdout.strip()
        .splitlines()[-1]
    )
    res = await run_cli("keys", "rotate", "--config", cfg, "--grace", "1h", old.split("_")[1])
    assert res.exit_code == 0, res.output
    new = res.stdout.strip().splitlines()[-1]
    assert new != old
    assert await ok(oai(gateway, project=old)) and await ok(oai(gateway, project=new))
    gateway.clock.advance(59 * 60)
    assert await ok(oai(gateway, project=old))
    gateway.clock.advance(2 * 60)  # grace is over
    assert not await ok(oai(gateway, project=old))
    assert await ok(oai(gateway, project=new))


async def test_expired_key(gateway, oai):
    from datetime import timedelta

    key, _ = await gateway.gw.keys.create("alpha", "short", timedelta(seconds=60))
    assert await ok(oai(gateway, project=key))
    gateway.clock.advance(61)
    assert not await ok(oai(gateway, project=key))


async def test_keys_are_stored_hashed(gateway):
    from sqlalchemy import select

    from gateway.store.db import metadata

    rows = []
    async with gateway.gw.engine.connect() as conn:  # every row of every table, as text
        for table in metadata.sorted_tables:
            rows += [str(tuple(r)) for r in await conn.execute(select(table))]
    dump = "\n".join(rows)
    assert gateway.keys["alpha"].split("_")[1] in dump  # the key ids are there
    for key in gateway.keys.values():
        assert key not in dump and key.split("_", 2)[2] not in dump


async def test_unknown_project_rejected_by_cli(gateway, tmp_path):
    cfg = write_config(gateway, tmp_path)
    res = await asyncio.to_thread(
        CliRunner().invoke, cli, ["keys", "create", "--config", cfg, "--project", "nope"]
    )
    assert res.exit_code != 0 and "unknown project" in res.output


async def test_usage_table(gateway, fake, tmp_path, oai, anth):
    await oai(gateway).chat.completions.create(
        model="gpt-fake", messages=MSGS, extra_headers={"X-Farm-Task": "t1"}
    )
    await anth(gateway).messages.create(model="claude-fake", max_tokens=8, messages=MSGS)
    with pytest.raises(openai.PermissionDeniedError):
        await oai(gateway).chat.completions.create(model="gpt-beta", messages=MSGS)
    await gateway.gw.ledger.flush()
    cfg = write_config(gateway, tmp_path)
    res = await run_cli("usage", "--config", cfg, "--by", "task")
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "t1" in out and "alpha-default" in out and "total" in out
    res = await run_cli("usage", "--config", cfg, "--since", "1d")
    assert "gpt-fake" in res.stdout and "claude-fake" in res.stdout and "rejected" in res.stdout
    from gateway.ops.cli import usage_rows

    names, rows = await usage_rows(gateway.gw.settings, "model", None)
    by_model = {r[names.index("model")]: r for r in rows}
    total = sum(i + o for _, _, i, o in fake.usage_log)
    assert sum(r[names.index("total")] for r in rows) == total
    assert by_model["gpt-beta"][names.index("rejected")] == 1


def test_invalid_config_names_the_field(tmp_path):
    base = {
        "providers": {"p": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"}},
        "models": {"m": {"provider": "p", "upstream_model": "m"}},
        "projects": {"flashmla-agent": {"models": ["m"], "rpm": 0}},
    }
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"projects\.flashmla-agent\.rpm"):
        load_settings(path)
    base["projects"]["flashmla-agent"] = {"models": ["nope"]}
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"projects\.flashmla-agent\.models\.0"):
        load_settings(path)
    base["projects"]["flashmla-agent"] = {"models": ["m"]}
    base["providers"]["p"]["kind"] = "grpc"
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"providers\.p\.kind"):
        load_settings(path)
    res = CliRunner().invoke(cli, ["serve", "--config", str(path)])
    assert res.exit_code != 0 and "providers.p.kind" in res.output
    base["providers"]["p"] = {"kind": "openai", "base_url": "api.example.com/v1"}  # no scheme
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"providers\.p.*base_url: 'api.example.com/v1' is not an http"):
        load_settings(path)
    base["providers"]["p"] = {
        "kind": "openai",
        "base_url": "https://h/v1",
        "ca_file": str(tmp_path / "no.pem"),
    }
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError, match=r"providers\.p.*ca_file: .*no\.pem' is not a file"):
        load_settings(path)


def test_example_config_loads(monkeypatch):
    monkeypatch.setenv("FARM_GATEWAY_PORT", "9123")
    s = load_settings(DEFAULT_CONFIG)
    assert set(s.projects) == {"flashmla-agent", "deepgemm-acceptance", "v41-attn-regression"}
    assert s.port == 9123 and s.host == "127.0.0.1"  # the environment overrides the file


async def test_serve_with_example_config_starts_and_stops_cleanly(tmp_path):
    """What `make gateway` runs: the example config serves on 127.0.0.1 and a Ctrl-C stops it cleanly."""
    import os
    import signal
    import socket
    import sys

    import aiohttp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FARM_GATEWAY_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}"}
    env["PYTHONPATH"] = os.getcwd()
    env.pop("FARM_GATEWAY_SECRET", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.ops.cli",
        "serve",
        "--config",
        str(DEFAULT_CONFIG),
        "--port",
        str(port),
        env=env,
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as s:
            for _ in range(200):
                try:
                    async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                        assert r.status == 200
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("gateway did not come up")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, out.decode()
    # no built-in secret: one is generated next to the database and announced in one line, never shown
    secret_file = tmp_path / "gateway.secret"
    assert out.count(b"generated a new gateway secret") == 1 and str(secret_file).encode() in out
    assert secret_file.read_bytes().strip() not in out and b"DEV secret" not in out
    assert (tmp_path / "gw.db").exists()
