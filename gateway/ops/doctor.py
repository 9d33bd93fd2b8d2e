"""``farm gateway doctor``: find why a client cannot use the gateway, and say how to fix it.

It reads the settings the chosen tool would use (environment, Codex ``config.toml``, Claude Code
``settings.json``), checks the key locally, then runs two cheap probes exactly as the tool would: GET the
model list and one request with the smallest output (``max_tokens=1``; Responses ``max_output_tokens=16``,
the least OpenAI accepts). Every result becomes one line: PASS, WARN or FAIL, the cause in plain words and
the fix. Any FAIL makes the command exit non-zero.

Translation: the gateway serves any model to any tool, translating between wire formats when the model's
provider speaks another one (it then answers with ``x-farm-translation: messages->chat``). Without a
configured model the doctor calls the allowed models in order until one answers in the tool's own format
(the "model call" line), and checks the translation path with one tiny call to a model the tool reaches
through translation (the "translation" line: which model, which translation), when the project has one.
"""

from __future__ import annotations

import errno
import json
import re
import time
import tomllib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import aiohttp
from multidict import CIMultiDict

from gateway.config import GatewaySettings, ProjectConfig
from gateway.ops.onboarding import DEFAULT_KEY_ENV, is_placeholder, root_url
from gateway.store.db import create_engine
from gateway.store.keys import KEY_RE, KeyInfo, KeyStore, credential_from_headers, utcnow

Status = Literal["PASS", "WARN", "FAIL"]
DoctorTool = Literal["claude-code", "codex", "openai-env"]
DOCTOR_TOOLS: tuple[DoctorTool, ...] = ("claude-code", "codex", "openai-env")
ANTHROPIC_VERSION = "2023-06-01"
ASSUMED_CALL_S = 20.0  # a typical agent call, for turning rpm into a concurrency
_KEY_RE = KEY_RE
# A key's state as the gateway's own key store sees it (only with --config); None when unknown.
KeyLookup = Callable[[str], Awaitable[tuple[KeyInfo | None, ProjectConfig | None] | None]]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status}  {self.name}: {self.message}"
        return f"{text} Fix: {self.fix}" if self.fix else text


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


def _fail(name: str, message: str, fix: str = "") -> Check:
    return Check(name, "FAIL", message, fix)


def _warn(name: str, message: str, fix: str = "") -> Check:
    return Check(name, "WARN", message, fix)


def _pass(name: str, message: str) -> Check:
    return Check(name, "PASS", message)


# --- the tool's settings --------------------------------------------------------------------------------


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


def _what_key(value: str) -> str:
    if _KEY_RE.match(value):
        return f"gateway key {value[3:15]}"
    if value.startswith("sk-ant-"):
        return "an Anthropic key (sk-ant-...)"
    return "an OpenAI key (sk-...)" if value.startswith("sk-") else "something that is not a gateway key"


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


# --- the key, locally -----------------------------------------------------------------------------------


def check_key(r: Resolved) -> tuple[Check, str | None]:
    """The local verdict on the key, and the key to probe with (cleaned when the fault is only cosmetic)."""
    name, var, key = "key", r.key_env, r.key
    if key is None:
        return _fail(
            name,
            f"${var} is not set in this shell (a variable exported in another terminal, or added to a "
            "shell rc file that this shell has not re-read, is not visible here).",
            f'export {var}="kf_..." in this shell (or `source ~/.bashrc`); new key: '
            "`farm gateway keys create --project P`.",
        ), None
    if not key.strip():
        return _fail(name, f"${var} is set but empty.", f'export {var}="kf_..."'), None
    if is_placeholder(key.strip()):
        return _fail(
            name, f"${var} still holds the placeholder {key.strip()!r}.", "put the real key there."
        ), None
    clean = key.strip()
    if clean.lower().startswith("bearer "):
        return _fail(
            name,
            f"${var} starts with 'Bearer ': the tool adds that prefix itself, so it would send "
            "'Bearer Bearer kf_...'.",
            f'store the key alone: export {var}="{clean[7:].strip()[:16]}...".',
        ), clean[7:].strip()
    if key != clean or re.search(r"\s", clean):
        where = "a newline" if "\n" in key or "\r" in key else "whitespace"
        return _fail(
            name,
            f"${var} contains {where} (a copy-paste that took the line break, or `echo` into a file): "
            "HTTP clients refuse such a header or send a key that never matches.",
            f'export {var}="$(printf %s "${var}" | tr -d \'[:space:]\')"',
        ), re.sub(r"\s", "", key)
    if not _KEY_RE.match(clean):
        what = (
            "an Anthropic key"
            if clean.startswith("sk-ant-")
            else "an OpenAI key"
            if clean.startswith("sk-")
            else "something that is not a gateway key"
        )
        return _fail(
            name,
            f"${var} holds {what} ({clean[:7]}...); the gateway accepts only its own keys, kf_<id>_<secret>.",
            "`farm gateway keys create --project P` and export that.",
        ), clean
    return _pass(name, f"${var} holds a well-formed gateway key (id {clean[3:15]})."), clean


# --- HTTP probes ----------------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: Mapping[str, str]
    text: str
    elapsed_ms: float

    def json(self) -> dict:
        try:
            data = json.loads(self.text)
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def is_html(self) -> bool:
        ctype = self.headers.get("Content-Type", "")
        head = self.text.lstrip()[:15].lower()
        return "text/html" in ctype or head.startswith(("<!doctype", "<html"))

    def error(self) -> tuple[str, str]:
        """(code or type, message) from an OpenAI- or Anthropic-shaped error body."""
        err = self.json().get("error")
        if not isinstance(err, dict):
            return "", self.text[:200]
        return str(err.get("code") or err.get("type") or ""), str(err.get("message", ""))


class ProbeFailed(Exception):
    """The probe got no HTTP answer; ``check`` explains."""

    def __init__(self, check: Check) -> None:
        super().__init__(check.message)
        self.check = check


class Prober:
    def __init__(self, session: aiohttp.ClientSession, inp: DoctorInput) -> None:
        self.session = session
        self.inp = inp

    async def request(
        self, name: str, method: str, url: str, headers: dict, body: dict | None = None
    ) -> Reply:
        t0 = time.monotonic()
        try:
            async with self.session.request(method, url, headers=headers, json=body) as resp:
                text = await resp.text(errors="replace")
                return Reply(resp.status, resp.headers, text, (time.monotonic() - t0) * 1000)
        except aiohttp.ClientConnectorDNSError as e:
            raise ProbeFailed(
                _fail(
                    name,
                    f"the host in {url} does not resolve ({e.os_error}).",
                    "check the spelling of the host name, or your VPN/DNS.",
                )
            ) from None
        except (aiohttp.ConnectionTimeoutError, aiohttp.ServerTimeoutError) as e:
            if isinstance(e, aiohttp.ConnectionTimeoutError) or "connect" in str(e).lower():
                raise ProbeFailed(
                    _fail(
                        name,
                        f"no TCP connection to {_hostport(url)} within {self.inp.connect_timeout_s:g} s: the "
                        "host is down, a firewall drops the packets, or you need the VPN.",
                        "check the host and port; from another machine the gateway must listen on a "
                        "reachable address (host: 0.0.0.0 in its config).",
                    )
                ) from None
            raise ProbeFailed(_read_timeout(name, url, self.inp.read_timeout_s)) from None
        except TimeoutError:
            raise ProbeFailed(_read_timeout(name, url, self.inp.read_timeout_s)) from None
        except aiohttp.ClientConnectorError as e:
            refused = e.os_error.errno == errno.ECONNREFUSED or isinstance(e.os_error, ConnectionRefusedError)
            why = "nothing is listening there" if refused else "the network has no route to it (VPN?)"
            raise ProbeFailed(
                _fail(
                    name,
                    f"cannot connect to {_hostport(url)} ({e.os_error.strerror or e.os_error}): {why}.",
                    "start the gateway (`farm gateway serve`) or correct the host/port in the base URL.",
                )
            ) from None
        except aiohttp.ClientError as e:
            raise ProbeFailed(
                _fail(name, f"the request to {url} failed: {e!r}.", "check the base URL.")
            ) from None


def _hostport(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0]


TIMEOUT_FIX = (
    "for real work: lower max_tokens, split the task into smaller requests, or stream (a stream sends "
    "tokens as they come, so there is no long silence); raise the client's timeout if the answer is big."
)


def _read_timeout(name: str, url: str, seconds: float) -> Check:
    return _fail(
        name, f"connected, but {url} sent no answer within {seconds:g} s (read timeout).", TIMEOUT_FIX
    )


# --- the doctor -----------------------------------------------------------------------------------------


class Doctor:
    def __init__(self, inp: DoctorInput) -> None:
        self.inp = inp
        self.checks: list[Check] = []
        self.anthropic_style = inp.tool == "claude-code"
        self.auth_header: str | None = None
        self.resolved: Resolved | None = None

    def add(self, check: Check) -> Check:
        self.checks.append(check)
        return check

    def resolve(self) -> Resolved:
        tool = self.inp.tool
        if tool == "codex":
            return _codex_settings(self.inp, self.checks)
        if tool == "claude-code":
            return _claude_settings(self.inp, self.checks)
        return _openai_settings(self.inp, self.checks)

    def headers(self, key: str) -> dict[str, str]:
        """The headers the tool sends: the key in its header, and any other credential header besides."""
        r = self.resolved
        h: dict[str, str] = {}
        if r is not None and r.also is not None:
            other, _, value = r.also
            h["x-api-key" if other == "x-api-key" else "Authorization"] = (
                value if other == "x-api-key" else self.auth_header or f"Bearer {value}"
            )
        if r is not None and r.key_header == "x-api-key":
            h["x-api-key"] = key
        else:
            h["Authorization"] = self.auth_header or f"Bearer {key}"
        if self.anthropic_style:
            h["anthropic-version"] = ANTHROPIC_VERSION
        return h

    def models_url(self, base: str) -> str:
        """Where the tool's SDK sends GET models: the Anthropic SDK adds /v1, the openai SDK does not."""
        return base.rstrip("/") + ("/v1/models" if self.anthropic_style else "/models")

    async def run(self) -> list[Check]:
        r = self.resolve()
        self.resolved = r
        self.auth_header = r.auth_header
        key_check, key = check_key(r)
        self.add(key_check)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.inp.connect_timeout_s, sock_read=self.inp.read_timeout_s
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            probe = Prober(session, self.inp)
            try:
                allowed = await self.base_and_auth(probe, r, key)
                if allowed is not None and key is not None:
                    await self.model_call(probe, r, key, allowed)
            except ProbeFailed as e:
                self.add(e.check)
        return self.checks

    async def base_and_auth(self, probe: Prober, r: Resolved, key: str | None) -> list[str] | None:
        """GET the model list as the tool would; returns the allowed models when the key works."""
        url = self.models_url(r.base_url)
        reply = await probe.request("base URL", "GET", url, self.headers(key or "none"))
        if reply.is_html():
            self.add(
                _fail(
                    "base URL",
                    f"{url} answered {reply.status} with a web page (HTML), not the API: this looks like "
                    "a dashboard or docs address.",
                    f"use the gateway's API address, e.g. {self._suggest(self.inp.default_base_url)}.",
                )
            )
            return None
        if reply.status == 404:
            await self.wrong_base(probe, r, key)
            return None
        if reply.status == 401:
            self.add(_pass("base URL", f"{r.base_url} is the gateway (from {r.base_from})."))
            await self.unauthorized(r, key, reply)
            return None
        if reply.status != 200 or not isinstance(reply.json().get("data"), list):
            code, msg = reply.error()
            self.add(
                _fail("base URL", f"GET {url} answered {reply.status}: {msg or code}.", "check the base URL.")
            )
            return None
        self.add(
            _pass("base URL", f"{r.base_url} is the gateway (from {r.base_from}; {reply.elapsed_ms:.0f} ms).")
        )
        allowed = [m["id"] for m in reply.json()["data"] if isinstance(m, dict) and "id" in m]
        if key is not None and key == r.key:
            self.add(_pass("auth", f"the gateway accepts the key; it may use {', '.join(allowed)}."))
        elif key is not None:
            self.add(_warn("auth", "the key works once cleaned as above; fix the variable."))
        return allowed

    def _suggest(self, root: str) -> str:
        return root_url(root) + ("" if self.anthropic_style else "/v1")

    async def wrong_base(self, probe: Prober, r: Resolved, key: str | None) -> None:
        base = r.base_url.rstrip("/")
        has_v1 = base.endswith("/v1")
        right = self._suggest(base)
        var = {"claude-code": "ANTHROPIC_BASE_URL", "codex": "base_url in config.toml"}.get(
            self.inp.tool, "OPENAI_BASE_URL"
        )
        if right != base:
            alt = await probe.request("base URL", "GET", self.models_url(right), self.headers(key or "none"))
            if alt.status in (200, 401) and not alt.is_html():
                if self.anthropic_style:
                    why = "Claude Code and the anthropic SDK add /v1 themselves, so they call /v1/v1/messages"
                else:
                    why = (
                        f"the openai SDK and Codex expect the /v1 in the base URL, so they call {base}/models"
                    )
                self.add(
                    _fail(
                        "base URL",
                        f"404 from {base} ({'with' if has_v1 else 'without'} /v1): {why}.",
                        f"set {var} to {right}.",
                    )
                )
                return
        self.add(
            _fail(
                "base URL",
                f"404 from {self.models_url(base)}: no gateway API at {base}, with or without /v1 (a proxy "
                "path prefix, another service on that port?).",
                f"use the address the gateway listens on, e.g. {self._suggest(self.inp.default_base_url)}.",
            )
        )

    async def unauthorized(self, r: Resolved, key: str | None, reply: Reply) -> None:
        _, msg = reply.error()
        if self.auth_header is not None and not self.auth_header.lower().startswith("bearer "):
            where = "ANTHROPIC_CUSTOM_HEADERS" if self.inp.tool == "claude-code" else "the provider's headers"
            self.add(
                _fail(
                    "auth",
                    f"401 ({msg}): {where} sets 'Authorization: {self.auth_header[:7]}...' without the "
                    "'Bearer ' prefix, and it replaces the header the tool would build from the key.",
                    "drop that custom header and let the tool send the key, or write 'Bearer <key>'.",
                )
            )
            return
        if key is None:
            self.add(
                _fail(
                    "auth", f"401: the gateway got no key ({msg}).", f"set ${r.key_env} (see the key check)."
                )
            )
            return
        m = _KEY_RE.match(key)
        found = await self.inp.key_lookup(m.group(1)) if m and self.inp.key_lookup else None
        if found is not None and found[0] is not None:
            info = found[0]
            now = utcnow()
            state = info.state(now)
            if info.revoked_at is not None:
                why = f"key {info.id} was revoked at {info.revoked_at:%Y-%m-%d %H:%M} UTC."
            elif info.rotated_to is not None and state == "expired":
                why = (
                    f"key {info.id} was rotated to {info.rotated_to}; the old key's grace ended at "
                    f"{info.expires_at:%Y-%m-%d %H:%M} UTC."
                )
            elif state == "expired":
                why = f"key {info.id} expired at {info.expires_at:%Y-%m-%d %H:%M} UTC."
            elif r.also is not None:
                self.add(self._conflict(r, f"401 although key {info.id} in ${r.key_env} is {state}"))
                return
            else:
                why = (
                    f"key {info.id} is {state}, but the rest of the key does not match: a typo or a cut copy."
                )
            self.add(
                _fail(
                    "auth",
                    f"401: {why}",
                    f"ask for a new key (`farm gateway keys create --project {info.project}`) and export it.",
                )
            )
            return
        if found is not None:
            self.add(
                _fail(
                    "auth",
                    "401: no key with this id on this gateway: it was made for another gateway.",
                    "create one on this gateway.",
                )
            )
            return
        if r.also is not None:
            self.add(self._conflict(r, f"401 ({msg})", maybe=True))
            return
        self.add(
            _fail(
                "auth",
                f"401 ({msg}): the gateway does not accept this key: it was revoked, it expired, it was "
                "rotated (the old key works only for the grace period after `keys rotate`), or it belongs to "
                f"another gateway. Key id: {key[3:15] if m else 'none'}.",
                "ask the admin (`farm gateway keys list` shows the state of each key id) for a new key, or "
                "use the key `keys rotate` printed.",
            )
        )

    def _conflict(self, r: Resolved, head: str, maybe: bool = False) -> Check:
        """A 401 while the tool sends two credential headers: the gateway used the other one."""
        assert r.also is not None
        other_header, other_var, other_value = r.also
        label = {"x-api-key": "'x-api-key'", "authorization": "'Authorization: Bearer'"}
        used = (
            f"this gateway used {label[other_header]} ({other_var}, {_what_key(other_value)}) instead of the "
            f"key in ${r.key_env} (a gateway from before the fix reads x-api-key first)"
        )
        if maybe:
            used = (
                f"either {used}, or the key in ${r.key_env} was revoked, expired or rotated (key id "
                f"{r.key.strip()[3:15] if r.key and _KEY_RE.match(r.key.strip()) else 'none'})"
            )
        return _fail(
            "auth",
            f"{head}: {self.inp.tool} sends both {label[r.key_header]} and {label[other_header]}, "
            f"and {used}.",
            f"remove {other_var} so that only the gateway key is sent"
            + ("; if the 401 stays, ask the admin for a new key." if maybe else "."),
        )

    def call(self, r: Resolved, model: str) -> tuple[str, dict]:
        base = r.base_url.rstrip("/")
        if self.inp.tool == "claude-code":
            body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
            return base + "/v1/messages", body
        if self.inp.tool == "codex":
            return base + "/responses", {"model": model, "input": "ping", "max_output_tokens": 16}
        body = {"model": model, "max_completion_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
        return base + "/chat/completions", body

    async def model_call(self, probe: Prober, r: Resolved, key: str, allowed: list[str]) -> None:
        # No model configured: try the allowed ones in order until one answers in the tool's own format
        # (one reached through translation is remembered for the translation check).
        candidates = [r.model] if r.model else allowed
        if not candidates:
            self.add(_fail("model", "the key's project has no models.", "ask the admin to configure some."))
            return
        h = {**self.headers(key), "X-Farm-Task": "doctor"}
        translated: tuple[str, Reply] | None = None
        tried = 0
        for model in candidates:
            url, body = self.call(r, model)
            reply = await probe.request("model call", "POST", url, h, body)
            tried += 1
            if r.model or reply.status != 200 or not reply.headers.get("x-farm-translation"):
                break
            translated = translated or (model, reply)
        else:
            model, reply = translated  # type: ignore[misc]  # every model is of the other format
        where = f" (from {r.model_from})" if r.model_from else ""
        listing = ", ".join(allowed)
        if reply.status == 200:
            how = reply.headers.get("x-farm-translation")
            via = f" through the gateway's translation ({how})" if how else ""
            self.add(_pass("model call", f"{model}{where} answered{via} in {reply.elapsed_ms:.0f} ms."))
            if not r.model:
                await self.translation(probe, r, h, candidates[tried:], translated)
            return
        code, msg = reply.error()
        setting = {"claude-code": "ANTHROPIC_MODEL", "codex": "model in config.toml"}.get(
            self.inp.tool, "--model / your script's model"
        )
        if reply.status == 403 and code == "model_not_allowed":
            self.add(
                _fail(
                    "model call",
                    f"403: your key's project may not use {model}{where}; it may use {listing}.",
                    f"set {setting} to one of those, or ask the admin to add {model} to the project.",
                )
            )
        elif reply.status == 404:
            self.add(
                _fail(
                    "model call",
                    f"404: the gateway has no model {model!r}{where} ({msg}); your key may use {listing}.",
                    f"set {setting} to one of those.",
                )
            )
        elif reply.status == 429:
            self.add(await self.rate_limited(reply, key))
        elif reply.status == 504:
            self.add(
                _fail(
                    "model call",
                    f"504: the upstream sent nothing within the gateway's read timeout ({msg}).",
                    TIMEOUT_FIX,
                )
            )
        elif reply.status == 502:
            self.add(
                _fail(
                    "model call",
                    f"502: the gateway cannot reach its upstream provider ({msg}).",
                    "an admin problem: check the provider's base_url and network on the gateway host.",
                )
            )
        elif reply.status in (401, 403):
            self.add(
                _fail(
                    "model call",
                    f"{reply.status} from the upstream provider ({msg}): the gateway's upstream key is bad.",
                    "an admin problem: set the provider's api_key_env variable where the gateway runs.",
                )
            )
        else:
            self.add(
                _fail(
                    "model call",
                    f"{reply.status}: {msg or code}.",
                    "retry later; if it persists, report the x-request-id "
                    f"{reply.headers.get('x-request-id', '')} to the admin.",
                )
            )

    async def translation(
        self,
        probe: Prober,
        r: Resolved,
        h: dict[str, str],
        rest: list[str],
        seen: tuple[str, Reply] | None,
    ) -> None:
        """The translation path: a model this tool reaches through translation answered (``seen``), else
        the first of the untried models ``rest`` that the gateway translates; no line when none does."""
        for model in rest:
            if seen is not None:
                break
            url, body = self.call(r, model)
            reply = await probe.request("translation", "POST", url, h, body)
            if reply.status != 200:
                code, msg = reply.error()
                self.add(
                    _fail(
                        "translation",
                        f"{model} answered {reply.status}: {msg or code}.",
                        f"report the x-request-id {reply.headers.get('x-request-id', '')} to the admin.",
                    )
                )
                return
            if reply.headers.get("x-farm-translation"):
                seen = (model, reply)
        if seen is not None:
            model, reply = seen
            how = reply.headers["x-farm-translation"]
            self.add(
                _pass(
                    "translation",
                    f"{model} is served in another wire format; the gateway translates ({how}) and it "
                    f"answered in {reply.elapsed_ms:.0f} ms.",
                )
            )

    async def rate_limited(self, reply: Reply, key: str) -> Check:
        limit = reply.headers.get("x-farm-limit")
        retry = reply.headers.get("Retry-After", "?")
        _, msg = reply.error()
        if limit is None:
            return _fail(
                "model call",
                f"429 from the upstream provider after the gateway's retries (Retry-After {retry} s): "
                "the provider throttles the whole gateway.",
                "wait and retry; lower the team's concurrency or ask the admin for a higher upstream tier.",
            )
        project: ProjectConfig | None = None
        m = _KEY_RE.match(key)
        if m and self.inp.key_lookup:
            found = await self.inp.key_lookup(m.group(1))
            project = found[1] if found else None
        return _fail(
            "model call", f"429, limit {limit}: {msg} (Retry-After {retry} s).", advise_429(limit, project)
        )


def advise_429(limit: str, project: ProjectConfig | None) -> str:
    """The fix for a gateway 429, with a suggested concurrency where one helps."""
    if limit == "daily_budget":
        return (
            "the project's daily token budget is spent; it resets at 00:00 UTC. Fewer workers will not "
            "help: ask the admin to raise daily_token_budget."
        )
    if project is None:  # limits unknown without --config
        return {
            "concurrency": "the project's parallel slots are shared by all its keys: halve your parallel "
            "agents/workers.",
            "rpm": "space requests out: a worker making a call every ~20 s sends 3 a minute.",
            "tpm": "each request reserves its max_tokens against the minute's tokens: lower max_tokens and "
            "run fewer workers.",
        }.get(limit, "wait for Retry-After and lower your concurrency.")
    if limit == "concurrency":
        c = project.max_concurrency
        return (
            f"the project allows {c} requests at once across all its keys: suggested concurrency "
            f"{max(1, c // 2)} while a teammate also runs agents, never above {c}."
        )
    if limit == "rpm" and project.rpm:
        n = max(1, int(project.rpm * ASSUMED_CALL_S / 60))
        return (
            f"the project allows {project.rpm} requests a minute: with ~{ASSUMED_CALL_S:g} s calls, "
            f"suggested concurrency {n} across the project."
        )
    if limit == "tpm" and project.tpm:
        n = max(1, int(project.tpm * ASSUMED_CALL_S / 60 / project.default_max_tokens))
        return (
            f"each request reserves its max_tokens (default {project.default_max_tokens}) against "
            f"{project.tpm} tokens a minute: lower max_tokens, or keep concurrency at {n}."
        )
    return "wait for Retry-After and lower your concurrency."


def store_lookup(settings: GatewaySettings) -> KeyLookup:
    """Look a key id up in the gateway's own store (works on the gateway host, with its config)."""

    async def lookup(key_id: str) -> tuple[KeyInfo | None, ProjectConfig | None] | None:
        engine = create_engine(settings.database_url)
        try:
            info = await KeyStore(engine, cache_ttl_s=0).get(key_id)  # a lookup by id needs no secret
        except Exception:  # no database here, or no tables: the answer is unknown, not an error
            return None
        finally:
            await engine.dispose()
        return info, settings.projects.get(info.project) if info else None

    return lookup


async def run_doctor(inp: DoctorInput) -> list[Check]:
    return await Doctor(inp).run()


def format_checks(checks: list[Check]) -> str:
    return "\n".join(c.line() for c in checks)


def failed(checks: list[Check]) -> bool:
    return any(c.status == "FAIL" for c in checks)
