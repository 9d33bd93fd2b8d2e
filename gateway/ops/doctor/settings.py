"""Reading the settings the chosen tool would use: the environment, Codex's ``config.toml``, Claude Code's
``settings.json``; each tool's reader returns what it found (``Resolved``) and adds a check for each fault
(a missing base URL, a wrong ``wire_api``, another tool's variables, two credentials at once)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path

from multidict import CIMultiDict

from gateway.ops.doctor.checks import Check, _fail, _pass, _warn
from gateway.ops.doctor.inputs import DoctorInput, Resolved
from gateway.ops.doctor.key import _KEY_RE, _what_key
from gateway.ops.onboarding import DEFAULT_KEY_ENV
from gateway.store.keys import credential_from_headers


def read_settings(inp: DoctorInput, checks: list[Check]) -> Resolved:
    """What the chosen tool would use, from its own settings; a check added for each fault found."""
    tool = inp.tool
    if tool == "codex":
        return _codex_settings(inp, checks)
    if tool == "claude-code":
        return _claude_settings(inp, checks)
    return _openai_settings(inp, checks)


def _authorization_in(headers: object, env: Mapping[str, str], from_env: bool = False) -> str | None:
    """The Authorization value in a header mapping (values are variable names when ``from_env``)."""
    if not isinstance(headers, dict):
        return None
    for name, value in headers.items():
        if str(name).lower() == "authorization":
            return env.get(str(value)) if from_env else str(value)
    return None


def _custom_headers(text: str | None) -> dict[str, str]:
    """Claude Code's ANTHROPIC_CUSTOM_HEADERS: one ``Name: value`` per line."""
    pairs = (line.split(":", 1) for line in (text or "").splitlines() if ":" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def _codex_path(inp: DoctorInput) -> Path:
    if inp.codex_config is not None:
        return inp.codex_config
    home = inp.env.get("CODEX_HOME")
    return Path(home) / "config.toml" if home else Path.home() / ".codex" / "config.toml"


def _claude_path(inp: DoctorInput) -> Path:
    return inp.claude_settings or Path.home() / ".claude" / "settings.json"


_ANTHROPIC_VARS = ("ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_API_KEY", "ANTHROPIC_MODEL")


def _codex_settings(inp: DoctorInput, checks: list[Check]) -> Resolved:
    path = _codex_path(inp)
    base = key_env = model = auth = None
    if path.exists():
        try:
            cfg = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            checks.append(_fail("codex config", f"{path} cannot be read as TOML ({e}).", "fix the syntax."))
            cfg = {}
        pid = cfg.get("model_provider")
        block = (cfg.get("model_providers") or {}).get(pid) if pid else None
        model = cfg.get("model")
        if cfg and not isinstance(block, dict):
            checks.append(
                _fail(
                    "codex config",
                    f"{path} has no [model_providers.{pid or '<id>'}] table for model_provider = {pid!r}, "
                    "so Codex talks to OpenAI directly, not to the gateway.",
                    f"run `farm gateway client-config --tool codex --project P --write {path} --force`.",
                )
            )
        elif isinstance(block, dict):
            base, key_env = block.get("base_url"), block.get("env_key")
            auth = _authorization_in(block.get("http_headers"), inp.env) or _authorization_in(
                block.get("env_http_headers"), inp.env, from_env=True
            )
            wire = block.get("wire_api")
            if wire != "responses":
                checks.append(
                    _fail(
                        "codex config",
                        f"[model_providers.{pid}] has wire_api = {wire!r}; Codex speaks only the Responses "
                        "API to this gateway.",
                        'set wire_api = "responses".',
                    )
                )
            elif not key_env:
                checks.append(
                    _fail(
                        "codex config",
                        f"[model_providers.{pid}] has no env_key, so Codex sends no key.",
                        f'add env_key = "{DEFAULT_KEY_ENV}" and export that variable.',
                    )
                )
            else:
                checks.append(_pass("codex config", f"{path}: provider {pid!r}, key from ${key_env}."))
    elif inp.base_url is None:
        checks.append(
            _warn(
                "codex config",
                f"no Codex config at {path}; checking the default gateway address instead.",
                f"run `farm gateway client-config --tool codex --project P --write {path}`.",
            )
        )
    key_env = inp.key_env or key_env or DEFAULT_KEY_ENV
    stray = [v for v in _ANTHROPIC_VARS if inp.env.get(v)]
    if stray:
        checks.append(
            _warn(
                "tool settings",
                f"{', '.join(stray)} set in this shell: those are Claude Code settings; Codex ignores them "
                f"and reads only base_url from config.toml and the key from ${key_env}.",
                "unset the ANTHROPIC_* variables if nothing in this shell uses them"
                + ("." if inp.env.get(key_env) else f'; export {key_env}="kf_..." for Codex.'),
            )
        )
    base_from = "--base-url" if inp.base_url else (f"{path}" if base else "default")
    return Resolved(
        inp.base_url or base or inp.default_base_url + "/v1",
        base_from,
        key_env,
        inp.env.get(key_env),
        inp.model or model,
        "--model" if inp.model else ("config.toml" if model else ""),
        auth,
    )


def _claude_settings(inp: DoctorInput, checks: list[Check]) -> Resolved:
    path = _claude_path(inp)
    file_env: dict[str, str] = {}
    if path.exists():
        try:
            data = json.loads(path.read_text())
            file_env = {k: str(v) for k, v in (data.get("env") or {}).items()}
        except (OSError, ValueError, AttributeError) as e:
            checks.append(_fail("claude settings", f"{path} is not valid JSON ({e}).", "fix the syntax."))

    def get(name: str) -> tuple[str | None, str]:
        if name in file_env:
            shell = inp.env.get(name)
            if shell is not None and shell != file_env[name] and name != "ANTHROPIC_AUTH_TOKEN":
                checks.append(
                    _warn(
                        "tool settings",
                        f"{name} differs between this shell and {path}; Claude Code uses the file's value.",
                        f"unset {name} in the shell or make them agree.",
                    )
                )
            return file_env[name], str(path)
        return inp.env.get(name), "shell"

    base, base_from = get("ANTHROPIC_BASE_URL")
    key_header, also = "authorization", None
    if inp.key_env:
        key_env, key = inp.key_env, inp.env.get(inp.key_env)
    else:
        key_env = "ANTHROPIC_AUTH_TOKEN"
        key, key_from = get(key_env)
        api_key, api_from = get("ANTHROPIC_API_KEY")
        if api_key and api_key.strip() and key and key.strip() and api_key.strip() != key.strip():
            key_env, key, key_header, also = _both_credentials(checks, key, key_from, api_key, api_from)
        elif api_key and not key:
            key_env, key, key_header = "ANTHROPIC_API_KEY", api_key, "x-api-key"
    model, model_from = get("ANTHROPIC_MODEL")
    if not base and inp.base_url is None:
        openai_base = inp.env.get("OPENAI_BASE_URL")
        checks.append(
            _fail(
                "tool settings",
                "ANTHROPIC_BASE_URL is not set (not in this shell, not in "
                f"{path}), so Claude Code goes to api.anthropic.com"
                + (
                    f"; OPENAI_BASE_URL={openai_base} is for openai-SDK scripts, not Claude Code."
                    if openai_base
                    else "."
                ),
                f"run `farm gateway client-config --tool claude-code --project P --write {path} --force`.",
            )
        )
    elif base:
        checks.append(_pass("tool settings", f"ANTHROPIC_BASE_URL from {base_from}, key from {key_env}."))
    return Resolved(
        inp.base_url or base or inp.default_base_url,
        "--base-url" if inp.base_url else (base_from if base else "default"),
        key_env,
        key,
        inp.model or model,
        "--model" if inp.model else model_from if model else "",
        _authorization_in(_custom_headers(get("ANTHROPIC_CUSTOM_HEADERS")[0]), inp.env),
        key_header,
        also,
    )


def _both_credentials(
    checks: list[Check], token: str, token_from: str, api_key: str, api_from: str
) -> tuple[str, str, str, tuple[str, str, str]]:
    """Claude Code sends ANTHROPIC_AUTH_TOKEN as 'Authorization: Bearer' and ANTHROPIC_API_KEY as
    'x-api-key', both when both are set. Which one the gateway uses
    (gateway.store.keys.credential_from_headers),
    and whether that can be what the user meant; returns (variable, key, header, the other header)."""
    t, a = token.strip(), api_key.strip()
    used = credential_from_headers(CIMultiDict({"Authorization": f"Bearer {t}", "x-api-key": a}))
    names = {
        "authorization": ("ANTHROPIC_AUTH_TOKEN", token, token_from),
        "x-api-key": ("ANTHROPIC_API_KEY", api_key, api_from),
    }
    var, value, _ = names[used.header or "authorization"]
    other_header = used.ignored or "x-api-key"
    other_var, other_value, other_from = names[other_header]

    def src(where: str) -> str:
        return "this shell" if where == "shell" else where

    where = src(other_from)
    both = (
        f"ANTHROPIC_AUTH_TOKEN (from {src(token_from)}) and ANTHROPIC_API_KEY (from {src(api_from)}) are set"
    )
    if _KEY_RE.match(t) and _KEY_RE.match(a):
        checks.append(
            _fail(
                "credentials",
                f"{both}, to two different gateway keys ({t[3:15]} and {a[3:15]}): Claude Code sends "
                f"both, as 'Authorization: Bearer' and 'x-api-key', and the gateway uses only {var} "
                f"(key {value.strip()[3:15]}), so its project, limits and budget apply whatever you meant.",
                f"keep one key: remove {other_var} from {where}.",
            )
        )
    elif _KEY_RE.match(value.strip()):
        checks.append(
            _warn(
                "credentials",
                f"{both}: Claude Code sends both headers; the gateway uses the gateway key in {var} and "
                f"ignores {other_var} ({_what_key(other_value.strip())}), which is still sent to the gateway "
                "with every request (it never forwards it).",
                f"remove {other_var} from {where} for Claude Code sessions that use the gateway.",
            )
        )
    return var, value, used.header or "authorization", (other_header, other_var, other_value.strip())


def _openai_settings(inp: DoctorInput, checks: list[Check]) -> Resolved:
    base = inp.env.get("OPENAI_BASE_URL")
    if not base and inp.base_url is None:
        checks.append(
            _fail(
                "tool settings",
                "OPENAI_BASE_URL is not set, so the openai SDK goes to api.openai.com, not the gateway.",
                '`eval "$(farm gateway client-config --tool openai-env --project P)"`.',
            )
        )
    elif base:
        checks.append(_pass("tool settings", "OPENAI_BASE_URL is set."))
    key_env = inp.key_env or "OPENAI_API_KEY"
    return Resolved(
        inp.base_url or base or inp.default_base_url + "/v1",
        "--base-url" if inp.base_url else ("OPENAI_BASE_URL" if base else "default"),
        key_env,
        inp.env.get(key_env),
        inp.model,
        "--model" if inp.model else "",
    )
