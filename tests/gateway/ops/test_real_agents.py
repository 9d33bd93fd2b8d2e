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
from testkit.gateway.prompt_cache import PromptCache

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


async def _claude_code(gw, tmp_path: Path, model: str, target: Path) -> str:
    """Claude Code asked to print ``target``, through the gateway on ``model``: its output."""
    claude = _cli("claude")
    env = _base_env(tmp_path) | {
        "ANTHROPIC_BASE_URL": gw.url,
        "ANTHROPIC_API_KEY": gw.keys["alpha"],
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    prompt = f"Read the file {target} and print its content"
    return await _run(
        [claude, "-p", prompt, "--model", model, "--allowedTools", "Read"], env, tmp_path / "work"
    )


async def _codex(gw, tmp_path: Path, model: str, target: Path) -> str:
    """The Codex CLI asked to print ``target``, through the gateway on ``model``: its output."""
    codex = _cli("codex")
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        f'model = "{model}"\nmodel_provider = "farm"\n\n[model_providers.farm]\nname = "farm"\n'
        f'base_url = "{gw.url}/v1"\nenv_key = "FARM_KEY"\nwire_api = "responses"\n'
    )
    env = _base_env(tmp_path) | {"CODEX_HOME": str(home), "FARM_KEY": gw.keys["alpha"]}
    prompt = f"Read the file {target} and print its content"
    cmd = [codex, "exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox", prompt]
    return await _run(cmd, env, tmp_path / "work")


@pytest.mark.parametrize("model,translation", [("gpt-fake", "messages->chat"), ("claude-fake", "")])
async def test_claude_code_reads_a_file(start_gateway, fake, tmp_path, model, translation):
    """On a chat-only model (through translation) and on an Anthropic one (as it is)."""
    gw = await start_gateway()
    out = await _claude_code(gw, tmp_path, model, _task(tmp_path, fake))
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["public_model"] == model]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    assert {r["translation"] or "" for r in rows} == {translation}
    assert _tool_result_went_up(fake, model)


@pytest.mark.parametrize("model,translation", [("claude-fake", "responses->messages"), ("gpt-fake", "")])
async def test_codex_reads_a_file(start_gateway, fake, tmp_path, model, translation):
    """On an Anthropic-only model (through translation) and on an OpenAI one (as it is)."""
    gw = await start_gateway()
    out = await _codex(gw, tmp_path, model, _task(tmp_path, fake))
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["public_model"] == model]
    assert len(rows) >= 2 and all(r["status"] == "ok" and r["stream"] for r in rows[-2:]), rows
    assert {r["translation"] or "" for r in rows} == {translation}
    assert _tool_result_went_up(fake, model)
    if translation:  # what Codex sends that has no Anthropic equivalent is dropped and said (web search)
        assert all("tools[web_search]" in (r["dropped_fields"] or "").split(",") for r in rows), rows


# claude-fake priced with cache reads below its input: automatic prompt-cache breakpoints (issue 48)
CACHED_PRICES = {
    "claude-fake": {"input_per_mtok": 3.0, "output_per_mtok": 15.0, "cached_input_per_mtok": 0.3,
                    "cache_write_per_mtok": 3.75},
}  # fmt: skip


@pytest.mark.parametrize("agent", ["codex", "claude-code"])
async def test_an_agents_second_request_reads_the_first_from_the_prompt_cache(
    start_gateway, fake, tmp_path, agent
):
    """On an Anthropic model whose cache reads are cheaper, against the fake's Anthropic cache: Codex marks
    nothing (its Responses requests are translated) and gets the gateway's breakpoints; Claude Code marks
    its own, which go up as they came (the fake refuses more than four). Either way the request carrying
    the tool's result reads what the first request wrote, and its ledger row says so."""
    fake.prompt_cache = PromptCache(min_tokens=1024)
    gw = await start_gateway(prices=CACHED_PRICES)
    run = _codex if agent == "codex" else _claude_code
    out = await run(gw, tmp_path, "claude-fake", _task(tmp_path, fake))
    assert SECRET_TEXT in out, out[-2000:]
    rows = [r for r in await gw.rows() if r["public_model"] == "claude-fake" and r["status"] == "ok"]
    first, last = rows[0], rows[-1]
    assert first["cache_write_tokens"] > 1024, first  # the agent's system prompt and tools, written once
    assert last["cached_input_tokens"] >= first["cache_write_tokens"], last  # and read on the next turn
    assert last["cost_usd"] < last["input_tokens"] * 3.0 / 1e6  # under the input's uncached price
