"""The hub: one small internal representation that every wire format is read into and written from.

A request is a list of ``Message`` (roles system / user / assistant / tool) whose parts are ``Text``,
``Image``, ``ToolCall`` (assistant) and ``ToolResult`` (tool), plus the sampling settings the three formats
share. A whole answer is a ``Reply``. A stream is a sequence of small tuples (``gateway.translate.stream``).
Tool call arguments stay a JSON string in the hub (what both OpenAI formats carry); Anthropic's parsed
``input`` object is converted at its edge.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from gateway.core.usage import token_count
from gateway.errors import BadRequest

Format = Literal["chat", "responses", "messages"]
FORMATS: tuple[Format, ...] = ("chat", "responses", "messages")
FORMAT_NAMES: dict[str, str] = {
    "chat": "openai chat completions",
    "responses": "openai responses",
    "messages": "anthropic messages",
}

# Why an answer stopped, in the hub's words. Mapped per format in each module.
Stop = Literal["end", "length", "tool", "stop_sequence", "filter"]


def untranslatable(fieldname: str, dst: str, what: str = "has no equivalent and") -> BadRequest:
    """The 400 for a feature the target format cannot express: "n: 2 choices cannot be translated to ..."."""
    return BadRequest(
        f"{fieldname}: {what} cannot be translated to {FORMAT_NAMES[dst]}", error_class="untranslatable"
    )


def invalid(fieldname: str, problem: str) -> BadRequest:
    """The 400 for a request that is malformed in its own format."""
    return BadRequest(f"invalid request body: {fieldname}: {problem}")


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Image:
    url: str  # a data: URL (base64) or an http(s) URL


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(slots=True)
class ToolResult:
    call_id: str
    content: list[Text | Image]
    is_error: bool = False


Part = Text | Image | ToolCall | ToolResult


@dataclass(slots=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    parts: list[Part]


@dataclass(slots=True)
class Tool:
    name: str
    description: str | None
    parameters: dict


@dataclass(slots=True)
class Request:
    messages: list[Message] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: Literal["auto", "none", "required", "tool"] | None = None
    tool_name: str | None = None  # with tool_choice == "tool"
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    stream: bool = False
    user: str | None = None
    reasoning_effort: str | None = None  # an OpenAI client's word (see policy.EFFORT)
    effort: str | None = None  # an Anthropic client's output_config.effort (see policy.EFFORT)
    # the target deployment takes an effort hint (its config's ``effort: true``): a hint from a client of
    # the other provider is mapped to it, else dropped (policy.EFFORT)
    map_effort: bool = False
    verbosity: str | None = None  # OpenAI formats only (see policy.DROPPED)
    # chat's shape: {"type": "json_object"} or {"type": "json_schema", "json_schema": {name, schema, ...}}
    response_format: dict | None = None
    # canonical name -> the field as the client spelled it, for error messages ("stop" -> "stop_sequences")
    source_fields: dict[str, str] = field(default_factory=dict)
    # a field the gateway does not know: refused by name (``strict``) or dropped and named in ``dropped``
    strict: bool = False
    dropped: list[str] = field(default_factory=list)

    def src(self, name: str) -> str:
        return self.source_fields.get(name, name)

    def screen(
        self, body: dict, dst: str, known: frozenset[str], refused: Mapping[str, str], off: tuple = (None,)
    ) -> None:
        """A request's top-level fields before it is read: one of `refused` (field -> what it asks for)
        set to a value other than `off` is a 400 naming it; one not `known` is ``unknown``."""
        for key, value in body.items():
            if key in refused and value not in off:
                raise untranslatable(key, dst, refused[key])
            if key not in known:
                self.unknown(key, dst)

    def openai_tool_choice(self, tc: object, dst: str, name_of: Callable[[dict], object]) -> None:
        """An OpenAI format's ``tool_choice``: "auto" | "none" | "required", or a function named by
        `name_of` (chat nests it under ``function``, Responses does not)."""
        if isinstance(tc, str):
            if tc not in ("auto", "none", "required"):
                raise invalid("tool_choice", f"unknown value {tc!r}")
            self.tool_choice = tc
        elif isinstance(tc, dict):
            if tc.get("type") != "function":
                raise untranslatable("tool_choice.type", dst, f"tool_choice {tc.get('type')!r}")
            self.tool_choice, self.tool_name = "tool", want(name_of(tc), str, "tool_choice.name")

    def unknown(self, name: str, dst: str, what: str = "this field") -> None:
        """A field the gateway does not know (or a tool with no equivalent): left out and reported, or in
        strict mode a 400 naming it (gateway.translate.policy)."""
        if self.strict:
            raise untranslatable(name, dst, what)
        if name not in self.dropped:
            self.dropped.append(name)


@dataclass(slots=True)
class Usage:
    input: int = 0  # every input token, cached ones included (OpenAI's prompt_tokens)
    output: int = 0
    cached: int = 0  # input tokens read from the prompt cache
    cache_write: int = 0  # input tokens written to the cache (Anthropic only)
    reasoning: int = 0  # output tokens spent reasoning (OpenAI only)

    @property
    def uncached_input(self) -> int:
        """Anthropic's input_tokens: the part of the input neither read from nor written to the cache."""
        return max(0, self.input - self.cached - self.cache_write)


@dataclass(slots=True)
class Reply:
    id: str | None
    parts: list[Text | ToolCall]
    stop: Stop
    usage: Usage | None = None
    stop_sequence: str | None = None
    created: int | None = None
    model: str | None = None


# ----------------------------------------------------------------------------------------------- helpers

_ID_PREFIXES = ("chatcmpl-", "resp_", "msg_", "call_", "toolu_", "fc_")


def new_id(prefix: str, source_id: str | None = None) -> str:
    """An id with ``prefix``; derived from the source's id when there is one, so the same upstream answer
    (streamed or whole) always gets the same client-side id."""
    if source_id:
        for p in _ID_PREFIXES:
            if source_id.startswith(p):
                source_id = source_id[len(p) :]
                break
        if source_id:
            return prefix + source_id
    return prefix + secrets.token_hex(12)


# JSON in and out, behind three functions so the library can be swapped. The stdlib's C scanner and
# encoder are called directly: ``json.dumps(obj, **options)`` builds a new encoder on every call, which
# costs more than encoding a short text delta, and ``json.loads`` adds two whitespace scans.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_SCAN = json.JSONDecoder().scan_once

dumps = _ENCODER.encode  # JSON text of obj: compact, non-ASCII characters as they are
dumps_str = json.encoder.encode_basestring  # what dumps gives for a str: the cheap case of a text delta


def loads(data: str) -> object:
    """``json.loads(data)``, quicker for data without surrounding whitespace (every SSE event's data).
    ValueError for anything that is not JSON, nesting too deep for the parser included."""
    try:
        try:
            obj, end = _SCAN(data, 0)
        except StopIteration:
            return json.loads(data)  # not JSON at the start: the full parser raises the usual error
        if end != len(data):
            return json.loads(data)  # whitespace or something more after the value: the full parser decides
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    return obj


def sub_object(obj: dict, name: str) -> dict:
    """``obj[name]`` when it is an object, else an empty one (a usage's ``*_details``)."""
    d = obj.get(name)
    return d if isinstance(d, dict) else {}


def count(v: object) -> int:
    """A token count of an upstream's usage as a client may be shown it (gateway.core.usage.token_count);
    anything that is no count (a list, NaN, 10**30, a negative number) shows as 0, and the gateway's own
    accounting estimates that request."""
    return token_count(v) or 0


def text_of(parts: list, where: str, dst: str) -> str:
    """The text of parts that may only be text (system prompts, tool results for chat)."""
    out = []
    for p in parts:
        if not isinstance(p, Text):
            raise untranslatable(where, dst, "an image here")
        out.append(p.text)
    return "\n\n".join(out)


def arguments_object(arguments: str, where: str) -> dict:
    """Tool call arguments (JSON text) as the object Anthropic's ``input`` needs."""
    if not arguments.strip():
        return {}
    try:
        obj = json.loads(arguments)
    except ValueError:
        raise invalid(where, "tool call arguments are not valid JSON") from None
    if not isinstance(obj, dict):
        raise invalid(where, "tool call arguments must be a JSON object")
    return obj


def want(obj: object, kind: type | tuple[type, ...], where: str) -> object:
    """``obj`` when it has the expected JSON type, else a 400 naming the field."""
    if not isinstance(obj, kind):
        names = {dict: "an object", list: "an array", str: "a string", int: "a number", bool: "a boolean"}
        first = kind[0] if isinstance(kind, tuple) else kind
        raise invalid(where, f"must be {names.get(first, first.__name__)}")
    return obj
