"""Codex's namespace tools (OpenAI Responses): a ``{"type": "namespace", "name": NS, "tools": [...]}`` tool
groups function tools, and the model calls one by its name and namespace (a ``function_call`` item with
``"namespace": NS``). The other formats have flat tool names, so a namespaced tool travels as one function
named ``NS__NAME`` (both parts are valid tool-name characters), and a call of that name comes back to the
Responses client split again, by the names its own request declared."""

from __future__ import annotations

from collections.abc import Mapping

SEP = "__"


def flat_name(namespace: str, name: str) -> str:
    return f"{namespace}{SEP}{name}"


def tool_names(body: object) -> dict[str, tuple[str, str]]:
    """The flat names of a Responses request's namespaced function tools -> (namespace, name)."""
    out: dict[str, tuple[str, str]] = {}
    tools = body.get("tools") if isinstance(body, dict) else None
    for t in tools if isinstance(tools, list) else ():
        if isinstance(t, dict) and t.get("type") == "namespace" and isinstance(t.get("name"), str):
            for sub in t.get("tools") or ():
                if isinstance(sub, dict) and isinstance(sub.get("name"), str):
                    out[flat_name(t["name"], sub["name"])] = (t["name"], sub["name"])
    return out


def split(name: str, names: Mapping[str, tuple[str, str]] | None) -> tuple[str | None, str]:
    """(namespace, name) of a called tool as the client declared it; (None, name) for a flat one."""
    if names:
        hit = names.get(name)
        if hit is not None:
            return hit
    return None, name
