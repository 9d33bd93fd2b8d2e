"""`farm gateway client-config`: each config parsed back, and the generated values drive the SDKs."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import anthropic
import openai
from click.testing import CliRunner

from gateway.ops.cli import gateway as cli
from gateway.ops.onboarding import ConfigRequest, ProjectModels, project_models, render

EXAMPLE = str(Path(__file__).parents[3] / "gateway" / "example-config.yaml")


def make(gw, tool: str, project: str = "alpha", key: str | None = None, base: str | None = None) -> str:
    models = project_models(gw.gw.settings, project)
    return render(ConfigRequest(tool, models, base or gw.url, "FARM_GATEWAY_KEY", key))  # type: ignore[arg-type]


def run_cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, ["client-config", "--config", EXAMPLE, *args], env=env or {})
    return res.exit_code, res.stdout, res.stderr


# --- Claude Code ----------------------------------------------------------------------------------------


async def test_claude_code_settings_drive_the_anthropic_sdk(gateway) -> None:
    key = gateway.keys["alpha"]
    env = json.loads(make(gateway, "claude-code", key=key, base=gateway.v1 + "/"))["env"]
    assert set(env) == {
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_AUTH_TOKEN",
        "ANTHROPIC_MODEL",
        "ANTHROPIC_SMALL_FAST_MODEL",
    }
    assert env["ANTHROPIC_BASE_URL"] == gateway.url  # no /v1, even when given one
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "claude-fake"
    client = anthropic.AsyncAnthropic(
        base_url=env["ANTHROPIC_BASE_URL"],
        auth_token=env["ANTHROPIC_AUTH_TOKEN"],
        api_key=None,
        max_retries=0,
    )
    async with client:
        msg = await client.messages.create(
            model=env["ANTHROPIC_MODEL"], max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert msg.content[0].text
    assert gateway.keys["alpha"] not in make(gateway, "claude-code")  # no --reveal: a placeholder


def test_claude_code_print_never_shows_the_key_and_picks_models() -> None:
    secret = "kf_0123456789ab_" + "s" * 30
    code, out, _ = run_cli(
        "--tool", "claude-code", "--project", "flashmla-agent", env={"FARM_GATEWAY_KEY": secret}
    )
    assert code == 0 and secret not in out
    env = json.loads(out)["env"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8787"
    assert (env["ANTHROPIC_MODEL"], env["ANTHROPIC_SMALL_FAST_MODEL"]) == (
        "claude-sonnet-4-5",
        "claude-haiku-4-5",
    )
    assert env["ANTHROPIC_AUTH_TOKEN"].startswith("<")
    code, out, _ = run_cli(
        "--tool",
        "claude-code",
        "--project",
        "flashmla-agent",
        "--reveal",
        env={"FARM_GATEWAY_KEY": secret + "\n"},
    )
    assert code == 0 and json.loads(out)["env"]["ANTHROPIC_AUTH_TOKEN"] == secret
    code, _, err = run_cli("--tool", "claude-code", "--project", "flashmla-agent", "--reveal")
    assert code != 0 and "FARM_GATEWAY_KEY" in err


def test_claude_code_on_an_openai_only_project_uses_its_openai_models() -> None:
    """The gateway translates Messages to chat completions, so every project works with Claude Code."""
    code, out, err = run_cli("--tool", "claude-code", "--project", "deepgemm-acceptance")
    assert code == 0, err
    env = json.loads(out)["env"]
    assert (env["ANTHROPIC_MODEL"], env["ANTHROPIC_SMALL_FAST_MODEL"]) == ("gpt-5", "gpt-5-mini")
    code, _, err = run_cli("--tool", "codex", "--project", "nope")
    assert code != 0 and "unknown project 'nope'" in err


async def test_claude_code_settings_on_an_openai_only_project_drive_the_anthropic_sdk(gateway, fake) -> None:
    env = json.loads(make(gateway, "claude-code", project="beta", key=gateway.keys["beta"]))["env"]
    assert env["ANTHROPIC_MODEL"] == "gpt-beta"
    async with anthropic.AsyncAnthropic(
        base_url=env["ANTHROPIC_BASE_URL"], auth_token=env["ANTHROPIC_AUTH_TOKEN"], max_retries=0
    ) as client:
        msg = await client.messages.create(
            model=env["ANTHROPIC_MODEL"], max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        )
    assert msg.content[0].text and [s.path for s in fake.seen] == ["/v1/chat/completions"]


def test_write_merges_settings_json_keeps_a_backup_and_needs_force(tmp_path: Path) -> None:
    path = tmp_path / ".claude" / "settings.json"
    args = ["--tool", "claude-code", "--project", "flashmla-agent", "--write", str(path)]
    assert run_cli(*args)[0] == 0  # a new file (and its folder)
    user = {
        "permissions": {"allow": ["Bash(ls)"]},
        "env": {"DISABLE_TELEMETRY": "1", "ANTHROPIC_MODEL": "old"},
    }
    path.write_text(json.dumps(user))
    code, _, err = run_cli(*args)
    assert code != 0 and "--force" in err and json.loads(path.read_text()) == user
    code, _, err = run_cli(*args, "--force", "--base-url", "http://gw.example:9000/v1")
    assert code == 0 and "settings.json.bak" in err
    merged = json.loads(path.read_text())
    assert merged["permissions"] == user["permissions"]
    assert merged["env"]["DISABLE_TELEMETRY"] == "1"
    assert merged["env"]["ANTHROPIC_MODEL"] == "claude-sonnet-4-5"
    assert merged["env"]["ANTHROPIC_BASE_URL"] == "http://gw.example:9000"
    assert json.loads((tmp_path / ".claude" / "settings.json.bak").read_text()) == user
    # a real token already in the file survives a rewrite without --reveal; a second backup is timestamped
    merged["env"]["ANTHROPIC_AUTH_TOKEN"] = "kf_0123456789ab_" + "t" * 30
    path.write_text(json.dumps(merged))
    code, _, err = run_cli(*args, "--force")
    assert code == 0 and "kept the existing ANTHROPIC_AUTH_TOKEN" in err
    assert (
        json.loads(path.read_text())["env"]["ANTHROPIC_AUTH_TOKEN"] == merged["env"]["ANTHROPIC_AUTH_TOKEN"]
    )
    assert len(list(path.parent.glob("settings.json.*.bak"))) == 1
    path.write_text("{not json")
    code, _, err = run_cli(*args, "--force")
    assert code != 0 and "not valid JSON" in err and path.read_text() == "{not json"


# --- Codex ----------------------------------------------------------------------------------------------


async def test_codex_provider_block_drives_the_responses_api(gateway, monkeypatch) -> None:
    cfg = tomllib.loads(make(gateway, "codex"))
    assert cfg["model"] == "gpt-fake" and cfg["model_provider"] == "farm"
    block = cfg["model_providers"][cfg["model_provider"]]
    assert block["base_url"] == gateway.v1 and block["wire_api"] == "responses"
    assert block["env_key"] == "FARM_GATEWAY_KEY" and block["name"]
    monkeypatch.setenv(block["env_key"], gateway.keys["alpha"])
    client = openai.AsyncOpenAI(
        base_url=block["base_url"], api_key=os.environ[block["env_key"]], max_retries=0
    )
    async with client:
        resp = await client.responses.create(model=cfg["model"], input="hi")
        assert resp.output_text
        events = [
            ev.type async for ev in await client.responses.create(model=cfg["model"], input="hi", stream=True)
        ]
    assert events[-1] == "response.completed"


def test_codex_write_merges_into_an_existing_config_toml(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    path.write_text(
        "# my codex settings\n"
        'model = "o3"\n'
        'approval_policy = "on-request"\n\n'
        "[model_providers.farm]\n"
        'name = "old"\nbase_url = "http://old/v1"\nenv_key = "OLD"\nwire_api = "chat"\n\n'
        "[mcp_servers.docs]\n"
        'command = "docs-mcp"\n'
    )
    args = ["--tool", "codex", "--project", "deepgemm-acceptance", "--write", str(path), "--force"]
    code, _, err = run_cli(*args, "--key-env", "KF_KEY")
    assert code == 0, err
    text = path.read_text()
    cfg = tomllib.loads(text)
    assert cfg["model"] == "gpt-5-codex" and cfg["model_provider"] == "farm"
    assert cfg["approval_policy"] == "on-request" and cfg["mcp_servers"]["docs"]["command"] == "docs-mcp"
    assert cfg["model_providers"]["farm"] == {
        "name": "KernelFarm gateway (deepgemm-acceptance)",
        "base_url": "http://127.0.0.1:8787/v1",
        "env_key": "KF_KEY",
        "wire_api": "responses",
    }
    assert "# my codex settings" in text and "kf_" not in text
    assert 'wire_api = "chat"' in (tmp_path / "config.toml.bak").read_text()


# --- CC Switch and shell exports ------------------------------------------------------------------------


def test_cc_switch_profile_per_project() -> None:
    secret = "kf_0123456789ab_" + "c" * 30
    code, out, _ = run_cli(
        "--tool", "cc-switch", "--project", "v41-attn-regression", env={"FARM_GATEWAY_KEY": secret}
    )
    assert code == 0 and secret not in out
    doc = json.loads(out)
    claude, codex = doc["profiles"]
    assert doc["project"] == "v41-attn-regression"
    assert claude["app"] == "claude" and claude["base_url"] == "http://127.0.0.1:8787"
    assert claude["model"] == "claude-sonnet-4-5" and claude["name"] == "KernelFarm v41-attn-regression"
    assert codex["app"] == "codex" and codex["base_url"] == "http://127.0.0.1:8787/v1"
    assert codex["model"] == "gpt-5-mini"
    assert all(p["import_url"].startswith("ccswitch://v1/import?resource=provider") for p in doc["profiles"])
    code, out, _ = run_cli(
        "--tool", "cc-switch", "--project", "flashmla-agent", "--reveal", env={"FARM_GATEWAY_KEY": secret}
    )
    claude, codex = json.loads(out)["profiles"]  # an Anthropic-only project: Codex through translation
    assert claude["api_key"] == secret and "apiKey=" + secret in claude["import_url"]
    assert codex["app"] == "codex" and codex["model"] == "claude-sonnet-4-5"


async def test_openai_env_exports_drive_the_openai_sdk(gateway, tmp_path: Path) -> None:
    script = tmp_path / "farm.env"
    script.write_text(make(gateway, "openai-env"))
    out = subprocess.run(
        ["bash", "-c", f'source {script}; printf "%s\\n" "$OPENAI_BASE_URL" "$OPENAI_API_KEY"'],
        env={"FARM_GATEWAY_KEY": gateway.keys["alpha"], "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    assert out[0] == gateway.v1 and out[1] == gateway.keys["alpha"]
    async with openai.AsyncOpenAI(base_url=out[0], api_key=out[1], max_retries=0) as client:
        chat = await client.chat.completions.create(
            model="gpt-fake", messages=[{"role": "user", "content": "hi"}]
        )
    assert chat.choices[0].message.content
    revealed = make(gateway, "openai-env", key=gateway.keys["alpha"])
    assert f"export OPENAI_API_KEY={gateway.keys['alpha']}" in revealed


def test_codex_on_an_anthropic_only_project_uses_its_anthropic_models() -> None:
    assert ProjectModels("x", ["claude-fake"], []).codex_model() == "claude-fake"
    assert ProjectModels("x", ["claude-fake"], []).translated("codex") == ["claude-fake"]
    assert ProjectModels("x", ["claude-fake"], ["gpt-fake"]).translated("claude-code") == ["gpt-fake"]
    code, out, err = run_cli("--tool", "codex", "--project", "flashmla-agent")
    assert code == 0, err
    assert tomllib.loads(out)["model"] == "claude-sonnet-4-5"
