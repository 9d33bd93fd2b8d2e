"""OpenAI chat completions (``/v1/chat/completions``) <-> the hub."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from gateway.errors import sse_error_event
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
    count,
    dumps,
    dumps_str,
    loads,
    new_id,
    sub_object,
    untranslatable,
    want,
)

FINISH_TO_STOP: dict[str, Stop] = {
    "stop": "end",
    "length": "length",
    "tool_calls": "tool",
    "function_call": "tool",
    "content_filter": "filter",
}
STOP_TO_FINISH: dict[str, str] = {
    "end": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "tool": "tool_calls",
    "filter": "content_filter",
}

# Fields read into the hub; the rest must be in policy.TOP_LEVEL["chat"] or the request is refused.
_HANDLED = frozenset(
    "model messages tools tool_choice parallel_tool_calls max_tokens max_completion_tokens temperature top_p "
    "stop stream user reasoning_effort verbosity response_format n logprobs modalities".split()
)
# Chat-only sampling fields: refused unless they hold their neutral value.
_NEUTRAL = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "seed": None,
    "logit_bias": None,
    "top_logprobs": None,
}


# ------------------------------------------------------------------------------------------------ request


def _parts(content: object, where: str, dst: str) -> list:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)] if content else []
    parts: list = []
    for j, p in enumerate(want(content, list, where)):
        w = f"{where}[{j}]"
        kind = want(p, dict, w).get("type")
        if kind == "text":
            parts.append(Text(want(p.get("text"), str, f"{w}.text")))
        elif kind == "refusal":
            parts.append(Text(want(p.get("refusal"), str, f"{w}.refusal")))
        elif kind == "image_url":
            url = want(p.get("image_url"), dict, f"{w}.image_url").get("url")
            parts.append(Image(want(url, str, f"{w}.image_url.url")))
        else:
            raise untranslatable(f"{w}.type", dst, f"a {kind!r} content part")
    return parts


def parse_request(body: dict, dst: str, strict: bool = False) -> Request:
    req = Request(strict=strict)
    for key, value in body.items():
        if key in _HANDLED or key in policy.TOP_LEVEL["chat"]:
            continue
        if key in _NEUTRAL:
            if value in (None, _NEUTRAL[key]):
                continue
            raise untranslatable(key, dst, f"the value {json.dumps(value)[:40]}")
        req.unknown(key, dst)
    n = body.get("n")
    if n not in (None, 1):
        raise untranslatable("n", dst, f"{n} choices")
    if body.get("logprobs"):
        raise untranslatable("logprobs", dst, "token logprobs")
    modalities = body.get("modalities")
    if modalities not in (None, ["text"]):
        raise untranslatable("modalities", dst, f"output modalities {modalities}")

    msgs = want(body.get("messages"), list, "messages")
    for i, m in enumerate(msgs):
        w = f"messages[{i}]"
        role = want(m, dict, w).get("role")
        if role in ("system", "developer"):
            req.messages.append(Message("system", _parts(m.get("content"), f"{w}.content", dst)))
        elif role == "user":
            req.messages.append(Message("user", _parts(m.get("content"), f"{w}.content", dst)))
        elif role == "assistant":
            if m.get("audio"):
                raise untranslatable(f"{w}.audio", dst, "assistant audio")
            parts = _parts(m.get("content"), f"{w}.content", dst)
            if m.get("refusal"):
                parts.append(Text(m["refusal"]))
            for k, tc in enumerate(m.get("tool_calls") or []):
                tw = f"{w}.tool_calls[{k}]"
                if want(tc, dict, tw).get("type", "function") != "function":
                    raise untranslatable(f"{tw}.type", dst, f"a {tc.get('type')!r} tool call")
                fn = want(tc.get("function"), dict, f"{tw}.function")
                parts.append(
                    ToolCall(
                        want(tc.get("id"), str, f"{tw}.id"),
                        want(fn.get("name"), str, f"{tw}.function.name"),
                        want(fn.get("arguments", ""), str, f"{tw}.function.arguments"),
                    )
                )
            req.messages.append(Message("assistant", parts))
        elif role == "tool":
            call_id = want(m.get("tool_call_id"), str, f"{w}.tool_call_id")
            content = _parts(m.get("content"), f"{w}.content", dst)
            req.messages.append(Message("tool", [ToolResult(call_id, content)]))
        else:
            raise untranslatable(f"{w}.role", dst, f"role {role!r}")

    for i, t in enumerate(body.get("tools") or []):
        w = f"tools[{i}]"
        if want(t, dict, w).get("type") != "function":
            raise untranslatable(f"{w}.type", dst, f"a {t.get('type')!r} tool")
        fn = want(t.get("function"), dict, f"{w}.function")
        req.tools.append(
            Tool(
                want(fn.get("name"), str, f"{w}.function.name"),
                fn.get("description"),
                fn.get("parameters") or {"type": "object", "properties": {}},
            )
        )
    req.openai_tool_choice(
        body.get("tool_choice"),
        dst,
        lambda tc: want(tc.get("function"), dict, "tool_choice.function").get("name"),
    )
    req.parallel_tool_calls = body.get("parallel_tool_calls")
    req.max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
    req.source_fields["max_tokens"] = (
        "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    )
    req.temperature = body.get("temperature")
    req.top_p = body.get("top_p")
    stop = body.get("stop")
    if stop is not None:
        req.stop = [stop] if isinstance(stop, str) else list(want(stop, list, "stop"))
    req.stream = bool(body.get("stream"))
    req.user = body.get("user")
    req.reasoning_effort = body.get("reasoning_effort")
    req.verbosity = body.get("verbosity")
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") != "text":
        req.response_format = rf
    return req


def _content(parts: list[Text | Image]) -> str | list:
    if len(parts) == 1 and isinstance(parts[0], Text):
        return parts[0].text
    out = []
    for p in parts:
        if isinstance(p, Text):
            out.append({"type": "text", "text": p.text})
        else:
            out.append({"type": "image_url", "image_url": {"url": p.url}})
    return out


def render_request(req: Request, model: str) -> dict:
    messages: list[dict] = []
    for m in req.messages:
        if m.role == "system":
            messages.append({"role": "system", "content": _content(m.parts)})
        elif m.role == "user":
            messages.append({"role": "user", "content": _content(m.parts)})
        elif m.role == "assistant":
            text = [p for p in m.parts if isinstance(p, Text)]
            calls = [p for p in m.parts if isinstance(p, ToolCall)]
            msg: dict = {"role": "assistant", "content": "".join(p.text for p in text) if text else None}
            if calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in calls
                ]
            messages.append(msg)
        else:
            for r in m.parts:
                assert isinstance(r, ToolResult)
                if any(isinstance(p, Image) for p in r.content):
                    raise untranslatable(f"tool result {r.call_id}", "chat", "an image in a tool result")
                content = "\n\n".join(p.text for p in r.content if isinstance(p, Text))
                messages.append({"role": "tool", "tool_call_id": r.call_id, "content": content})
    body: dict = {"model": model, "messages": messages}
    if req.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description else {}),
                    "parameters": t.parameters,
                },
            }
            for t in req.tools
        ]
    if req.tool_choice == "tool":
        body["tool_choice"] = {"type": "function", "function": {"name": req.tool_name}}
    elif req.tool_choice:
        body["tool_choice"] = req.tool_choice
    if req.parallel_tool_calls is not None and req.tools:
        body["parallel_tool_calls"] = req.parallel_tool_calls
    if req.max_tokens is not None:
        body["max_completion_tokens"] = req.max_tokens
    for name in ("temperature", "top_p", "stop", "user", "reasoning_effort", "verbosity", "response_format"):
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    effort = policy.effort_for_openai(req)
    if effort is not None:
        body["reasoning_effort"] = effort
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


# ----------------------------------------------------------------------------------------------- response


def parse_usage(u: object) -> Usage | None:
    if not isinstance(u, dict):
        return None
    pd = sub_object(u, "prompt_tokens_details")
    cd = sub_object(u, "completion_tokens_details")
    return Usage(
        input=count(u.get("prompt_tokens")),
        output=count(u.get("completion_tokens")),
        cached=count(pd.get("cached_tokens")),
        cache_write=count(pd.get("cache_write_tokens")),
        reasoning=count(cd.get("reasoning_tokens")),
    )


def render_usage(u: Usage) -> dict:
    return {
        "prompt_tokens": u.input,
        "completion_tokens": u.output,
        "total_tokens": u.input + u.output,
        "prompt_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": u.cache_write},
        "completion_tokens_details": {"reasoning_tokens": u.reasoning},
    }


def parse_response(body: dict) -> Reply:
    """An upstream's answer; a field of the wrong JSON type (content that is a number, a tool call that is
    no object, ...) raises, and the caller answers the client 502 instead of passing it on translated."""
    choices = want(body.get("choices") or [{}], list, "choices")
    choice = want(choices[0], dict, "choices[0]")
    msg = want(choice.get("message") or {}, dict, "choices[0].message")
    parts: list = []
    content = msg.get("content")
    if isinstance(content, list):  # text parts, as some OpenAI-compatible servers answer
        content = "".join(
            want(c.get("text"), str, "choices[0].message.content[].text")
            for c in content
            if isinstance(c, dict) and c.get("type") in ("text", "output_text")
        )
    if content:
        parts.append(Text(want(content, str, "choices[0].message.content")))
    if msg.get("refusal"):
        parts.append(Text(want(msg["refusal"], str, "choices[0].message.refusal")))
    for i, tc in enumerate(want(msg.get("tool_calls") or [], list, "choices[0].message.tool_calls")):
        w = f"choices[0].message.tool_calls[{i}]"
        fn = want(want(tc, dict, w).get("function") or {}, dict, f"{w}.function")
        parts.append(
            ToolCall(
                want(tc.get("id") or new_id("call_"), str, f"{w}.id"),
                want(fn.get("name", ""), str, f"{w}.function.name"),
                want(fn.get("arguments") or "{}", str, f"{w}.function.arguments"),
            )
        )
    finish = choice.get("finish_reason")
    stop = FINISH_TO_STOP.get(finish if isinstance(finish, str) else "stop", "end")
    rid, created = body.get("id"), body.get("created")
    return Reply(
        rid if isinstance(rid, str) else None, parts, stop, parse_usage(body.get("usage")),
        created=created if isinstance(created, int) and not isinstance(created, bool) else None,
    )  # fmt: skip


def render_response(reply: Reply, model: str, created: int | None) -> dict:
    text = "".join(p.text for p in reply.parts if isinstance(p, Text))
    calls = [p for p in reply.parts if isinstance(p, ToolCall)]
    message: dict = {"role": "assistant", "content": text or None, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments or "{}"}}
            for c in calls
        ]
    body: dict = {
        "id": new_id("chatcmpl-", reply.id),
        "object": "chat.completion",
        "created": created or reply.created or int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": STOP_TO_FINISH[reply.stop]}
        ],
    }
    if reply.usage is not None:
        body["usage"] = render_usage(reply.usage)
    return body


# ------------------------------------------------------------------------------------------------ streams


class Decoder:
    """Chat chunks -> hub stream events. Usage comes in the last chunk (include_usage), after the
    finish_reason chunk, so the finish event is sent at ``[DONE]`` (or at the end of the bytes)."""

    def __init__(self, on_usage: Callable[[dict], object] | None = None) -> None:
        """``on_usage``: called with each parsed event that can carry usage (for the gateway's accounting)."""
        self.on_usage = on_usage
        self.usage = Usage()
        self.seen_usage = False
        self.started = False
        self.finished = False
        self._stop: Stop | None = None
        self._open: int | None = None  # key of the open block
        self._open_text = False
        self._tools: dict[int, int] = {}  # tool_calls index -> block key
        self._next = 0

    def feed(self, data: str, out: list) -> None:
        if data == "[DONE]":
            self._finish(out)
            return
        obj = loads(data)
        if not isinstance(obj, dict):
            return
        if "error" in obj and isinstance(obj["error"], dict):
            err = obj["error"]
            out.append(
                ("error", err.get("code") if isinstance(err.get("code"), int) else 502, err.get("message"))
            )
            self.finished = True
            return
        if not self.started:
            self.started = True
            out.append(("start", obj.get("id"), obj.get("created"), None))
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            text = delta.get("content") or delta.get("refusal")
            if text:
                if not self._open_text:
                    self._close(out)
                    self._open, self._open_text = self._next, True
                    self._next += 1
                out.append(("text", self._open, text))
            for tc in delta.get("tool_calls") or ():
                idx = tc.get("index", 0)
                fn = tc.get("function") or {}
                key = self._tools.get(idx)
                if key is None:
                    self._close(out)
                    key = self._tools[idx] = self._open = self._next
                    self._next += 1
                    out.append(("tool", key, tc.get("id") or new_id("call_"), fn.get("name") or ""))
                if fn.get("arguments"):
                    out.append(("args", key, fn["arguments"]))
            if choice.get("finish_reason"):
                self._stop = FINISH_TO_STOP.get(choice["finish_reason"], "end")
                self._close(out)
        u = obj.get("usage")
        if isinstance(u, dict):
            self.usage = parse_usage(u) or self.usage
            self.seen_usage = True
            if self.on_usage is not None:
                self.on_usage(obj)

    def _close(self, out: list) -> None:
        if self._open is not None:
            out.append(("end", self._open))
            self._open, self._open_text = None, False

    def _finish(self, out: list) -> None:
        if self.finished:
            return
        self.finished = True
        self._close(out)
        out.append(("finish", self._stop or "end", None, self.usage))

    def end(self, out: list) -> None:
        """The upstream's bytes ended: a stream that said its finish_reason is complete without [DONE]."""
        if not self.finished:
            if self._stop is None:
                out.append(("error", 502, "the upstream stream ended before the answer was complete"))
                self.finished = True
            else:
                self._finish(out)


class Encoder:
    """Hub stream events -> chat.completion.chunk SSE."""

    def __init__(self, model: str, created: int | None, include_usage: bool = True) -> None:
        self.model = model
        self.created = created
        self.include_usage = include_usage
        self._head = ""
        self._text_head = ""  # a text delta chunk up to its text (the common event, written without _chunk)
        self._tools: dict[int, list] = {}  # block key -> [tool_calls index, saw arguments]

    def _chunk(self, delta: str, finish: str = "null") -> bytes:
        return (
            f'data: {self._head}"choices":[{{"index":0,"delta":{delta},"logprobs":null,'
            f'"finish_reason":{finish}}}]}}\n\n'
        ).encode()

    def start(self, source_id: str | None, created: int | None, usage: Usage | None) -> bytes:
        cid = new_id("chatcmpl-", source_id)
        created = self.created or created or int(time.time())
        self._head = f'{{"id":{dumps(cid)},"object":"chat.completion.chunk","created":{created},' + (
            f'"model":{dumps(self.model)},'
        )
        self._text_head = f'data: {self._head}"choices":[{{"index":0,"delta":{{"content":'
        return self._chunk('{"role":"assistant","content":""}')

    def text(self, key: int, text: str) -> bytes:
        return (self._text_head + dumps_str(text) + '},"logprobs":null,"finish_reason":null}]}\n\n').encode()

    def tool(self, key: int, call_id: str, name: str) -> bytes:
        index = len(self._tools)
        self._tools[key] = [index, False]
        call = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        return self._chunk('{"tool_calls":[' + dumps(call) + "]}")

    def args(self, key: int, fragment: str) -> bytes:
        state = self._tools[key]
        state[1] = True
        return self._chunk(
            f'{{"tool_calls":[{{"index":{state[0]},"function":{{"arguments":{dumps_str(fragment)}}}}}]}}'
        )

    def end(self, key: int) -> bytes:
        state = self._tools.get(key)
        if state is not None and not state[1]:  # a call without arguments: chat clients expect JSON
            return self.args(key, "{}")
        return b""

    def finish(self, stop: Stop, stop_sequence: str | None, usage: Usage | None) -> bytes:
        out = self._chunk("{}", dumps(STOP_TO_FINISH[stop]))
        if self.include_usage and usage is not None:
            out += f'data: {self._head}"choices":[],"usage":{dumps(render_usage(usage))}}}\n\n'.encode()
        return out + b"data: [DONE]\n\n"

    def error(self, status: int, message: str) -> bytes:
        return sse_error_event("openai", status, message)
