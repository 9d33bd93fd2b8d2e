"""What a refusal from the gateway means for this user: a 401 (the custom header, no key, the key's state
in the gateway's store, two credentials of which the gateway used the other) and a 429 (which limit, and
the concurrency that fits the project's limits when they are known)."""

from __future__ import annotations

from gateway.config import ProjectConfig
from gateway.ops.doctor.checks import Check, _fail
from gateway.ops.doctor.inputs import DoctorInput, Resolved
from gateway.ops.doctor.key import _KEY_RE, _what_key
from gateway.ops.doctor.probe import Reply
from gateway.store.keys import utcnow

ASSUMED_CALL_S = 20.0  # a typical agent call, for turning rpm into a concurrency


async def unauthorized(inp: DoctorInput, r: Resolved, key: str | None, reply: Reply) -> Check:
    """Why the gateway answered 401 to the key the tool sends (``key``, as cleaned by check_key)."""
    _, msg = reply.error()
    if r.auth_header is not None and not r.auth_header.lower().startswith("bearer "):
        where = "ANTHROPIC_CUSTOM_HEADERS" if inp.tool == "claude-code" else "the provider's headers"
        return _fail(
            "auth",
            f"401 ({msg}): {where} sets 'Authorization: {r.auth_header[:7]}...' without the "
            "'Bearer ' prefix, and it replaces the header the tool would build from the key.",
            "drop that custom header and let the tool send the key, or write 'Bearer <key>'.",
        )
    if key is None:
        return _fail(
            "auth", f"401: the gateway got no key ({msg}).", f"set ${r.key_env} (see the key check)."
        )
    m = _KEY_RE.match(key)
    found = await inp.key_lookup(m.group(1)) if m and inp.key_lookup else None
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
            return _conflict(inp, r, f"401 although key {info.id} in ${r.key_env} is {state}")
        else:
            why = f"key {info.id} is {state}, but the rest of the key does not match: a typo or a cut copy."
        return _fail(
            "auth",
            f"401: {why}",
            f"ask for a new key (`farm gateway keys create --project {info.project}`) and export it.",
        )
    if found is not None:
        return _fail(
            "auth",
            "401: no key with this id on this gateway: it was made for another gateway.",
            "create one on this gateway.",
        )
    if r.also is not None:
        return _conflict(inp, r, f"401 ({msg})", maybe=True)
    return _fail(
        "auth",
        f"401 ({msg}): the gateway does not accept this key: it was revoked, it expired, it was "
        "rotated (the old key works only for the grace period after `keys rotate`), or it belongs to "
        f"another gateway. Key id: {key[3:15] if m else 'none'}.",
        "ask the admin (`farm gateway keys list` shows the state of each key id) for a new key, or "
        "use the key `keys rotate` printed.",
    )


def _conflict(inp: DoctorInput, r: Resolved, head: str, maybe: bool = False) -> Check:
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
        f"{head}: {inp.tool} sends both {label[r.key_header]} and {label[other_header]}, and {used}.",
        f"remove {other_var} so that only the gateway key is sent"
        + ("; if the 401 stays, ask the admin for a new key." if maybe else "."),
    )


async def rate_limited(inp: DoctorInput, reply: Reply, key: str) -> Check:
    """The model call's 429: the upstream's (throttling the whole gateway) or one of the gateway's limits."""
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
    if m and inp.key_lookup:
        found = await inp.key_lookup(m.group(1))
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
