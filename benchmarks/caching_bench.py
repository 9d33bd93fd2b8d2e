"""`python -m benchmarks caching`: what automatic prompt-cache breakpoints save a Codex session on an
Anthropic model (issue 48; target: at least 50% lower cost, the answers unchanged).

The session is the recorded Codex CLI shape (gateway/ops/client_shapes/codex.json: its tools, its developer
and environment messages; the strings the recording cut are filled back to their recorded lengths, so the
system prompt is Codex's ~17k characters again) grown into 20 turns: the task, then 19 rounds of an
``exec_command`` call and its output (about 1.5 kB each), then the final answer. Each turn is sent as Codex
sends it (Responses, streamed, the whole history each time) to the gateway, in process on SQLite, serving
``claude-sonnet-4-5`` (its list price: $3 input, $3.75 cache write, $0.30 cache read, $15 output per
million tokens) from the fake upstream, which plays Anthropic's prompt cache (testkit.gateway.prompt_cache:
breakpoints, the 20-block lookback, a 1024-token minimum, writes and reads reported as Anthropic does).

Two runs on fresh fakes: ``prompt_caching: off`` (what an OpenAI-format client got before: no breakpoints)
and the default (``auto``). The cost is the sum of the 20 ledger rows' ``cost_usd``. The fake model's
every answer (which command to run, the final text) carries a digest of the prompt it saw (cache markers
left out), so "answers unchanged" means the model saw the same prompt on every turn of both runs.

    .venv/bin/python -m benchmarks caching
"""

from __future__ import annotations

import asyncio
import datetime
import json
import platform
import re
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "claude-sonnet-4-5"
TURNS = 20
_CUT = re.compile(r" \[\.\.\. (\d+) characters cut\]$")


def _fill(text: str) -> str:
    """A string the recording cut, filled back to its recorded length with numbered filler sentences."""
    m = _CUT.search(text)
    if m is None:
        return text
    head, want = text[: m.start()], int(m.group(1))
    filler = "".join(
        f" Guideline {i}: keep the change small, say what you ran and what it showed."
        for i in range(want // 60 + 2)
    )
    return head + filler[:want]


def _filled(obj: Any) -> Any:
    if isinstance(obj, str):
        return _fill(obj)
    if isinstance(obj, list):
        return [_filled(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _filled(v) for k, v in obj.items()}
    return obj


def session_start() -> dict:
    """Codex's first request of the recorded task, strings filled back, asking for the benchmark's model."""
    shapes = json.loads((ROOT / "gateway/ops/client_shapes/codex.json").read_text())
    first = _filled(shapes["requests"][0])
    first["model"] = MODEL
    task = "Find why tests/test_paged_mla.py fails on the fp8 path and fix it; run the suite when done."
    first["input"] = [
        *first["input"][:-1],
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": task}]},
    ]
    return first


def tool_output(turn: int) -> str:
    """What the turn's command printed, as Codex's exec_command reports it (about 1.5 kB)."""
    lines = [
        f"kernels/paged_mla/fp8.py:{turn * 40 + i}: scale = amax(block_{i}) / FP8_MAX  # tile {turn}"
        for i in range(24)
    ]
    head = f"Chunk ID: {turn:06x}\nWall time: 0.0{turn % 10} seconds\nProcess exited with code 0\nOutput:\n"
    return head + "\n".join(lines)


def agent(body: dict) -> tuple[str, dict] | None:
    """The fake model: a command to run (with the digest of the prompt it saw) until 19 ran, then text."""
    from testkit.gateway.prompt_cache import prompt_digest

    results = sum(
        isinstance(m.get("content"), list) and any(b.get("type") == "tool_result" for b in m["content"])
        for m in body["messages"]
    )
    if results >= TURNS - 1:
        return None
    cmd = f"sed -n {results * 40 + 1},{results * 40 + 40}p kernels/paged_mla/fp8.py"
    return "exec_command", {"cmd": cmd, "seen": prompt_digest(body)}


def _answer(events: bytes) -> dict:
    """The output item of a streamed Responses answer (its response.completed event)."""
    for block in events.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: ") and b'"response.completed"' in line:
                return json.loads(line[6:])["response"]["output"][-1]
    raise RuntimeError(f"no response.completed in the stream: {events[:300]!r}")


def _config(tmp: Path, base_url: str, caching: str) -> dict:
    return {
        "host": "127.0.0.1", "port": 0, "database_url": f"sqlite+aiosqlite:///{tmp / 'gw.db'}",
        "providers": {"anthropic": {"kind": "anthropic", "base_url": base_url}},
        "models": {MODEL: {"provider": "anthropic", "upstream_model": MODEL, "prompt_caching": caching}},
        "projects": {"bench": {"models": [MODEL], "default_task": "codex", "default_max_tokens": 2048}},
        "ledger_flush_interval_s": 0.05,
    }  # fmt: skip


async def _replay(url: str, key: str) -> list[str]:
    """The session's 20 turns as Codex sends them; each turn's answer (the command called, or the text)."""
    import aiohttp

    request, answers = session_start(), []
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as client:
        for turn in range(TURNS):
            async with client.post(url, json=request) as r:
                assert r.status == 200, (r.status, await r.text())
                item = _answer(await r.read())
            if item["type"] != "function_call":
                answers.append(item["content"][0]["text"])
                continue
            answers.append(f"{item['name']} {item['arguments']}")
            out = {"type": "function_call_output", "call_id": item["call_id"], "output": tool_output(turn)}
            request = {**request, "input": [*request["input"], item, out]}
    return answers


async def _run(caching: str) -> tuple[float, list[str], dict[str, int]]:
    """One replay through a gateway with ``prompt_caching: caching``: the cost, the answers, the tokens."""
    from sqlalchemy import select

    from benchmarks.gateway_bench import serve_in_process
    from gateway.http.app import GATEWAY
    from gateway.store.db import create_engine, ledger
    from testkit.gateway.fake_upstream import FakeUpstream
    from testkit.gateway.prompt_cache import PromptCache, prompt_digest

    fake = FakeUpstream(prompt_cache=PromptCache(min_tokens=1024))
    fake.agent = agent
    fake.reply = lambda body: f"Fixed the fp8 scale; the suite passes. (prompt {prompt_digest(body)})"
    await fake.start()
    tmp = Path(tempfile.mkdtemp(prefix="caching-bench-"))
    app, runner, port = await serve_in_process(_config(tmp, fake.base_url, caching), tmp)
    gw = app[GATEWAY]
    try:
        key, _ = await gw.keys.create("bench", "codex")
        answers = await _replay(f"http://127.0.0.1:{port}/v1/responses", key)
        await gw.ledger.flush()
        engine = create_engine(gw.settings.database_url)
        async with engine.connect() as conn:
            rows = [dict(r._mapping) for r in await conn.execute(select(ledger))]
        await engine.dispose()
    finally:
        await runner.cleanup()
        await fake.close()
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [r["status"] for r in rows]
    kinds = ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens")
    return sum(r["cost_usd"] for r in rows), answers, {k: sum(r[k] for r in rows) for k in kinds}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    without, answers_off, tokens_off = asyncio.run(_run("off"))
    with_, answers_on, tokens_on = asyncio.run(_run("auto"))
    saving = 1 - with_ / without
    same = answers_off == answers_on
    rows = (("none (prompt_caching: off)", without, tokens_off), ("automatic (auto)", with_, tokens_on))
    lines = [
        f"# Prompt caching: a {TURNS}-turn Codex session on {MODEL} through the gateway (issue 48)",
        "",
        f"Host {platform.node()}, {datetime.date.today()}; `python -m benchmarks caching`; the fake upstream",
        "plays Anthropic's prompt cache; cost from the ledger's cost_usd at the model's list prices.",
        "",
        "| breakpoints | cost (USD) | input tokens | cache reads | cache writes | output tokens |",
        "|---|---|---|---|---|---|",
        *(
            f"| {name} | {cost:.4f} | {t['input_tokens']:,} | {t['cached_input_tokens']:,} | "
            f"{t['cache_write_tokens']:,} | {t['output_tokens']:,} |"
            for name, cost, t in rows
        ),
        "",
        f"Cost with automatic breakpoints: {with_ / without:.1%} of the cost without ({saving:.1%} lower; "
        "target: at least 50% lower).",
        "Answers unchanged (every turn's command and the final text, each carrying the digest of the prompt "
        f"the model saw): {same}.",
    ]
    text = "\n".join(lines)
    print(text)
    out = ROOT / "benchmarks" / "results" / f"caching-{platform.node()}-{datetime.date.today():%Y%m%d}.md"
    out.write_text(text + "\n")
    print(f"(written to {out})")
    return {"cost_without_usd": without, "cost_with_usd": with_, "saving": saving, "answers_unchanged": same,
            "tokens_without": tokens_off, "tokens_with": tokens_on}  # fmt: skip
