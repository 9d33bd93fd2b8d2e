"""The agents the gateway exists for, the real CLIs from npm (pinned in scripts/agent-clis.sh, installed into
.agents/ by `make test`), each through the gateway on a model of each kind, streamed: Claude Code (Anthropic
Messages) on a model whose only deployment speaks OpenAI chat (through translation) and on an Anthropic
one, the Codex CLI (OpenAI Responses) on one whose only deployment speaks Anthropic Messages (through
translation) and on an OpenAI one. The fake upstream plays the model (testkit.gateway.agents): it asks for
the file through the client's own tool, then answers with what the tool returned; each CLI must print the
file's content.

Seen before (issue #29): Claude Code refused for ``output_config`` and then for a system message in its
conversation; Codex for ``client_metadata``, then its namespace tools, then ``web_search``."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
import services

from testkit.gateway.agents import play_model

ROOT = Path(__file__).resolve().parents[3]
BIN = ROOT / ".agents" / "node_modules" / ".bin"
SECRET_TEXT = "KernelFarm agent check 4242"

pytestmark = pytest.mark.slow


def _cli(name: str) -> str:
    path = BIN / name
    if not path.exists():
        services.missing("agent-clis", f"{path} not found: `make deps-agents` installs Claude Code and Codex")
    return str(path)


async def _run(cmd: list[str], env: dict[str, str], cwd: Path) -> str:
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        raise
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text


def _base_env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"HOME": str(home)}


# model -> (the upstream path it is asked on, the ledger's translation for each client)
UPSTREAM = {"gpt-fake": "/v1/chat/completions", "claude-fake": "/v1/messages"}


def _task(tmp_path: Path, fake) -> Path:
    (tmp_path / "work").mkdir()
    target = tmp_path / "work" / "a.txt"
    target.write_text(SECRET_TEXT + "\n")
    fake.agent, fake.reply = play_model(target)
    return target


def _tool_result_went_up(fake, model: str) -> bool:
    """The file's content reached the model in its own format, as a tool result."""
    asked = [s.body for s in fake.seen if s.path == UPSTREAM[model] or (model == "gpt-fake" and
             s.path == "/v1/responses")]  # fmt: skip
    return any(SECRET_TEXT in json.dumps(b.get("messages") or b.get("input")) for b in asked)


@pytest.mark.parametrize("model,translation", [("gpt-fake", "messages->chat"), ("claude-fake", "")])
async def test_claude_code_reads_a_file(start_gateway, fake, tmp_path, model, translation):
    """On a chat-only model (through translation) and on an Anthropic one (as it is)."""
    claude = _cli("claude")
    gw = await start_gateway()
    target = _task(tmp_path, fake)
    env = _base_env(tmp_path) | {
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.keys["alpha"],
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    prompt = f"Read the file {target} and print its content"
    out = await _run(
        [claude, "-p", prompt, "--model", model, "--allowedTools", "Read"], env, tmp_path / "work"
    )
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["public_model"] == model]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    assert {r["translation"] or "" for r in rows} == {translation}
    assert _tool_result_went_up(fake, model)


@pytest.mark.parametrize("model,translation", [("claude-fake", "responses->messages"), ("gpt-fake", "")])
async def test_codex_reads_a_file(start_gateway, fake, tmp_path, model, translation):
    """On an Anthropic-only model (through translation) and on an OpenAI one (as it is)."""
    codex = _cli("codex")
    gw = await start_gateway()
    target = _task(tmp_path, fake)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "farm"\n\n[model_providers.farm]\nname = "farm"\n'
        f'base_url = "{gw.url}/v1"\nenv_key = "FARM_KEY"\nwire_api = "responses"\n'
    )
    env = _base_env(tmp_path) | {"CODEX_HOME": str(home), "FARM_KEY": gw.keys["alpha"]}
    prompt = f"Read the file {target} and print its content"
    cmd = [codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
    out = await _run(cmd, env, tmp_path / "work")
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["public_model"] == model]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    assert {r["translation"] or "" for r in rows} == {translation}
    assert _tool_result_went_up(fake, model)
    if translation:  # what Codex sends that has no Anthropic equivalent is dropped and said (web search)
        assert all("tools[web_search]" in (r["dropped_fields"] or "").split(",") for r in rows), rows
