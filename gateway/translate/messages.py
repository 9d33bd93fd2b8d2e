"""Anthropic Messages (``/v1/messages``) <-> the hub.

Anthropic's ``input_tokens`` excludes the tokens read from or written to the prompt cache; the hub's
``Usage.input`` (OpenAI's ``prompt_tokens``) includes them, so both directions add or subtract the cache
fields. Tool results must all sit in the one user turn right after the assistant's tool_use turn:
consecutive same-role turns are merged when writing.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import error_type
from gateway.translate import policy
from gateway.translate.ir import (
    Image,
    Message,
    Reply,
    Request,
    Stop,
    Text,
    Tool,
    ToolCall,
    ToolResult,
    Usage,
    arguments_object,
    count,
    dumps,
    dumps_str,
    invalid,
    loads,
    new_id,
    text_of,
    untranslatable,
    want,
)

REASON_TO_STOP: dict[str, Stop] = {
    "end_turn": "end",
    "max_tokens": "length",
    "tool_use": "tool",
    "stop_sequence": "stop_sequence",
    "refusal": "filter",
    "pause_turn": "end",
    "model_context_window_exceeded": "length",
}
STOP_TO_REASON: dict[str, str] = {
    "end": "end_turn",
    "length": "max_tokens",
    "tool": "tool_use",
    "stop_sequence": "stop_sequence",
    "filter": "refusal",
}
_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}
_HANDLED = frozenset(
    "model system messages tools tool_choice max_tokens temperature top_p stop_sequences stream".split()
)
_KNOWN = _HANDLED | policy.TOP_LEVEL["messages"]
# Fields that change the answer and have no equivalent in the OpenAI formats: refused by name, always.
_REFUSED = {"top_k": "top-k sampling"}


# ------------------------------------------------------------------------------------------------ request


def _image(block: dict, where: str, dst: str) -> Image:
    src = want(block.get("source"), dict, f"{where}.source")
    kind = src.get("type")
    if kind == "base64":
        return Image(f"data:{src.get('media_type')};base64,{src.get('data')}")
    if kind == "url":
        return Image(want(src.get("url"), str, f"{where}.source.url"))
    raise untranslatable(f"{where}.source.type", dst, f"an image source of type {kind!r}")


def _blocks(content: object, where: str) -> list:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks = want(content, list, where)
    assert isinstance(blocks, list)  # want() refused anything else
    return blocks


def parse_request(body: dict, dst: str, strict: bool = False) -> Request:
    req = Request(strict=strict)
    req.screen(body, dst, _KNOWN, _REFUSED)
    config = body.get("output_config")
    if isinstance(config, dict):  # Claude Code: {"effort": ...}, a hint (policy.EFFORT); the rest unknown
        for key in config:
            if key != "effort":
                req.unknown(f"output_config.{key}", dst)
        effort = config.get("effort")
        req.effort = effort if isinstance(effort, str) else None
    system = body.get("system")
    if system:
        parts = []
        for j, b in enumerate(_blocks(system, "system")):
            if want(b, dict, f"system[{j}]").get("type") != "text":
                raise untranslatable(f"system[{j}].type", dst, f"a {b.get('type')!r} system block")
            parts.append(Text(want(b.get("text"), str, f"system[{j}].text")))
        req.messages.append(Message("system", parts))
    for i, m in enumerate(want(body.get("messages"), list, "messages")):
        _parse_message(req, m, f"messages[{i}]", dst)
    _parse_tools(req, body, dst)
    req.max_tokens = body.get("max_tokens")
    req.temperature = body.get("temperature")
    req.top_p = body.get("top_p")
    if body.get("stop_sequences"):
        req.stop = list(want(body["stop_sequences"], list, "stop_sequences"))
        req.source_fields["stop"] = "stop_sequences"
    req.stream = bool(body.get("stream"))
    meta = body.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("user_id"), str):
        req.user = meta["user_id"]
    return req


def _parse_message(req: Request, m: object, w: str, dst: str) -> None:
    """One conversation turn `m` (at `w`) into the hub's messages: its text and images, with each tool
    result a message of its own, in the order they came."""
    role = want(m, dict, w).get("role")
    if role == "system":  # Claude Code puts system messages in its conversation
        parts = [Text(want(b.get("text"), str, f"{w}.content[{j}].text"))
                 for j, b in enumerate(_blocks(m.get("content"), f"{w}.content"))
                 if want(b, dict, f"{w}.content[{j}]").get("type") == "text"]  # fmt: skip
        req.messages.append(Message("system", parts))
        return
    if role not in ("user", "assistant"):
        raise invalid(f"{w}.role", f"must be user, assistant or system, not {role!r}")
    pending: list = []  # text/images of this turn, flushed around tool results to keep their order

    def flush() -> None:
        if pending:
            req.messages.append(Message(role, list(pending)))
            pending.clear()

    for j, b in enumerate(_blocks(m.get("content"), f"{w}.content")):
        bw = f"{w}.content[{j}]"
        kind = want(b, dict, bw).get("type")
        if kind in ("text", "image"):
            pending.append(_text_or_image(b, kind, bw, dst))
        elif kind == "tool_use" and role == "assistant":
            args = dumps(b.get("input") if b.get("input") is not None else {})
            pending.append(ToolCall(want(b.get("id"), str, f"{bw}.id"), want(b.get("name"), str, bw), args))
        elif kind == "tool_result" and role == "user":
            flush()
            req.messages.append(Message("tool", [_tool_result(b, bw, dst)]))
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # policy.DROPPED: signed prior reasoning
        else:
            raise untranslatable(f"{bw}.type", dst, f"a {kind!r} block")
    flush()


def _text_or_image(b: dict, kind: str, bw: str, dst: str) -> Text | Image:
    """A text or image block (`kind`) at `bw`."""
    return Text(want(b.get("text"), str, f"{bw}.text")) if kind == "text" else _image(b, bw, dst)


def _tool_result(b: dict, bw: str, dst: str) -> ToolResult:
    content = []
    for k, c in enumerate(_blocks(b.get("content") or "", f"{bw}.content")):
        cw = f"{bw}.content[{k}]"
        ckind = want(c, dict, cw).get("type")
        if ckind not in ("text", "image"):
            raise untranslatable(f"{cw}.type", dst, f"a {ckind!r} block in a tool result")
        content.append(_text_or_image(c, ckind, cw, dst))
    call_id = want(b.get("tool_use_id"), str, f"{bw}.tool_use_id")
    return ToolResult(call_id, content, bool(b.get("is_error")))


def _parse_tools(req: Request, body: dict, dst: str) -> None:
    """`tools` and `tool_choice` (a server tool is unknown: it runs at Anthropic)."""
    for i, t in enumerate(body.get("tools") or []):
        w = f"tools[{i}]"
        if want(t, dict, w).get("type") not in (None, "custom"):  # a server tool (web search, ...)
            req.unknown(f"tools[{t.get('type')}]", dst, f"the Anthropic server tool {t.get('type')!r}")
            continue
        schema = t.get("input_schema") or {"type": "object", "properties": {}}
        req.tools.append(Tool(want(t.get("name"), str, f"{w}.name"), t.get("description"), schema))
    tc = body.get("tool_choice")
    if tc is not None:
        kind = want(tc, dict, "tool_choice").get("type")
        if kind == "tool":
            req.tool_choice, req.tool_name = "tool", want(tc.get("name"), str, "tool_choice.name")
        elif kind in ("auto", "none", "any"):
            req.tool_choice = "required" if kind == "any" else kind
        else:
            raise invalid("tool_choice.type", f"unknown value {kind!r}")
        if tc.get("disable_parallel_tool_use"):
            req.parallel_tool_calls = False


def _image_block(img: Image) -> dict:
    url = img.url
    if url.startswith("data:"):
        head, _, data = url.partition(",")
        media_type = head[5:].split(";")[0]
        if ";base64" not in head:
            raise untranslatable("image_url", "messages", "an image data URL that is not base64")
        return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
    return {"type": "image", "source": {"type": "url", "url": url}}


def _content_blocks(parts: list) -> list[dict]:
    out = []
    for p in parts:
        if isinstance(p, Text):
            if p.text:  # Anthropic refuses empty text blocks
                out.append({"type": "text", "text": p.text})
        elif isinstance(p, Image):
            out.append(_image_block(p))
        elif isinstance(p, ToolCall):
            out.append(
                {
                    "type": "tool_use",
                    "id": p.id,
                    "name": p.name,
                    "input": arguments_object(p.arguments, p.name),
                }
            )
        else:
            block: dict = {"type": "tool_result", "tool_use_id": p.call_id}
            content = _content_blocks(p.content)
            if len(content) == 1 and content[0]["type"] == "text":
                block["content"] = content[0]["text"]
            elif content:
                block["content"] = content
            if p.is_error:
                block["is_error"] = True
            out.append(block)
    return out


def render_request(req: Request, model: str, default_max_tokens: int) -> dict:
    if req.response_format is not None:
        raise untranslatable(
            "response_format", "messages", f"response_format {req.response_format.get('type')}"
        )
    system: list[dict] = []
    turns: list[dict] = []
    for m in req.messages:
        if m.role == "system":  # Anthropic has one system prompt: every system/developer message joins it
            system.extend({"type": "text", "text": p.text} for p in m.parts if isinstance(p, Text) and p.text)
            text_of(m.parts, "system message", "messages")
            continue
        role = "assistant" if m.role == "assistant" else "user"
        blocks = _content_blocks(m.parts)
        if not blocks:
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    for t in turns:  # a lone text block reads better as a string
        c = t["content"]
        if len(c) == 1 and c[0]["type"] == "text":
            t["content"] = c[0]["text"]
    body: dict = {"model": model}
    if system:
        body["system"] = system[0]["text"] if len(system) == 1 else system
    body["messages"] = turns
    body["max_tokens"] = req.max_tokens or default_max_tokens
    if req.tools:
        body["tools"] = [
            {
                "name": t.name,
                **({"description": t.description} if t.description else {}),
                "input_schema": t.parameters,
            }
            for t in req.tools
        ]
    choice: dict | None = None
    if req.tool_choice == "tool":
        choice = {"type": "tool", "name": req.tool_name}
    elif req.tool_choice:
        choice = {"type": {"required": "any"}.get(req.tool_choice, req.tool_choice)}
    if req.parallel_tool_calls is False and req.tools:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    if choice is not None:
        body["tool_choice"] = choice
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.stop:
        body["stop_sequences"] = req.stop
    if req.stream:
        body["stream"] = True
    if req.user is not None:
        body["metadata"] = {"user_id": req.user}
    effort = policy.EFFORT["to_anthropic"].get(req.reasoning_effort or "")
    if req.map_effort and effort is not None:
        body["output_config"] = {"effort": effort}
    return body


# ----------------------------------------------------------------------------------------------- response


def parse_usage(u: object, into: Usage | None = None) -> Usage | None:
    if not isinstance(u, dict):
        return into
    usage = into or Usage()
    cached = u.get("cache_read_input_tokens")
    written = u.get("cache_creation_input_tokens")
    if cached is not None:
        usage.cached = count(cached)
    if written is not None:
        usage.cache_write = count(written)
    if u.get("input_tokens") is not None:
        usage.input = count(u["input_tokens"]) + usage.cached + usage.cache_write
    if u.get("output_tokens") is not None:
        usage.output = count(u["output_tokens"])
    return usage


def render_usage(u: Usage) -> dict:
    return {
        "input_tokens": u.uncached_input,
        "output_tokens": u.output,
        "cache_creation_input_tokens": u.cache_write,
        "cache_read_input_tokens": u.cached,
    }


def parse_response(body: dict) -> Reply:
    """An upstream's answer; a field of the wrong JSON type raises (the caller answers 502)."""
    parts: list = []
    for i, b in enumerate(want(body.get("content") or [], list, "content")):
        w = f"content[{i}]"
        kind = want(b, dict, w).get("type")
        if kind == "text":
            parts.append(Text(want(b.get("text", ""), str, f"{w}.text")))
        elif kind == "tool_use":
            parts.append(
                ToolCall(
                    want(b.get("id"), str, f"{w}.id"),
                    want(b.get("name"), str, f"{w}.name"),
                    dumps(want(b.get("input") or {}, dict, f"{w}.input")),
                )
            )
    reason, rid, seq = body.get("stop_reason"), body.get("id"), body.get("stop_sequence")
    stop = REASON_TO_STOP.get(reason if isinstance(reason, str) else "end_turn", "end")
    return Reply(
        rid if isinstance(rid, str) else None, parts, stop, parse_usage(body.get("usage")),
        seq if isinstance(seq, str) else None,
    )  # fmt: skip


def render_response(reply: Reply, model: str) -> dict:
    content = []
    for p in reply.parts:
        if isinstance(p, Text):
            if p.text:
                content.append({"type": "text", "text": p.text})
        else:
            content.append(
                {
                    "type": "tool_use",
                    "id": p.id,
                    "name": p.name,
                    "input": arguments_object(p.arguments, p.name),
                }
            )
    return {
        "id": new_id("msg_", reply.id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_TO_REASON[reply.stop],
        "stop_sequence": reply.stop_sequence if reply.stop == "stop_sequence" else None,
        "usage": render_usage(reply.usage or Usage()),
    }


# ------------------------------------------------------------------------------------------------ streams


class Decoder:
    """Anthropic SSE events -> hub stream events (thinking blocks and pings are skipped)."""

    def __init__(self, on_usage: Callable[[dict], object] | None = None) -> None:
        """``on_usage``: called with each parsed event that can carry usage (for the gateway's accounting)."""
        self.on_usage = on_usage
        self.usage = Usage()
        self.seen_usage = False
        self.finished = False
        self._keys: dict[int, int | None] = {}  # content block index -> block key (None: skipped)
        self._next = 0
        self._stop: Stop = "end"
        self._stop_sequence: str | None = None

    def feed(self, data: str, out: list) -> None:
        obj = loads(data)
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "content_block_delta":
            key = self._keys.get(obj.get("index"))
            if key is None:
                return
            delta = obj.get("delta") or {}
            dkind = delta.get("type")
            if dkind == "text_delta":
                if delta.get("text"):
                    out.append(("text", key, delta["text"]))
            elif dkind == "input_json_delta":
                if delta.get("partial_json"):
                    out.append(("args", key, delta["partial_json"]))
        elif kind == "content_block_start":
            block = obj.get("content_block") or {}
            bkind = block.get("type")
            if bkind not in ("text", "tool_use"):
                self._keys[obj.get("index")] = None
                return
            key = self._keys[obj.get("index")] = self._next
            self._next += 1
            if bkind == "tool_use":
                out.append(("tool", key, block.get("id") or new_id("toolu_"), block.get("name") or ""))
                if block.get("input"):
                    out.append(("args", key, dumps(block["input"])))
            elif block.get("text"):
                out.append(("text", key, block["text"]))
        elif kind == "content_block_stop":
            key = self._keys.get(obj.get("index"))
            if key is not None:
                out.append(("end", key))
        elif kind == "message_start":
            if self.on_usage is not None:
                self.on_usage(obj)
            msg = obj.get("message") or {}
            if isinstance(msg.get("usage"), dict):
                parse_usage(msg["usage"], self.usage)
                self.seen_usage = True
            out.append(("start", msg.get("id"), None, self.usage))
        elif kind == "message_delta":
            if self.on_usage is not None:
                self.on_usage(obj)
            delta = obj.get("delta") or {}
            if delta.get("stop_reason"):
                self._stop = REASON_TO_STOP.get(delta["stop_reason"], "end")
                self._stop_sequence = delta.get("stop_sequence")
            if isinstance(obj.get("usage"), dict):
                parse_usage(obj["usage"], self.usage)
                self.seen_usage = True
        elif kind == "message_stop":
            self.finished = True
            out.append(("finish", self._stop, self._stop_sequence, self.usage))
        elif kind == "error":
            err = obj.get("error") or {}
            status = _ERROR_STATUS.get(err.get("type"), 502)
            out.append(("error", status, err.get("message") or "upstream error"))
            self.finished = True

    def end(self, out: list) -> None:
        if not self.finished:
            self.finished = True
            out.append(("error", 502, "the upstream stream ended before the answer was complete"))


def _event(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


class Encoder:
    """Hub stream events -> Anthropic SSE. Blocks are written one after another (each stopped before
    the next starts); input tokens known at message_start go there, the rest arrive in message_delta."""

    def __init__(self, model: str) -> None:
        self.model = model
        self._index: dict[int, int] = {}  # block key -> content block index
        self._open: int | None = None  # key of the open block
        self._text_head: dict[int, str] = {}  # block key -> its text delta event up to the text

    def start(self, source_id: str | None, created: int | None, usage: Usage | None) -> bytes:
        u = render_usage(usage or Usage())  # from an OpenAI upstream: zeros, the counts come at the end
        message = {
            "id": new_id("msg_", source_id),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": u,
        }
        return _event("message_start", dumps({"type": "message_start", "message": message}))

    def _begin(self, key: int, block: dict) -> bytes:
        out = self._close()
        index = self._index[key] = len(self._index)
        self._open = key
        return out + _event(
            "content_block_start",
            f'{{"type":"content_block_start","index":{index},"content_block":{dumps(block)}}}',
        )

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        index = self._index[self._open]
        self._open = None
        return _event("content_block_stop", f'{{"type":"content_block_stop","index":{index}}}')

    def text(self, key: int, text: str) -> bytes:
        head = self._text_head.get(key)
        if head is not None:  # the common event: one string encoded between a fixed head and tail
            return (head + dumps_str(text) + "}}\n\n").encode()
        out = self._begin(key, {"type": "text", "text": ""})
        head = self._text_head[key] = (
            'event: content_block_delta\ndata: {"type":"content_block_delta",'
            f'"index":{self._index[key]},"delta":{{"type":"text_delta","text":'
        )
        return out + (head + dumps_str(text) + "}}\n\n").encode()

    def tool(self, key: int, call_id: str, name: str) -> bytes:
        return self._begin(key, {"type": "tool_use", "id": call_id, "name": name, "input": {}})

    def args(self, key: int, fragment: str) -> bytes:
        return _event(
            "content_block_delta",
            f'{{"type":"content_block_delta","index":{self._index[key]},'
            f'"delta":{{"type":"input_json_delta","partial_json":{dumps_str(fragment)}}}}}',
        )

    def end(self, key: int) -> bytes:
        return self._close() if key == self._open else b""

    def finish(self, stop: Stop, stop_sequence: str | None, usage: Usage | None) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": STOP_TO_REASON[stop], "stop_sequence": stop_sequence},
            "usage": render_usage(usage or Usage()),
        }
        return (
            self._close()
            + _event("message_delta", dumps(delta))
            + _event("message_stop", '{"type":"message_stop"}')
        )

    def error(self, status: int, message: str) -> bytes:
        body = {"type": "error", "error": {"type": error_type("anthropic", status), "message": message}}
        return _event("error", dumps(body))
