"""The key, before any request: the local verdict on it (``check_key``: unset, empty, a placeholder, a
'Bearer ' prefix, whitespace, another provider's key), and, with the gateway's config, its state in the
gateway's own key store (``store_lookup``)."""

from __future__ import annotations

import re

from gateway.config import GatewaySettings, ProjectConfig
from gateway.ops.doctor.checks import Check, _fail, _pass
from gateway.ops.doctor.inputs import KeyLookup, Resolved
from gateway.ops.onboarding import is_placeholder
from gateway.store.db import create_engine
from gateway.store.keys import KEY_RE, KeyInfo, KeyStore

_KEY_RE = KEY_RE


def _what_key(value: str) -> str:
    if _KEY_RE.match(value):
        return f"gateway key {value[3:15]}"
    if value.startswith("sk-ant-"):
        return "an Anthropic key (sk-ant-...)"
    return "an OpenAI key (sk-...)" if value.startswith("sk-") else "something that is not a gateway key"


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
