"""The translation entry points: whole requests, whole answers and error bodies."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.errors import error_body
from gateway.translate import chat, messages, responses
from gateway.translate.ir import FORMATS, Format, invalid

DEFAULT_MAX_TOKENS = 4096
# the anthropic-version header: what the gateway sends an anthropic provider when the client sent none, and
# what the doctor sends as Claude Code would
ANTHROPIC_VERSION = "2023-06-01"
_STYLE = {"chat": "openai", "responses": "openai", "messages": "anthropic"}


def _check(src: str, dst: str) -> None:
    if src not in FORMATS or dst not in FORMATS:
        raise ValueError(f"unknown wire format: {src!r} -> {dst!r}")


def translate_request(
    body: dict,
    src: Format,
    dst: Format,
    *,
    upstream_model: str,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    strict: bool = False,
    dropped: list[str] | None = None,
    effort: bool = False,
) -> dict:
    """A client's request body in ``src`` -> the upstream's request body in ``dst``, naming
    ``upstream_model``. ``default_max_tokens`` fills Anthropic's required max_tokens when the client gave
    none. Raises ``BadRequest`` (error_class "untranslatable") naming the first field the target cannot
    express; see ``gateway.translate.policy`` for what is dropped on purpose. A field it does not know is
    dropped and its name appended to ``dropped`` (``strict``: refused instead). ``effort``: the upstream
    model takes an effort hint, so the other provider's is mapped to it (policy.EFFORT). With
    ``src == dst`` only the model (and, for a chat stream, ``stream_options.include_usage``) changes."""
    _check(src, dst)
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    if src == dst:
        out = {**body, "model": upstream_model}
        if dst == "chat" and out.get("stream"):
            opts = out.get("stream_options")
            out["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        return out
    try:
        if src == "chat":
            req = chat.parse_request(body, dst, strict)
        elif src == "responses":
            req = responses.parse_request(body, dst, strict)
        else:
            req = messages.parse_request(body, dst, strict)
        if dropped is not None:
            dropped.extend(f for f in req.dropped if f not in dropped)
        req.map_effort = effort
        if dst == "chat":
            return chat.render_request(req, upstream_model)
        if dst == "responses":
            return responses.render_request(req, upstream_model)
        return messages.render_request(req, upstream_model, default_max_tokens)
    except RecursionError:  # a tool's input or schema nested nearly as deep as the JSON parser allows
        raise invalid("body", "is nested too deeply to translate") from None


def translate_response(
    body: dict,
    src: Format,
    dst: Format,
    *,
    public_model: str,
    created: int | None = None,
    tool_names: Mapping[str, tuple[str, str]] | None = None,
) -> dict:
    """A whole (non-streamed) upstream answer in ``src`` -> the client's format ``dst``, naming
    ``public_model``. Ids get the target's prefix, derived from the upstream's id; tool call ids are kept.
    ``created``: the timestamp to stamp when the source has none (default: now). ``tool_names``: a
    Responses client's namespaced tools (gateway.translate.namespaces), whose calls it gets split again."""
    _check(src, dst)
    if src == dst:
        return {**body, "model": public_model}
    if src == "chat":
        reply = chat.parse_response(body)
    elif src == "responses":
        reply = responses.parse_response(body)
    else:
        reply = messages.parse_response(body)
    if dst == "chat":
        return chat.render_response(reply, public_model, created)
    if dst == "responses":
        return responses.render_response(reply, public_model, created, tool_names)
    return messages.render_response(reply, public_model)


def translate_error(body: object, src: Format, dst: Format, *, status: int) -> dict:
    """An upstream's error body (any shape, even not JSON) -> an error body in the client's format. The
    HTTP status is kept by the caller; the error type follows the status in the client's vocabulary."""
    _check(src, dst)
    message = ""
    code = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        message = str(err.get("message") or "")
        code = err.get("code") if isinstance(err.get("code"), str) else None
    elif isinstance(body, (bytes, str)) and body:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        message = text[:500].strip()
    if not message:
        message = f"upstream returned HTTP {status}"
    return error_body(_STYLE[dst], status, message, code if _STYLE[dst] == "openai" else None)
