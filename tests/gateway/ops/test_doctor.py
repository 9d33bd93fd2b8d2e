"""`farm gateway doctor`: every diagnosis against a live gateway and the fake upstream (real HTTP)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from aiohttp import web
from click.testing import CliRunner

from gateway.ops.cli import gateway as cli
from gateway.ops.doctor import TIMEOUT_FIX, Check, DoctorInput, failed, run_doctor, store_lookup
from gateway.ops.onboarding import ConfigRequest, project_models, write_config
from testkit.gateway.fake_upstream import Fault


async def diagnose(gw, tool: str = "openai-env", env: dict | None = None, tmp: Path | None = None, **kw):
    tmp = tmp or Path("/nonexistent")
    inp = DoctorInput(
        tool=tool,  # type: ignore[arg-type]
        env=env or {},
        default_base_url=gw.url,
        codex_config=kw.pop("codex_config", tmp / "codex.toml"),
        claude_settings=kw.pop("claude_settings", tmp / "claude.json"),
        connect_timeout_s=kw.pop("connect_timeout_s", 1.0),
        read_timeout_s=kw.pop("read_timeout_s", 5.0),
        **kw,
    )
    return await run_doctor(inp)


def one(checks: list[Check], name: str, status: str | None = None) -> Check:
    found = [c for c in checks if c.name == name and (status is None or c.status == status)]
    assert found, "\n".join(c.line() for c in checks)
    return found[-1]


def oa_env(gw, key: str | None = None, base: str | None = None) -> dict[str, str]:
    env = {"OPENAI_BASE_URL": base or gw.v1}
    if key is not None:
        env["OPENAI_API_KEY"] = key
    return env


def write(gw, tool: str, path: Path, key: str | None = None, base: str | None = None) -> Path:
    req = ConfigRequest(
        tool, project_models(gw.gw.settings, "alpha"), base or gw.url, "FARM_GATEWAY_KEY", key
    )  # type: ignore[arg-type]
    write_config(req, path, force=True)
    return path


# --- all is well ----------------------------------------------------------------------------------------


async def test_every_tool_passes_with_generated_configs(gateway, fake, tmp_path: Path) -> None:
    key = gateway.keys["alpha"]
    checks = await diagnose(gateway, env=oa_env(gateway, key), tmp=tmp_path)
    assert not failed(checks) and all(c.status == "PASS" for c in checks), checks
    write(gateway, "codex", tmp_path / "codex.toml")
    checks = await diagnose(gateway, "codex", {"FARM_GATEWAY_KEY": key}, tmp_path)
    assert all(c.status == "PASS" for c in checks), checks
    write(gateway, "claude-code", tmp_path / "claude.json", key=key)
    checks = await diagnose(gateway, "claude-code", {}, tmp_path)
    assert all(c.status == "PASS" for c in checks), checks
    # openai-env (no model configured): its native gpt-fake, then claude-fake through translation (the
    # "translation" line); codex and claude-code: the model their generated config names
    assert [s.path for s in fake.seen] == [
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/messages",
    ]
    assert [s.body.get("max_tokens") or s.body.get("max_completion_tokens") for s in fake.seen] == [
        1,
        1,
        None,
        1,
    ]
    assert "claude-fake" in one(checks, "model call").message


async def test_doctor_reports_the_translation_path(gateway, fake, tmp_path: Path) -> None:
    key = gateway.keys["alpha"]
    checks = await diagnose(
        gateway, "codex", {"FARM_GATEWAY_KEY": key, "OPENAI_BASE_URL": gateway.v1}, tmp_path
    )
    assert "gpt-fake" in one(checks, "model call", "PASS").message
    line = one(checks, "translation", "PASS").message
    assert "claude-fake" in line and "responses->messages" in line
    env = {"ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_AUTH_TOKEN": key}
    checks = await diagnose(gateway, "claude-code", env, tmp_path)  # gpt-fake first: translated
    assert "claude-fake answered in" in one(checks, "model call", "PASS").message
    assert (
        "gpt-fake" in one(checks, "translation").message
        and "messages->chat" in one(checks, "translation").message
    )
    checks = await diagnose(gateway, env=oa_env(gateway, gateway.keys["beta"]))  # beta: gpt-beta only
    assert not [c for c in checks if c.name == "translation"]


async def test_without_a_configured_model_it_finds_one_of_the_right_kind(
    gateway, fake, tmp_path: Path
) -> None:
    env = {"ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_AUTH_TOKEN": gateway.keys["alpha"]}
    checks = await diagnose(gateway, "claude-code", env, tmp_path)  # alpha lists gpt-fake first
    assert all(c.status == "PASS" for c in checks), checks
    assert "claude-fake answered" in one(checks, "model call").message


# --- reaching the gateway -------------------------------------------------------------------------------


async def test_unreachable_host(gateway) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    checks = await diagnose(
        gateway, env=oa_env(gateway, gateway.keys["alpha"], f"http://127.0.0.1:{port}/v1")
    )
    c = one(checks, "base URL", "FAIL")
    assert "nothing is listening" in c.message and "farm gateway serve" in c.fix and failed(checks)


async def test_connect_timeout(gateway) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)  # never accepted: once the queue is full, further SYNs go unanswered
    fillers = []
    try:
        for _ in range(3):
            f = socket.socket()
            f.setblocking(False)
            f.connect_ex(srv.getsockname())
            fillers.append(f)
        base = f"http://127.0.0.1:{srv.getsockname()[1]}/v1"
        checks = await diagnose(
            gateway, env=oa_env(gateway, gateway.keys["alpha"], base), connect_timeout_s=0.3
        )
    finally:
        for f in fillers:
            f.close()
        srv.close()
    c = one(checks, "base URL", "FAIL")
    assert "no TCP connection" in c.message and "0.3 s" in c.message and "firewall" in c.message


async def test_404_base_url_with_or_without_v1(gateway, tmp_path: Path) -> None:
    key = gateway.keys["alpha"]
    c = one(await diagnose(gateway, env=oa_env(gateway, key, gateway.url)), "base URL", "FAIL")
    assert "without /v1" in c.message and c.fix == f"set OPENAI_BASE_URL to {gateway.v1}."
    settings = write(gateway, "claude-code", tmp_path / "claude.json", key=key)
    env = {"ANTHROPIC_BASE_URL": gateway.v1}  # the shell disagrees with the file; the file wins ...
    checks = await diagnose(gateway, "claude-code", env, tmp_path)
    assert "differs between this shell" in one(checks, "tool settings", "WARN").message
    c = one(await diagnose(gateway, "claude-code", env, tmp_path, base_url=gateway.v1), "base URL", "FAIL")
    assert "with /v1" in c.message and "/v1/v1/messages" in c.message
    assert c.fix == f"set ANTHROPIC_BASE_URL to {gateway.url}." and settings.exists()
    write(gateway, "codex", tmp_path / "codex.toml")
    text = (tmp_path / "codex.toml").read_text().replace(gateway.v1, gateway.url)
    (tmp_path / "codex.toml").write_text(text)
    c = one(await diagnose(gateway, "codex", {"FARM_GATEWAY_KEY": key}, tmp_path), "base URL", "FAIL")
    assert c.fix == f"set base_url in config.toml to {gateway.v1}."
    c = one(await diagnose(gateway, env=oa_env(gateway, key, gateway.url + "/api/v1")), "base URL", "FAIL")
    assert "with or without /v1" in c.message


@contextlib.asynccontextmanager
async def served(path: str, handler) -> AsyncIterator[str]:
    """A web app of its own on 127.0.0.1 answering GET ``path`` with ``handler``: its URL."""
    app = web.Application()
    app.router.add_get(path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_web_page_instead_of_the_api(gateway) -> None:
    async def page(_request: web.Request) -> web.Response:
        return web.Response(text="<!DOCTYPE html><html><body>Grafana</body></html>", content_type="text/html")

    async with served("/{tail:.*}", page) as url:
        checks = await diagnose(gateway, env=oa_env(gateway, gateway.keys["alpha"], f"{url}/d/agents"))
    c = one(checks, "base URL", "FAIL")
    assert "web page (HTML)" in c.message and gateway.v1 in c.fix


# --- the key --------------------------------------------------------------------------------------------


async def test_key_unset_in_this_shell(gateway) -> None:
    checks = await diagnose(gateway, env=oa_env(gateway))
    c = one(checks, "key", "FAIL")
    assert "$OPENAI_API_KEY is not set in this shell" in c.message and "export OPENAI_API_KEY" in c.fix
    assert "401" in one(checks, "auth", "FAIL").message


async def test_key_with_a_newline_or_bearer_prefix_or_foreign_key(gateway) -> None:
    key = gateway.keys["alpha"]
    checks = await diagnose(gateway, env=oa_env(gateway, key + "\n"))
    assert "a newline" in one(checks, "key", "FAIL").message
    assert "works once cleaned" in one(checks, "auth", "WARN").message and failed(checks)
    assert "tr -d" in one(checks, "key").fix
    checks = await diagnose(gateway, env=oa_env(gateway, "Bearer " + key))
    assert "starts with 'Bearer '" in one(checks, "key", "FAIL").message
    checks = await diagnose(gateway, env=oa_env(gateway, "sk-proj-abcdef0123456789"))
    assert "an OpenAI key" in one(checks, "key", "FAIL").message
    assert "401" in one(checks, "auth", "FAIL").message


async def test_custom_authorization_header_without_bearer(gateway, tmp_path: Path) -> None:
    key = gateway.keys["alpha"]
    write(gateway, "claude-code", tmp_path / "claude.json", key=key)
    env = {"ANTHROPIC_CUSTOM_HEADERS": f"X-Team: kernels\nAuthorization: {key}"}
    c = one(await diagnose(gateway, "claude-code", env, tmp_path), "auth", "FAIL")
    assert "without the 'Bearer ' prefix" in c.message and "ANTHROPIC_CUSTOM_HEADERS" in c.message


async def test_revoked_rotated_and_foreign_keys(gateway) -> None:
    store, lookup = gateway.gw.keys, store_lookup(gateway.gw.settings)
    key = gateway.keys["alpha"]
    rotated, _ = await store.create("alpha", "rotated")
    await store.rotate(rotated[3:15], timedelta(0))
    await store.revoke(key[3:15])
    c = one(await diagnose(gateway, env=oa_env(gateway, key), key_lookup=lookup), "auth", "FAIL")
    assert f"key {key[3:15]} was revoked" in c.message
    c = one(await diagnose(gateway, env=oa_env(gateway, rotated), key_lookup=lookup), "auth", "FAIL")
    assert "was rotated to" in c.message and "grace ended" in c.message
    c = one(await diagnose(gateway, env=oa_env(gateway, rotated)), "auth", "FAIL")  # not on the gateway host
    assert "revoked" in c.message and "rotated" in c.message and "keys list" in c.fix
    foreign = "kf_0123456789ab_" + "x" * 40
    c = one(await diagnose(gateway, env=oa_env(gateway, foreign), key_lookup=lookup), "auth", "FAIL")
    assert "another gateway" in c.message


# --- two credentials at once (Claude Code sends ANTHROPIC_AUTH_TOKEN and ANTHROPIC_API_KEY both) ----------

OWN_ANTHROPIC_KEY = "sk-ant-api03-" + "u" * 40


def claude_env(gw, token: str, api_key: str) -> dict[str, str]:
    return {"ANTHROPIC_BASE_URL": gw.url, "ANTHROPIC_AUTH_TOKEN": token, "ANTHROPIC_API_KEY": api_key}


async def test_claude_code_with_its_own_anthropic_key_besides_the_gateway_key_warns_and_works(
    gateway,
) -> None:
    key = gateway.keys["alpha"]
    checks = await diagnose(gateway, "claude-code", claude_env(gateway, key, OWN_ANTHROPIC_KEY))
    assert not failed(checks), checks
    w = one(checks, "credentials", "WARN")
    assert "uses the gateway key in ANTHROPIC_AUTH_TOKEN" in w.message and "Anthropic key" in w.message
    assert "remove ANTHROPIC_API_KEY from this shell" in w.fix and OWN_ANTHROPIC_KEY not in w.line()
    assert one(checks, "model call", "PASS")
    # the gateway key in ANTHROPIC_API_KEY, the user's own key in ANTHROPIC_AUTH_TOKEN: the gateway still
    # picks the gateway key (x-api-key), so this works too
    checks = await diagnose(gateway, "claude-code", claude_env(gateway, OWN_ANTHROPIC_KEY, key))
    assert not failed(checks), checks
    assert "uses the gateway key in ANTHROPIC_API_KEY" in one(checks, "credentials", "WARN").message
    assert "ANTHROPIC_API_KEY holds a well-formed gateway key" in one(checks, "key", "PASS").message


async def test_claude_code_with_two_different_gateway_keys_fails(gateway) -> None:
    alpha, beta = gateway.keys["alpha"], gateway.keys["beta"]
    checks = await diagnose(gateway, "claude-code", claude_env(gateway, alpha, beta))
    c = one(checks, "credentials", "FAIL")
    assert (
        "two different gateway keys" in c.message
        and f"uses only ANTHROPIC_AUTH_TOKEN (key {alpha[3:15]})" in (c.message)
    )
    assert "remove ANTHROPIC_API_KEY" in c.fix and failed(checks)
    env = claude_env(gateway, alpha, beta)
    args = ["doctor", "--tool", "claude-code", "--claude-settings", "/nonexistent/settings.json"]
    res = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert res.exit_code == 1 and "FAIL  credentials" in res.stdout, res.stdout
    assert alpha not in res.stdout and beta not in res.stdout


async def test_claude_code_both_keys_against_a_gateway_that_reads_x_api_key_first(gateway) -> None:
    """A gateway from before the fix answers 401 when x-api-key holds the user's own key: a FAIL naming the
    conflict, where the old doctor (probing with the Bearer token alone) passed."""
    key = gateway.keys["alpha"]

    async def models(request: web.Request) -> web.Response:
        sent = request.headers.get("x-api-key") or request.headers.get("Authorization", "")[7:]
        if sent != key:
            err = {"type": "authentication_error", "message": "invalid, expired or revoked API key"}
            return web.json_response({"type": "error", "error": err}, status=401)
        return web.json_response({"data": [{"type": "model", "id": "claude-fake"}], "has_more": False})

    async with served("/v1/models", models) as old:
        env = {**claude_env(gateway, key, OWN_ANTHROPIC_KEY), "ANTHROPIC_BASE_URL": old}
        checks = await diagnose(gateway, "claude-code", env)
    c = one(checks, "auth", "FAIL")
    assert "sends both 'Authorization: Bearer' and 'x-api-key'" in c.message
    assert "used 'x-api-key' (ANTHROPIC_API_KEY, an Anthropic key (sk-ant-...))" in c.message
    assert "remove ANTHROPIC_API_KEY" in c.fix and failed(checks)


# --- the model call -------------------------------------------------------------------------------------


async def test_model_not_allowed_and_not_found_list_the_allowed_ones(gateway) -> None:
    env = oa_env(gateway, gateway.keys["alpha"])
    c = one(await diagnose(gateway, env=env, model="gpt-beta"), "model call", "FAIL")
    assert c.message.startswith("403") and "gpt-fake, claude-fake" in c.message
    c = one(await diagnose(gateway, env=env, model="gpt-6"), "model call", "FAIL")
    assert (
        c.message.startswith("404")
        and "no model 'gpt-6'" in c.message
        and "gpt-fake, claude-fake" in c.message
    )
    c = one(await diagnose(gateway, env=env, model="claude-fake"), "model call", "PASS")
    assert (
        "claude-fake (from --model) answered through the gateway's translation (chat->messages)" in c.message
    )


async def wait_in_flight(fake, n: int) -> None:
    async def until() -> None:
        while fake.in_flight < n:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(until(), 5)


async def test_429_concurrency_names_the_limit_and_suggests_a_concurrency(start_gateway, fake, oai) -> None:
    gw = await start_gateway(projects={"alpha": {"max_concurrency": 2, "queue_timeout_s": 0}})
    fake.faults.extend([Fault(stall_before_headers=True), Fault(stall_before_headers=True)])
    client = oai(gw)
    busy = [
        asyncio.create_task(
            client.chat.completions.create(model="gpt-fake", messages=[{"role": "user", "content": "x"}])
        )
        for _ in range(2)
    ]
    await wait_in_flight(fake, 2)
    env = oa_env(gw, gw.keys["alpha"])
    c = one(await diagnose(gw, env=env, key_lookup=store_lookup(gw.gw.settings)), "model call", "FAIL")
    assert "429, limit concurrency" in c.message and "Retry-After" in c.message
    assert "allows 2 requests at once" in c.fix and "suggested concurrency 1" in c.fix
    c = one(await diagnose(gw, env=env), "model call", "FAIL")
    assert "halve your parallel agents" in c.fix
    fake.release.set()
    await asyncio.gather(*busy)


async def test_429_rpm(start_gateway) -> None:
    gw = await start_gateway(projects={"alpha": {"rpm": 3}})
    env, lookup = oa_env(gw, gw.keys["alpha"]), store_lookup(gw.gw.settings)
    for _ in range(3):  # one model call each (a configured model: no translation probe)
        assert not failed(await diagnose(gw, env=env, model="gpt-fake"))
    c = one(await diagnose(gw, env=env, key_lookup=lookup, model="gpt-fake"), "model call", "FAIL")
    assert (
        "429, limit rpm" in c.message
        and "3 requests a minute" in c.fix
        and "suggested concurrency 1" in c.fix
    )


async def test_read_timeouts_at_the_gateway_and_at_the_client(start_gateway, fake) -> None:
    gw = await start_gateway(providers={"oa": {"read_timeout_s": 0.2}})
    fake.faults.append(Fault(stall_before_headers=True))
    c = one(await diagnose(gw, env=oa_env(gw, gw.keys["alpha"])), "model call", "FAIL")
    assert (
        c.message.startswith("504") and c.fix == TIMEOUT_FIX and "max_tokens" in c.fix and "stream" in c.fix
    )
    gw2 = await start_gateway()
    fake.faults.append(Fault(stall_before_headers=True))
    c = one(await diagnose(gw2, env=oa_env(gw2, gw2.keys["alpha"]), read_timeout_s=0.2), "model call", "FAIL")
    assert "no answer within 0.2 s (read timeout)" in c.message and c.fix == TIMEOUT_FIX


# --- settings meant for another tool --------------------------------------------------------------------


async def test_codex_with_claude_settings_and_no_env_key(gateway, tmp_path: Path) -> None:
    write(gateway, "codex", tmp_path / "codex.toml")
    env = {"ANTHROPIC_BASE_URL": gateway.url, "ANTHROPIC_AUTH_TOKEN": gateway.keys["alpha"]}
    checks = await diagnose(gateway, "codex", env, tmp_path)
    w = one(checks, "tool settings", "WARN")
    assert "ANTHROPIC_BASE_URL, ANTHROPIC_AUTH_TOKEN" in w.message and "Codex ignores them" in w.message
    assert "$FARM_GATEWAY_KEY is not set" in one(checks, "key", "FAIL").message
    text = (tmp_path / "codex.toml").read_text().replace('"responses"', '"chat"')
    (tmp_path / "codex.toml").write_text(text)
    checks = await diagnose(gateway, "codex", {"FARM_GATEWAY_KEY": gateway.keys["alpha"]}, tmp_path)
    assert "wire_api = 'chat'" in one(checks, "codex config", "FAIL").message


async def test_claude_code_with_openai_settings(gateway, tmp_path: Path) -> None:
    env = oa_env(gateway, gateway.keys["alpha"])
    c = one(await diagnose(gateway, "claude-code", env, tmp_path), "tool settings", "FAIL")
    assert "ANTHROPIC_BASE_URL is not set" in c.message and "OPENAI_BASE_URL" in c.message
    assert "client-config --tool claude-code" in c.fix


# --- the command ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("good", [True, False])
async def test_cli_prints_one_line_per_check_and_exits_nonzero_on_failure(gateway, good: bool) -> None:
    key = gateway.keys["alpha"] if good else "kf_0123456789ab_" + "y" * 40
    args = ["doctor", "--base-url", gateway.v1, "--key-env", "KF_TEST_KEY", "--timeout", "5"]
    res = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"KF_TEST_KEY": key})
    lines = res.stdout.splitlines()
    assert lines and all(line.split()[0] in ("PASS", "WARN", "FAIL") for line in lines)
    assert res.exit_code == (0 if good else 1), res.stdout
    assert key not in res.stdout
