"""What the doctor is asked (``DoctorInput``: the tool, its environment, overrides from the command line)
and what it found the tool would use (``Resolved``: base URL, key, model, and where each came from)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gateway.config import ProjectConfig
from gateway.store.keys import KeyInfo

DoctorTool = Literal["claude-code", "codex", "openai-env"]
DOCTOR_TOOLS: tuple[DoctorTool, ...] = ("claude-code", "codex", "openai-env")
# A key's state as the gateway's own key store sees it (only with --config); None when unknown.
KeyLookup = Callable[[str], Awaitable[tuple[KeyInfo | None, ProjectConfig | None] | None]]


@dataclass
class DoctorInput:
    tool: DoctorTool = "openai-env"
    env: Mapping[str, str] = field(default_factory=dict)
    base_url: str | None = None  # --base-url; else the tool's own setting; else default_base_url
    default_base_url: str = "http://127.0.0.1:8787"
    key_env: str | None = None  # --key-env; else the variable the tool reads
    model: str | None = None  # --model; else the tool's configured model; else the first allowed one
    codex_config: Path | None = None
    claude_settings: Path | None = None
    connect_timeout_s: float = 3.0
    read_timeout_s: float = 30.0
    key_lookup: KeyLookup | None = None


@dataclass
class Resolved:
    """What the tool would use, and where each value came from."""

    base_url: str
    base_from: str
    key_env: str
    key: str | None
    model: str | None
    model_from: str
    auth_header: str | None = None  # a literal Authorization header the tool's settings add
    key_header: str = "authorization"  # where the tool sends ``key``: "authorization" | "x-api-key"
    # the other credential header the tool sends besides (Claude Code with both ANTHROPIC_AUTH_TOKEN and
    # ANTHROPIC_API_KEY set sends both): (header, variable, value)
    also: tuple[str, str, str] | None = None
