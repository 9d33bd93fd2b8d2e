"""The agents the gateway exists for, the real CLIs from npm (pinned in scripts/agent-clis.sh, installed into
.agents/ by `make test`), each through the gateway on a model of the other kind, so through translation,
streamed: Claude Code (Anthropic Messages) on a model whose only deployment speaks OpenAI chat, and the Codex
CLI (OpenAI Responses) on one whose only deployment speaks Anthropic Messages. The fake upstream plays the
model (``FakeUpstream.agent``): it asks for the file through the client's own tool, then answers with what
the tool returned; each CLI must print the file's content.

Seen before (issue #29): Claude Code refused for ``output_config`` and then for a system message in its
conversation; Codex for ``client_metadata``, then its namespace tools, then ``web_search``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import services

from gateway.testing.agents import play_model

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


async def test_claude_code_reads_a_file_through_a_chat_only_model(start_gateway, fake, tmp_path):
    claude = _cli("claude")
    gw = await start_gateway()
    (tmp_path / "work").mkdir()
    target = tmp_path / "work" / "a.txt"
    target.write_text(SECRET_TEXT + "\n")
    fake.agent, fake.reply = play_model(target)
    env = _base_env(tmp_path) | {
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.keys["alpha"],
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    prompt = f"Read the file {target} and print its content"
    out = await _run(
        [claude, "-p", prompt, "--model", "gpt-fake", "--allowedTools", "Read"], env, tmp_path / "work"
    )
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["translation"] == "messages->chat"]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    used = [s.body for s in fake.seen if s.path.endswith("/chat/completions")]
    assert any(m.get("role") == "tool" for b in used for m in b["messages"])  # the tool's result went up


async def test_codex_reads_a_file_through_an_anthropic_only_model(start_gateway, fake, tmp_path):
    codex = _cli("codex")
    gw = await start_gateway()
    (tmp_path / "work").mkdir()
    target = tmp_path / "work" / "a.txt"
    target.write_text(SECRET_TEXT + "\n")
    fake.agent, fake.reply = play_model(target)
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "claude-fake"\nmodel_provider = "farm"\n\n[model_providers.farm]\nname = "farm"\n'
        f'base_url = "{gw.url}/v1"\nenv_key = "FARM_KEY"\nwire_api = "responses"\n'
    )
    env = _base_env(tmp_path) | {"CODEX_HOME": str(home), "FARM_KEY": gw.keys["alpha"]}
    prompt = f"Read the file {target} and print its content"
    cmd = [codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
    out = await _run(cmd, env, tmp_path / "work")
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["translation"] == "responses->messages"]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    # what Codex sends that has no Anthropic equivalent is dropped and said (here: its web search tool)
    assert all("tools[web_search]" in (r["dropped_fields"] or "").split(",") for r in rows), rows
