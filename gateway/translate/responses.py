"""OpenAI Responses (``/v1/responses``, what Codex CLI speaks) <-> the hub.

Leading system prompts become ``instructions``; later ones stay developer messages in ``input``. Function
tools are written with ``strict: false``: the Responses API defaults to strict schemas, which most tool
schemas written for other APIs (Claude Code's included) do not satisfy. Requests from other formats are
sent with ``store: false`` (the client never asked the provider to keep them).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from gateway.errors import error_type
from gateway.translate import namespaces, policy
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
    count,
    dumps,
    dumps_str,
    invalid,
    loads,
    new_id,
    sub_object,
    untranslatable,
    want,
)

ToolNames = Mapping[str, tuple[str, str]]  # flat tool name -> (namespace, name): gateway.translate.namespaces
_HANDLED = frozenset(
    "model instructions input tools tool_choice parallel_tool_calls max_output_tokens temperature top_p "
    "stream user reasoning text truncation previous_response_id conversation background top_logprobs "
    "max_tool_calls prompt".split()
)
# Fields that make the request depend on state kept by OpenAI, or change what comes back.
_STATEFUL_OR_UNIQUE = {
    "previous_response_id": "a stored previous response (stateful)",
    "conversation": "a stored conversation (stateful)",
    "prompt": "a stored prompt template",
    "background": "background mode",
    "max_tool_calls": "a cap on built-in tool calls",
    "top_logprobs": "token logprobs",
}
_KNOWN = _HANDLED | policy.TOP_LEVEL["responses"]


# ------------------------------------------------------------------------------------------------ request


def _parts(content: object, where: str, dst: str) -> list:
    if isinstance(content, str):
        return [Text(content)] if content else []
    parts: list = []
    for j, p in enumerate(want(content, list, where)):
        w = f"{where}[{j}]"
        kind = want(p, dict, w).get("type")
        if kind in ("input_text", "output_text"):
            parts.append(Text(want(p.get("text"), str, f"{w}.text")))
        elif kind == "refusal":
            parts.append(Text(want(p.get("refusal"), str, f"{w}.refusal")))
        elif kind == "input_image" and isinstance(p.get("image_url"), str):
            parts.append(Image(p["image_url"]))
        elif kind == "input_image":
            raise untranslatable(f"{w}.file_id", dst, "an image given by file id")
        else:
            raise untranslatable(f"{w}.type", dst, f"a {kind!r} content part")
    return parts


def parse_request(body: dict, dst: str, strict: bool = False) -> Request:
    req = Request(strict=strict)
    req.screen(body, dst, _KNOWN, _STATEFUL_OR_UNIQUE, (None, False, 0))
    if body.get("truncation") not in (None, "disabled"):
        raise untranslatable("truncation", dst, f"truncation {body['truncation']!r}")
    if "message.output_text.logprobs" in (body.get("include") or ()):
        raise untranslatable("include", dst, "message.output_text.logprobs")
    if body.get("instructions"):
        req.messages.append(Message("system", [Text(want(body["instructions"], str, "instructions"))]))
    _parse_input(req, body.get("input"), dst)
    _parse_tools(req, body.get("tools"), dst)
    req.openai_tool_choice(body.get("tool_choice"), dst, lambda tc: tc.get("name"))
    req.parallel_tool_calls = body.get("parallel_tool_calls")
    req.max_tokens = body.get("max_output_tokens")
    req.source_fields["max_tokens"] = "max_output_tokens"
    req.temperature = body.get("temperature")
    req.top_p = body.get("top_p")
    req.stream = bool(body.get("stream"))
    req.user = body.get("user")
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict):
        req.reasoning_effort = reasoning.get("effort")
    text = body.get("text")
    if isinstance(text, dict):
        req.verbosity = text.get("verbosity")
        fmt = text.get("format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_object":
            req.response_format = {"type": "json_object"}
        elif isinstance(fmt, dict) and fmt.get("type") == "json_schema":
            schema = {k: v for k, v in fmt.items() if k != "type"}
            req.response_format = {"type": "json_schema", "json_schema": schema}
        req.source_fields["response_format"] = "text.format"
    return req


def _parse_input(req: Request, items: object, dst: str) -> None:
    """`input`: a string (one user message) or a list of items, each a message, a function call (joined to
    the assistant turn before it), a function's output or prior reasoning (dropped)."""
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    for i, item in enumerate(want(items, list, "input")):
        w = f"input[{i}]"
        kind = want(item, dict, w).get("type", "message")
        if kind == "message":
            role = item.get("role")
            parts = _parts(item.get("content"), f"{w}.content", dst)
            if role in ("system", "developer"):
                req.messages.append(Message("system", parts))
            elif role in ("user", "assistant"):
                req.messages.append(Message(role, parts))
            else:
                raise invalid(f"{w}.role", f"unknown role {role!r}")
        elif kind == "function_call":
            name = want(item.get("name"), str, f"{w}.name")
            if isinstance(item.get("namespace"), str):  # a namespaced tool's call (Codex): its flat name
                name = namespaces.flat_name(item["namespace"], name)
            arguments = want(item.get("arguments", ""), str, f"{w}.arguments")
            call = ToolCall(want(item.get("call_id"), str, f"{w}.call_id"), name, arguments)
            last = req.messages[-1] if req.messages else None
            if last is not None and last.role == "assistant":
                last.parts.append(call)
            else:
                req.messages.append(Message("assistant", [call]))
        elif kind == "function_call_output":
            output = item.get("output")
            content = _parts(output, f"{w}.output", dst) if output else []
            call_id = want(item.get("call_id"), str, f"{w}.call_id")
            req.messages.append(Message("tool", [ToolResult(call_id, content)]))
        elif kind == "reasoning":
            continue  # policy.DROPPED: encrypted prior reasoning
        else:
            raise untranslatable(f"{w}.type", dst, f"a {kind!r} input item")


def _parse_tools(req: Request, tools: object, dst: str) -> None:
    """`tools`: functions, and Codex's namespaces of them (flattened); a built-in tool is unknown."""
    for i, t in enumerate(tools or []):
        w = f"tools[{i}]"
        kind = want(t, dict, w).get("type")
        if kind == "namespace":  # Codex: function tools grouped under a name, flattened (namespaces)
            ns = want(t.get("name"), str, f"{w}.name")
            for j, sub in enumerate(want(t.get("tools") or [], list, f"{w}.tools")):
                sw = f"{w}.tools[{j}]"
                if want(sub, dict, sw).get("type", "function") != "function":
                    req.unknown(f"tools[{ns}.{sub.get('type')}]", dst, f"the {sub.get('type')!r} tool")
                    continue
                params = sub.get("parameters") or {"type": "object", "properties": {}}
                name = namespaces.flat_name(ns, want(sub.get("name"), str, f"{sw}.name"))
                req.tools.append(Tool(name, sub.get("description"), params))
            continue
        if kind != "function":  # a built-in tool (web_search, ...) that runs at OpenAI
            req.unknown(f"tools[{kind}]", dst, f"the built-in tool {kind!r}")
            continue
        params = t.get("parameters") or {"type": "object", "properties": {}}
        req.tools.append(Tool(want(t.get("name"), str, f"{w}.name"), t.get("description"), params))


def _input_parts(parts: list, text_kind: str) -> list[dict]:
    out = []
    for p in parts:
        if isinstance(p, Text):
            out.append({"type": text_kind, "text": p.text})
        else:
            out.append({"type": "input_image", "image_url": p.url, "detail": "auto"})
    return out


def render_request(req: Request, model: str) -> dict:
    if req.stop:
        raise untranslatable(req.src("stop"), "responses", "stop sequences")
    instructions: list[str] = []
    items: list[dict] = []
    for m in req.messages:
        if m.role == "system":
            if not items:
                instructions.extend(p.text for p in m.parts if isinstance(p, Text))
                if any(isinstance(p, Image) for p in m.parts):
                    raise untranslatable("system message", "responses", "an image in a system message")
            else:
                items.append(
                    {"type": "message", "role": "developer", "content": _input_parts(m.parts, "input_text")}
                )
        elif m.role == "user":
            items.append({"type": "message", "role": "user", "content": _input_parts(m.parts, "input_text")})
        elif m.role == "assistant":
            text = [p for p in m.parts if isinstance(p, Text)]
            if text:
                content = [{"type": "output_text", "text": p.text, "annotations": []} for p in text]
                items.append({"type": "message", "role": "assistant", "content": content})
            for c in m.parts:
                if isinstance(c, ToolCall):
                    items.append(
                        {"type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments}
                    )
        else:
            for r in m.parts:
                assert isinstance(r, ToolResult)
                if any(isinstance(p, Image) for p in r.content):
                    output: str | list = _input_parts(r.content, "input_text")
                else:
                    output = "\n\n".join(p.text for p in r.content if isinstance(p, Text))
                items.append({"type": "function_call_output", "call_id": r.call_id, "output": output})
    body: dict = {"model": model}
    if instructions:
        body["instructions"] = "\n\n".join(instructions)
    body["input"] = items
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "name": t.name,
                **({"description": t.description} if t.description else {}),
                "parameters": t.parameters,
                "strict": False,
            }
            for t in req.tools
        ]
    if req.tool_choice == "tool":
        body["tool_choice"] = {"type": "function", "name": req.tool_name}
    elif req.tool_choice:
        body["tool_choice"] = req.tool_choice
    if req.parallel_tool_calls is not None and req.tools:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_tokens is not None:
        body["max_output_tokens"] = req.max_tokens
    if req.temperature is not None:
        body["temperature"] = req.temperature
    if req.top_p is not None:
        body["top_p"] = req.top_p
    if req.user is not None:
        body["user"] = req.user
    effort = req.reasoning_effort or policy.effort_for_openai(req)
    if effort is not None:
        body["reasoning"] = {"effort": effort}
    text: dict = {}
    rf = req.response_format
    if rf is not None:
        text["format"] = (
            {"type": "json_schema", **rf.get("json_schema", {})} if rf["type"] == "json_schema" else rf
        )
    if req.verbosity is not None:
        text["verbosity"] = req.verbosity
    if text:
        body["text"] = text
    body["store"] = False
    if req.stream:
        body["stream"] = True
    return body


# ----------------------------------------------------------------------------------------------- response


def parse_usage(u: object) -> Usage | None:
    if not isinstance(u, dict):
        return None
    details, out_details = sub_object(u, "input_tokens_details"), sub_object(u, "output_tokens_details")
    return Usage(
        input=count(u.get("input_tokens")),
        output=count(u.get("output_tokens")),
        cached=count(details.get("cached_tokens")),
        cache_write=count(details.get("cache_write_tokens")),
        reasoning=count(out_details.get("reasoning_tokens")),
    )


def render_usage(u: Usage) -> dict:
    return {
        "input_tokens": u.input,
        "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": u.cache_write},
        "output_tokens": u.output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning},
        "total_tokens": u.input + u.output,
    }


def _stop(response: dict, has_calls: bool) -> Stop:
    if response.get("status") == "incomplete":
        reason = (response.get("incomplete_details") or {}).get("reason")
        return "filter" if reason == "content_filter" else "length"
    return "tool" if has_calls else "end"


def parse_response(body: dict) -> Reply:
    """An upstream's answer; a field of the wrong JSON type raises (the caller answers 502)."""
    parts: list = []
    for i, item in enumerate(want(body.get("output") or [], list, "output")):
        w = f"output[{i}]"
        kind = want(item, dict, w).get("type")
        if kind == "message":
            for j, c in enumerate(want(item.get("content") or [], list, f"{w}.content")):
                cw = f"{w}.content[{j}]"
                ctype = want(c, dict, cw).get("type")
                if ctype == "output_text":
                    parts.append(Text(want(c.get("text", ""), str, f"{cw}.text")))
                elif ctype == "refusal":
                    parts.append(Text(want(c.get("refusal", ""), str, f"{cw}.refusal")))
        elif kind == "function_call":
            parts.append(
                ToolCall(
                    want(item.get("call_id"), str, f"{w}.call_id"),
                    want(item.get("name"), str, f"{w}.name"),
                    want(item.get("arguments") or "{}", str, f"{w}.arguments"),
                )
            )
    stop = _stop(body, any(isinstance(p, ToolCall) for p in parts))
    rid, created = body.get("id"), body.get("created_at")
    return Reply(
        rid if isinstance(rid, str) else None, parts, stop, parse_usage(body.get("usage")),
        created=int(created) if isinstance(created, (int, float)) and 0 < created < 2**40 else None,
    )  # fmt: skip


def _status(stop: Stop) -> tuple[str, dict | None]:
    if stop == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if stop == "filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def _shell(rid: str, model: str, created: int, status: str) -> dict:
    """A Response object with every field the SDK's model requires."""
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        "temperature": None,
        "tool_choice": "auto",
        "tools": [],
        "top_p": None,
        "usage": None,
    }


def _message_item(item_id: str, text: str, status: str = "completed") -> dict:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": [part]}


def _call_item(call: ToolCall, status: str = "completed", names: ToolNames | None = None) -> dict:
    namespace, name = namespaces.split(call.name, names)
    item = {
        "id": new_id("fc_", call.id),
        "type": "function_call",
        "status": status,
        "call_id": call.id,
        "name": name,
        "arguments": call.arguments or "{}",
    }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def render_response(reply: Reply, model: str, created: int | None, names: ToolNames | None = None) -> dict:
    rid = new_id("resp_", reply.id)
    status, incomplete = _status(reply.stop)
    body = _shell(rid, model, created or reply.created or int(time.time()), status)
    body["incomplete_details"] = incomplete
    text = "".join(p.text for p in reply.parts if isinstance(p, Text))
    if text:
        body["output"].append(_message_item(new_id("msg_", f"{rid}_0"), text))
    body["output"].extend(_call_item(p, names=names) for p in reply.parts if isinstance(p, ToolCall))
    if reply.usage is not None:
        body["usage"] = render_usage(reply.usage)
    return body


# ------------------------------------------------------------------------------------------------ streams


class Decoder:
    """Responses SSE events -> hub stream events (reasoning items and other events are skipped)."""

    def __init__(self, on_usage: Callable[[dict], object] | None = None) -> None:
        """``on_usage``: called with each parsed event that can carry usage (for the gateway's accounting)."""
        self.on_usage = on_usage
        self.usage = Usage()
        self.seen_usage = False
        self.finished = False
        self._keys: dict[object, int] = {}  # output_index (as the upstream sent it) -> block key
        self._args: dict[int, bool] = {}  # block key of a function call -> arguments seen
        self._next = 0

    def _key(self, obj: dict) -> int | None:
        return self._keys.get(obj.get("output_index"))

    def feed(self, data: str, out: list) -> None:
        obj = loads(data)
        if not isinstance(obj, dict):
            return
        kind = obj.get("type")
        if self.on_usage is not None and "response" in obj:  # any event with the response may have usage
            self.on_usage(obj)
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            key = self._key(obj)
            if key is not None and obj.get("delta"):
                out.append(("text", key, obj["delta"]))
        elif kind == "response.function_call_arguments.delta":
            key = self._key(obj)
            if key is not None and obj.get("delta"):
                self._args[key] = True
                out.append(("args", key, obj["delta"]))
        elif kind == "response.output_item.added":
            item = obj.get("item") or {}
            if item.get("type") not in ("message", "function_call"):
                return
            key = self._keys[obj.get("output_index")] = self._next
            self._next += 1
            if item["type"] == "function_call":
                self._args[key] = False
                out.append(("tool", key, item.get("call_id") or new_id("call_"), item.get("name") or ""))
        elif kind == "response.output_item.done":
            key = self._key(obj)
            if key is None:
                return
            item = obj.get("item") or {}
            if self._args.get(key) is False and item.get("arguments"):  # arguments not streamed
                out.append(("args", key, item["arguments"]))
            out.append(("end", key))
        elif kind == "response.created":
            resp = obj.get("response") or {}
            created = resp.get("created_at")
            out.append(("start", resp.get("id"), int(created) if created else None, None))
        elif kind in ("response.completed", "response.incomplete"):
            resp = obj.get("response") or {}
            usage = parse_usage(resp.get("usage"))
            if usage is not None:
                self.usage, self.seen_usage = usage, True
            self.finished = True
            out.append(
                ("finish", _stop(resp, any(v is not None for v in self._args.values())), None, self.usage)
            )
        elif kind in ("error", "response.failed"):
            if self.finished:
                return
            self.finished = True
            err = obj if kind == "error" else ((obj.get("response") or {}).get("error") or {})
            status = 429 if err.get("code") == "rate_limit_exceeded" else 502
            out.append(("error", status, err.get("message") or "upstream error"))

    def end(self, out: list) -> None:
        if not self.finished:
            self.finished = True
            out.append(("error", 502, "the upstream stream ended before the answer was complete"))


class Encoder:
    """Hub stream events -> Responses SSE, each event with its ``type`` and ``sequence_number``."""

    def __init__(self, model: str, created: int | None, names: ToolNames | None = None) -> None:
        self.model = model
        self.created = created
        self.names = names  # namespaced tools of the client's request (gateway.translate.namespaces)
        self._seq = 0
        self._id = ""
        # block key -> [output_index, item id, kind, texts (, the call)]
        self._items: dict[int, list] = {}
        self._done: list[dict] = []  # finished output items, in output order
        self._ended: set[int] = set()

    def _event(self, kind: str, fields: str) -> bytes:
        seq = self._seq
        self._seq += 1
        return f'event: {kind}\ndata: {{"type":"{kind}","sequence_number":{seq},{fields}}}\n\n'.encode()

    def start(self, source_id: str | None, created: int | None, usage: Usage | None) -> bytes:
        self._id = new_id("resp_", source_id)
        self._created = self.created or created or int(time.time())
        shell = dumps(_shell(self._id, self.model, self._created, "in_progress"))
        return self._event("response.created", '"response":' + shell) + self._event(
            "response.in_progress", '"response":' + shell
        )

    def text(self, key: int, text: str) -> bytes:
        out = b""
        state = self._items.get(key)
        if state is None:
            index = len(self._items)
            item_id = new_id("msg_", f"{self._id}_{index}")
            state = self._items[key] = [index, item_id, "message", []]
            added = dumps({"id": item_id, "type": "message", "status": "in_progress", "role": "assistant",
                           "content": []})  # fmt: skip
            out = self._event(
                "response.output_item.added", f'"output_index":{index},"item":{added}'
            ) + self._event(
                "response.content_part.added",
                f'"item_id":"{item_id}","output_index":{index},"content_index":0,'
                '"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}',
            )
        state[3].append(text)
        return out + self._event(
            "response.output_text.delta",
            f'"item_id":"{state[1]}","output_index":{state[0]},"content_index":0,"delta":{dumps_str(text)},"logprobs":[]',
        )

    def tool(self, key: int, call_id: str, name: str) -> bytes:
        index = len(self._items)
        call = ToolCall(call_id, name, "")
        item = _call_item(call, "in_progress", self.names)
        item["arguments"] = ""
        self._items[key] = [index, item["id"], "function_call", [], call]
        return self._event("response.output_item.added", f'"output_index":{index},"item":{dumps(item)}')

    def args(self, key: int, fragment: str) -> bytes:
        state = self._items[key]
        state[3].append(fragment)
        return self._event(
            "response.function_call_arguments.delta",
            f'"item_id":"{state[1]}","output_index":{state[0]},"delta":{dumps_str(fragment)}',
        )

    def end(self, key: int) -> bytes:
        state = self._items.get(key)
        if state is None or key in self._ended:
            return b""
        self._ended.add(key)
        index, item_id = state[0], state[1]
        if state[2] == "message":
            text = "".join(state[3])
            item = _message_item(item_id, text)
            part = dumps(item["content"][0])
            self._done.append(item)
            return (
                self._event(
                    "response.output_text.done",
                    f'"item_id":"{item_id}","output_index":{index},"content_index":0,"text":{dumps(text)},"logprobs":[]',
                )
                + self._event(
                    "response.content_part.done",
                    f'"item_id":"{item_id}","output_index":{index},"content_index":0,"part":{part}',
                )
                + self._event("response.output_item.done", f'"output_index":{index},"item":{dumps(item)}')
            )
        call: ToolCall = state[4]
        call.arguments = "".join(state[3]) or "{}"
        item = _call_item(call, names=self.names)
        self._done.append(item)
        return self._event(
            "response.function_call_arguments.done",
            f'"item_id":"{item_id}","output_index":{index},"name":{dumps(item["name"])},"arguments":{dumps(call.arguments)}',
        ) + self._event("response.output_item.done", f'"output_index":{index},"item":{dumps(item)}')

    def finish(self, stop: Stop, stop_sequence: str | None, usage: Usage | None) -> bytes:
        out = b"".join(self.end(key) for key in list(self._items))
        status, incomplete = _status(stop)
        resp = _shell(self._id, self.model, self._created, status)
        resp["incomplete_details"] = incomplete
        resp["output"] = self._done
        resp["usage"] = render_usage(usage) if usage is not None else None
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._event(kind, '"response":' + dumps(resp))

    def error(self, status: int, message: str) -> bytes:
        code = "rate_limit_exceeded" if status == 429 else "server_error"
        if not self._id:
            self._id, self._created = new_id("resp_"), self.created or int(time.time())
        resp = _shell(self._id, self.model, self._created, "failed")
        resp["error"] = {"code": code, "message": message}
        resp["output"] = self._done
        err = f'"code":{dumps(error_type("openai", status))},"message":{dumps(message)},"param":null'
        return self._event("error", err) + self._event("response.failed", '"response":' + dumps(resp))
