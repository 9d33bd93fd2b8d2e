"""The model's side of an agent's task, for the fake upstream (``FakeUpstream.agent``): ask for a file
through the client's own file-reading tool, then answer with what the tool returned. Used by the real-CLI
tests (tests/gateway/ops/test_real_agents.py) and the recorder of client shapes
(scripts/record_client_shapes.py).

Each client's file-reading tool and the arguments that read ``path`` with it: Claude Code's ``Read``, Codex's
``exec_command`` (a shell command) and the ``read_file`` function the SDK scripts define."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

READERS: dict[str, Callable[[str], dict]] = {
    "Read": lambda path: {"file_path": path},  # Claude Code
    "exec_command": lambda path: {"cmd": f"cat {path}"},  # Codex
    "read_file": lambda path: {"path": path},  # the SDK scripts' tool
}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or p.get("output") or "" for p in content or [] if isinstance(p, dict))


def tool_result(body: dict) -> str | None:
    """The text of the tool result the conversation ends with (chat, Responses or Anthropic), or None."""
    items = body.get("messages") or body.get("input") or [{}]
    last = items[-1] if isinstance(items, list) and items else {}
    if not isinstance(last, dict):
        return None
    if last.get("role") == "tool":  # chat
        return _text(last.get("content"))
    if last.get("type") == "function_call_output":  # Responses
        out = last.get("output")
        return out if isinstance(out, str) else _text(out)
    content = last.get("content")
    for block in content if isinstance(content, list) else []:  # Anthropic
        if isinstance(block, dict) and block.get("type") == "tool_result":
            return _text(block.get("content"))
    return None


def _tool_names(tools: object) -> set[str]:
    names: set[str] = set()
    for t in tools if isinstance(tools, list) else []:
        if not isinstance(t, dict):
            continue
        names.add(t.get("function", t).get("name"))
        names |= _tool_names(t.get("tools"))  # a Codex namespace's own tools
    return names


def play_model(path: Path):
    """-> (FakeUpstream.agent, FakeUpstream.reply) for the task of reading ``path``: a request that names
    the path and has no tool result yet gets a call of the client's file-reading tool; any other request
    (the answer after the tool ran, a title or summary the client asks for) gets text, the tool's result
    when there is one."""

    def agent(body: dict) -> tuple[str, dict] | None:
        if tool_result(body) is not None:
            return None
        if str(path) not in json.dumps(body.get("messages") or body.get("input")):
            return None  # not the task: text
        names = _tool_names(body.get("tools"))
        for name, args in READERS.items():
            if name in names:
                return name, args(str(path))
        raise AssertionError(f"no file-reading tool among {sorted(n for n in names if n)}")

    def reply(body: dict) -> str:
        result = tool_result(body)
        return f"The file says: {result}" if result is not None else "ok"

    return agent, reply
