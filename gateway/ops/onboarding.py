"""Client configs for the gateway: Claude Code, Codex CLI, CC Switch and shell exports for the openai SDK.

Each generator returns the file's text. The key appears only as a placeholder or an environment reference
unless a real key is passed (``farm gateway client-config --reveal`` reads it from ``--key-env``).
``write_config`` writes a file safely: never over an existing one without ``force``, always keeping a
backup, merging into an existing Claude Code ``settings.json`` or Codex ``config.toml``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import tomllib
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal
from urllib.parse import urlencode

from gateway.config import GatewaySettings

Tool = Literal["claude-code", "codex", "cc-switch", "openai-env"]
TOOLS: tuple[Tool, ...] = ("claude-code", "codex", "cc-switch", "openai-env")
DEFAULT_KEY_ENV = "FARM_GATEWAY_KEY"
CODEX_PROVIDER_ID = "farm"
_SMALL_HINTS = ("haiku", "mini", "small", "fast", "nano", "flash")


class OnboardingError(Exception):
    """A config cannot be made or written; the message says why and what to do."""


def placeholder(key_env: str) -> str:
    """What stands in for the key in a file that cannot reference an environment variable."""
    return f"<key from ${key_env}: farm gateway keys create>"


def is_placeholder(value: str) -> bool:
    return value.startswith("<") and value.endswith(">")


# --- base URLs ------------------------------------------------------------------------------------------


def root_url(url: str) -> str:
    """The gateway's root URL: no trailing slash, no ``/v1``."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def default_base_url(settings: GatewaySettings) -> str:
    host = settings.host
    if host in ("0.0.0.0", "::", ""):  # a wildcard bind: this machine's loopback works locally
        host = "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


# --- the project's models -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectModels:
    project: str
    anthropic: list[str]  # models served by an Anthropic provider, in the project's order
    openai: list[str]  # models served by an OpenAI-compatible provider

    def claude_pair(self) -> tuple[str, str]:
        """(main, small/fast) for Claude Code: Anthropic models first; a project with none gets its OpenAI
        ones, which the gateway reaches by translating Messages to chat completions."""
        models = self.anthropic or self.openai
        return models[0], _pick_small(models)

    def codex_model(self) -> str:
        """Codex's model: an OpenAI one first (one named like codex preferred); a project with none gets an
        Anthropic one, which the gateway reaches by translating Responses to Messages."""
        models = self.openai or self.anthropic
        return next((m for m in models if "codex" in m), models[0])

    def translated(self, tool: str) -> list[str]:
        """The project's models that ``tool`` reaches only through the gateway's wire-format translation
        (Claude Code speaks Messages; Codex, CC Switch's codex app and the openai SDK speak OpenAI)."""
        return list(self.openai if tool == "claude-code" else self.anthropic)


def _pick_small(models: list[str]) -> str:
    rest = models[1:]
    return next((m for m in rest if any(h in m for h in _SMALL_HINTS)), rest[-1] if rest else models[0])


def project_models(settings: GatewaySettings, project: str) -> ProjectModels:
    cfg = settings.projects.get(project)
    if cfg is None:
        known = ", ".join(sorted(settings.projects)) or "none"
        raise OnboardingError(f"unknown project {project!r} (configured: {known})")
    anthropic, openai = [], []
    for m in cfg.models:
        kind = settings.providers[settings.models[m].provider].kind
        (anthropic if kind == "anthropic" else openai).append(m)
    return ProjectModels(project, anthropic, openai)


# --- generators -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigRequest:
    tool: Tool
    models: ProjectModels
    base_url: str  # root or /v1, either works
    key_env: str = DEFAULT_KEY_ENV
    key: str | None = None  # the real key, only with --reveal


def claude_env(req: ConfigRequest) -> dict[str, str]:
    main, small = req.models.claude_pair()
    return {
        "ANTHROPIC_BASE_URL": root_url(req.base_url),
        "ANTHROPIC_AUTH_TOKEN": req.key or placeholder(req.key_env),
        "ANTHROPIC_MODEL": main,
        "ANTHROPIC_SMALL_FAST_MODEL": small,
    }


def claude_settings(req: ConfigRequest, existing: dict | None = None) -> tuple[dict, list[str]]:
    """The settings.json object (merged into ``existing``) and notes for the user."""
    notes: list[str] = []
    settings = dict(existing or {})
    env = settings.get("env") or {}
    if not isinstance(env, dict):
        raise OnboardingError('settings.json: "env" is not an object; fix it by hand first')
    env = dict(env)
    ours = claude_env(req)
    old_token = env.get("ANTHROPIC_AUTH_TOKEN")
    if req.key is None and isinstance(old_token, str) and old_token and not is_placeholder(old_token):
        ours["ANTHROPIC_AUTH_TOKEN"] = old_token
        notes.append("kept the existing ANTHROPIC_AUTH_TOKEN (use --reveal to replace it)")
    if "ANTHROPIC_API_KEY" in env:
        notes.append(
            "settings.json also sets ANTHROPIC_API_KEY: Claude Code then sends it as x-api-key, which the "
            "gateway reads before the Bearer token; remove it unless it holds the same gateway key"
        )
    env.update(ours)
    settings["env"] = env
    return settings, notes


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def codex_block(req: ConfigRequest) -> dict[str, str]:
    return {
        "name": f"KernelFarm gateway ({req.models.project})",
        "base_url": root_url(req.base_url) + "/v1",
        "env_key": req.key_env,
        "wire_api": "responses",
    }


def codex_toml(req: ConfigRequest) -> str:
    block = codex_block(req)
    lines = [
        f"model = {_toml_str(req.models.codex_model())}",
        f"model_provider = {_toml_str(CODEX_PROVIDER_ID)}",
        "",
        f"# KernelFarm gateway, project {req.models.project}; Codex reads the key from ${req.key_env}",
        f"[model_providers.{CODEX_PROVIDER_ID}]",
        *(f"{k} = {_toml_str(v)}" for k, v in block.items()),
    ]
    return "\n".join(lines) + "\n"


_HEADER = re.compile(r"^\s*\[")
_TOP_KEYS = re.compile(r"^\s*(model|model_provider)\s*=")


def merge_codex_toml(req: ConfigRequest, existing: str) -> str:
    """Replace the top-level ``model``/``model_provider`` and our provider table, keep everything else."""
    lines = existing.splitlines()
    first_table = next((i for i, ln in enumerate(lines) if _HEADER.match(ln)), len(lines))
    top = [ln for ln in lines[:first_table] if not _TOP_KEYS.match(ln)]
    tables: list[str] = []
    skipping = False
    ours = re.compile(rf"^\s*\[\s*model_providers\s*\.\s*\"?{CODEX_PROVIDER_ID}\"?\s*\]\s*(#.*)?$")
    for ln in lines[first_table:]:
        if _HEADER.match(ln):
            skipping = bool(ours.match(ln))
        if not skipping:
            tables.append(ln)
    fresh = codex_toml(req).splitlines()
    head, block = fresh[:2], fresh[2:]
    merged = "\n".join([*head, *top, *tables, *block]).rstrip("\n") + "\n"
    try:
        data = tomllib.loads(merged)
        ok = data.get("model_provider") == CODEX_PROVIDER_ID and data["model_providers"][
            CODEX_PROVIDER_ID
        ] == codex_block(req)
    except (tomllib.TOMLDecodeError, KeyError, TypeError):
        ok = False
    if not ok:
        raise OnboardingError(
            "could not merge into the existing config.toml (an unusual layout); write to another path and "
            "copy the [model_providers.farm] table over by hand"
        )
    return merged


def cc_switch_profiles(req: ConfigRequest) -> dict:
    """A CC Switch provider profile for Claude Code and one for Codex, each with its import deep link (each
    tool reaches every model, those of the other wire format through the gateway's translation)."""
    profiles = []
    key = req.key or placeholder(req.key_env)
    name = f"KernelFarm {req.models.project}"
    # every project: Claude Code reaches OpenAI models through translation
    main, small = req.models.claude_pair()
    profiles.append(
        {
            "app": "claude",
            "name": name,
            "base_url": root_url(req.base_url),
            "api_key": key,
            "model": main,
            "haiku_model": small,
        }
    )
    # and Codex reaches Anthropic models the same way
    profiles.append(
        {
            "app": "codex",
            "name": name,
            "base_url": root_url(req.base_url) + "/v1",
            "api_key": key,
            "model": req.models.codex_model(),
        }
    )
    for p in profiles:
        query = {"resource": "provider", "app": p["app"], "name": p["name"], "endpoint": p["base_url"]}
        if req.key:
            query["apiKey"] = req.key
        query["model"] = p["model"]
        if "haiku_model" in p:
            query["haikuModel"] = p["haiku_model"]
        p["import_url"] = "ccswitch://v1/import?" + urlencode(query)
    return {"project": req.models.project, "profiles": profiles}


def openai_env(req: ConfigRequest) -> str:
    key = shlex.quote(req.key) if req.key else f'"${{{req.key_env}}}"'
    models = ", ".join(req.models.openai + req.models.anthropic)
    return (
        f"# KernelFarm gateway, project {req.models.project}: for scripts on the openai SDK (source this)\n"
        f"# models: {models}\n"
        f'export OPENAI_BASE_URL="{root_url(req.base_url)}/v1"\n'
        f"export OPENAI_API_KEY={key}\n"
    )


def render(req: ConfigRequest) -> str:
    """The file's text as printed (no merge)."""
    if req.tool == "claude-code":
        return json.dumps(claude_settings(req)[0], indent=2) + "\n"
    if req.tool == "codex":
        return codex_toml(req)
    if req.tool == "cc-switch":
        return json.dumps(cc_switch_profiles(req), indent=2) + "\n"
    return openai_env(req)


# --- writing --------------------------------------------------------------------------------------------


def backup_path(path: Path) -> Path:
    bak = path.with_name(path.name + ".bak")
    if not bak.exists():
        return bak
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return path.with_name(f"{path.name}.{stamp}.bak")


def _merged_text(req: ConfigRequest, path: Path) -> tuple[str, list[str]]:
    if not path.exists():
        return render(req), []
    text = path.read_text()
    if req.tool == "claude-code":
        try:
            existing = json.loads(text) if text.strip() else {}
        except ValueError as e:
            raise OnboardingError(f"{path} is not valid JSON ({e}); fix or move it first") from None
        if not isinstance(existing, dict):
            raise OnboardingError(f"{path}: the top level is not a JSON object; fix or move it first")
        merged, notes = claude_settings(req, existing)
        return json.dumps(merged, indent=2) + "\n", notes
    if req.tool == "codex":
        return merge_codex_toml(req, text), []
    return render(req), []


def write_config(req: ConfigRequest, path: Path, *, force: bool = False) -> tuple[Path | None, list[str]]:
    """Write (merging where the format allows); returns (the backup made, notes)."""
    path = path.expanduser()
    if path.is_dir():
        raise OnboardingError(f"{path} is a directory; give the file's path")
    if path.exists() and not force:
        raise OnboardingError(f"{path} exists; add --force to update it (a backup is kept)")
    text, notes = _merged_text(req, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    backup = None
    if path.exists():
        backup = backup_path(path)
        shutil.copy2(path, backup)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        if req.key is not None or (backup is not None and backup.stat().st_mode & 0o077 == 0):
            os.chmod(tmp, 0o600)
        elif backup is not None:
            os.chmod(tmp, backup.stat().st_mode & 0o777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return backup, notes
