"""Record what real clients send: the request bodies of one tool-using task per client, for the conformance
suite (tests/gateway/conformance/) and `farm gateway doctor` (gateway/ops/client_shapes/, whose README says
when and how to refresh them).

Each client runs against the fake upstream (testkit.gateway.fake_upstream, a real HTTP server on
127.0.0.1 speaking the client's own wire format, no gateway between) which plays the model of
testkit.gateway.agents: it asks for a file through the client's file-reading tool, then answers with its
content. The two requests of that task (the first, and the one carrying the tool's result) are written to
gateway/ops/client_shapes/<client>.json, with long strings shortened (the shapes matter, not
Claude Code's 20 kB system prompt) and the run's temporary paths replaced by /work.

    .venv/bin/python scripts/record_client_shapes.py                 # every client
    .venv/bin/python scripts/record_client_shapes.py codex anthropic  # some

Needs the CLIs of `make deps-agents` (.agents/) and, for the OpenAI Agents SDK, `pip install
openai-agents` in the venv (a recording-only dependency: the suite replays the files without it).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from testkit.gateway.agents import play_model  # noqa: E402
from testkit.gateway.fake_upstream import FakeUpstream  # noqa: E402

OUT = ROOT / "gateway" / "ops" / "client_shapes"
BIN = ROOT / ".agents" / "node_modules" / ".bin"
CONTENT = "KernelFarm conformance 4242"
MAX_STRING = 240  # longer strings are cut to this, with a note of how much was cut
READ_FILE = {
    "name": "read_file",
    "description": "Read a text file and return its content.",
    "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "absolute path"}},
        "required": ["path"],
        "additionalProperties": False,
    },
}
SYSTEM = "You are a careful assistant. Use the tools to read files."


def shorten(obj: object, work: str) -> object:
    """The body with the run's directory replaced by /work and long strings cut (their shape kept)."""
    if isinstance(obj, dict):
        return {k: shorten(v, work) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shorten(v, work) for v in obj]
    if isinstance(obj, str):
        s = obj.replace(work, "/work")
        if len(s) > MAX_STRING and not _is_json(s):
            s = s[:MAX_STRING] + f" [... {len(s) - MAX_STRING} characters cut]"
        return s
    return obj


def _is_json(s: str) -> bool:  # tool arguments stay whole: they must still parse
    try:
        json.loads(s)
    except ValueError:
        return False
    return True


# ----------------------------------------------------------------------------------------- the clients


def _env(home: Path) -> dict[str, str]:
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR")
    return {k: os.environ[k] for k in keep if k in os.environ} | {"HOME": str(home)}


def _npm_version(package: str) -> str:
    manifest = ROOT / ".agents" / "node_modules" / package / "package.json"
    return json.loads(manifest.read_text())["version"]


async def _cli(cmd: list[str], env: dict[str, str], cwd: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 300)
    if proc.returncode != 0 or CONTENT not in out.decode(errors="replace"):
        raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}): {out.decode(errors='replace')[-2000:]}")


async def claude_code(fake: FakeUpstream, work: Path) -> str:
    env = _env(work.parent) | {
        "ANTHROPIC_BASE_URL": fake.base_url.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": "sk-recording",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    prompt = f"Read the file {work / 'a.txt'} and print its content"
    await _cli([str(BIN / "claude"), "-p", prompt, "--model", "claude-recorded", "--allowedTools", "Read"],
               env, work)  # fmt: skip
    return _npm_version("@anthropic-ai/claude-code")


async def codex(fake: FakeUpstream, work: Path) -> str:
    home = work.parent / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "gpt-recorded"\nmodel_provider = "fake"\n\n[model_providers.fake]\nname = "fake"\n'
        f'base_url = "{fake.base_url}"\nenv_key = "FAKE_KEY"\nwire_api = "responses"\n'
    )
    env = _env(work.parent) | {"CODEX_HOME": str(home), "FAKE_KEY": "sk-recording"}
    prompt = f"Read the file {work / 'a.txt'} and print its content"
    await _cli([str(BIN / "codex"), "exec", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", prompt], env, work)  # fmt: skip
    return _npm_version("@openai/codex")


def _read(path: str) -> str:
    return Path(path).read_text()


async def openai_chat(fake: FakeUpstream, work: Path) -> str:
    import openai

    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-recording")
    messages: list[dict] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Read the file {work / 'a.txt'} and print its content"},
    ]
    tools = [{"type": "function", "function": {**READ_FILE, "strict": True}}]
    for _ in range(2):
        stream = await client.chat.completions.create(
            model="gpt-recorded", messages=messages, tools=tools, stream=True,
            stream_options={"include_usage": True}, max_completion_tokens=512, temperature=0.2,
        )  # fmt: skip
        calls: dict[int, dict] = {}
        async for chunk in stream:
            for choice in chunk.choices:
                for tc in choice.delta.tool_calls or []:
                    c = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
                    c["name"] += tc.function.name or ""
                    c["arguments"] += tc.function.arguments or ""
        if not calls:
            break
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls.values()]})  # fmt: skip
        for c in calls.values():
            content = _read(json.loads(c["arguments"])["path"])
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": content})
    return openai.__version__


async def openai_responses(fake: FakeUpstream, work: Path) -> str:
    import openai

    client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-recording")
    items: list = [{"role": "user", "content": f"Read the file {work / 'a.txt'} and print its content"}]
    tools = [{"type": "function", **READ_FILE, "strict": True}]
    for _ in range(2):
        resp = await client.responses.create(
            model="gpt-recorded", instructions=SYSTEM, input=items, tools=tools, store=False,
            max_output_tokens=512,
        )  # fmt: skip
        calls = [o for o in resp.output if o.type == "function_call"]
        if not calls:
            break
        for c in calls:
            items.append({"type": "function_call", "call_id": c.call_id, "name": c.name,
                          "arguments": c.arguments})  # fmt: skip
            items.append({"type": "function_call_output", "call_id": c.call_id,
                          "output": _read(json.loads(c.arguments)["path"])})  # fmt: skip
    return openai.__version__


async def anthropic_sdk(fake: FakeUpstream, work: Path) -> str:
    import anthropic

    client = anthropic.AsyncAnthropic(base_url=fake.base_url.removesuffix("/v1"), api_key="sk-recording")
    messages: list[dict] = [
        {"role": "user", "content": f"Read the file {work / 'a.txt'} and print its content"}
    ]
    tool = {"name": READ_FILE["name"], "description": READ_FILE["description"],
            "input_schema": READ_FILE["parameters"]}  # fmt: skip
    for _ in range(2):
        async with client.messages.stream(
            model="claude-recorded", system=SYSTEM, messages=messages, tools=[tool], max_tokens=512,
        ) as stream:  # fmt: skip
            final = await stream.get_final_message()
        uses = [b for b in final.content if b.type == "tool_use"]
        if not uses:
            break
        said = [b.model_dump(exclude_none=True) for b in final.content]
        messages.append({"role": "assistant", "content": said})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u.id, "content": _read(u.input["path"])}
                    for u in uses
                ],
            }
        )
    return anthropic.__version__


def _agents_sdk(use_chat: bool) -> Callable[[FakeUpstream, Path], Awaitable[str]]:
    async def run(fake: FakeUpstream, work: Path) -> str:
        import openai
        from agents import (
            Agent,
            OpenAIChatCompletionsModel,
            OpenAIResponsesModel,
            Runner,
            function_tool,
            set_tracing_disabled,
        )

        set_tracing_disabled(True)

        @function_tool
        def read_file(path: str) -> str:
            """Read a text file and return its content.

            Args:
                path: absolute path
            """
            return _read(path)

        client = openai.AsyncOpenAI(base_url=fake.base_url, api_key="sk-recording")
        kind = OpenAIChatCompletionsModel if use_chat else OpenAIResponsesModel
        agent = Agent(name="reader", instructions=SYSTEM, tools=[read_file],
                      model=kind(model="gpt-recorded", openai_client=client))  # fmt: skip
        await Runner.run(agent, f"Read the file {work / 'a.txt'} and print its content")
        return version("openai-agents")

    return run


# client -> (its wire format, the fake's path it calls, how to run its task)
CLIENTS: dict[str, tuple[str, str, Callable[[FakeUpstream, Path], Awaitable[str]]]] = {
    "claude-code": ("messages", "/v1/messages", claude_code),
    "codex": ("responses", "/v1/responses", codex),
    "openai-chat": ("chat", "/v1/chat/completions", openai_chat),
    "openai-responses": ("responses", "/v1/responses", openai_responses),
    "anthropic": ("messages", "/v1/messages", anthropic_sdk),
    "openai-agents": ("responses", "/v1/responses", _agents_sdk(use_chat=False)),
    "openai-agents-chat": ("chat", "/v1/chat/completions", _agents_sdk(use_chat=True)),
}


async def record(name: str) -> Path:
    fmt, path, run = CLIENTS[name]
    with tempfile.TemporaryDirectory(prefix="farm-record-") as tmp:
        work = Path(tmp) / "work"
        work.mkdir()
        (work / "a.txt").write_text(CONTENT + "\n")
        fake = FakeUpstream()
        fake.agent, fake.reply = play_model(work / "a.txt")
        await fake.start()
        try:
            client_version = await run(fake, work)
        finally:
            await fake.close()
        # the task's requests: those with tools (a CLI's side requests, titles or quota checks, have none)
        task = [s.body for s in fake.seen if s.path == path and s.body.get("tools")]
        if len(task) < 2:
            raise RuntimeError(f"{name}: {len(task)} requests with tools recorded, expected the task's 2")
        doc = {
            "client": name,
            "version": client_version,
            "format": fmt,
            "recorded": datetime.date.today().isoformat(),
            "requests": [shorten(b, str(work)) for b in task[:2]],
        }
    out = OUT / f"{name}.json"
    out.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return out


async def main(names: list[str]) -> None:
    unknown = sorted(set(names) - set(CLIENTS))
    if unknown:
        raise SystemExit(f"unknown client(s) {unknown}; known: {', '.join(CLIENTS)}")
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names or list(CLIENTS):
        print(f"{name}: {(await record(name)).relative_to(ROOT)}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
