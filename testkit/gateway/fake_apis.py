"""What the fake upstream (testkit.gateway.fake_upstream) answers: OpenAI chat completions and Responses,
Anthropic Messages and count_tokens, and the model list, whole and streamed (SSE), with numbered words as
text and a deterministic usage, or one call of the request's first tool (``fake.tool_call``).

``FakeAPIs`` is the part of ``FakeUpstream`` that shapes these answers; ``FakeUpstream`` holds their state
(set in its ``__init__``) and sends them through its plumbing, where the faults are played.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Awaitable, Callable

from aiohttp import web

from testkit.gateway.prompt_cache import PromptCache, TooManyBreakpoints


def _words(seq: int) -> list[str]:
    n = 3 + seq % 5
    return [f"w{seq}-{i} " for i in range(n)]


def _input_tokens(body: dict) -> int:
    src = body.get("messages", body.get("input", ""))
    return 5 + len(json.dumps(src)) // 8


def _sse(data: dict | str, event: str | None = None) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


class FakeAPIs:
    """The route handlers of the three APIs and their answers. ``FakeUpstream`` sets the state below and gives
    the plumbing: ``_wrap`` (the request counted, recorded, an error fault answered) and ``_send_json`` /
    ``_send_stream`` (the answer on the wire, with the fault's stalls and drops)."""

    reply: Callable[[dict], str] | None
    replies: deque[str]
    tool_call: dict | None
    # an agent's model (tests/gateway/ops/test_real_agents.py): the request -> (tool, arguments) to call one
    # of its tools, or None to answer with text (``reply``); streamed text is then ``reply``'s too
    agent: Callable[[dict], tuple[str, dict] | None] | None
    usage_log: list[tuple[str, bool, int, int]]
    cache_read_tokens: int
    cache_write_tokens: int
    prompt_cache: PromptCache | None  # Anthropic's prompt cache played (testkit.gateway.prompt_cache)
    _wrap: Callable[..., Awaitable[web.StreamResponse]]
    _send_json: Callable[..., Awaitable[web.StreamResponse]]
    _send_stream: Callable[..., Awaitable[web.StreamResponse]]

    def _text(self, body: dict, words: list[str]) -> str:
        if self.replies:
            return self.replies.popleft()
        return self.reply(body) if self.reply is not None else "".join(words)

    def _log(self, path: str, stream: bool, inp: int, out: int) -> None:
        self.usage_log.append((path, stream, inp, out))

    def _tool_to_call(self, body: dict) -> tuple[str, dict] | None:
        """The tool to call and its arguments (``agent``'s choice, else the request's first tool with
        ``tool_call``), or None: answer with text."""
        if self.agent is not None:
            return self.agent(body)
        tools = body.get("tools")
        if self.tool_call is None or not isinstance(tools, list) or not tools:
            return None
        named = [
            t["function"]["name"] if "function" in t else t.get("name") for t in tools if isinstance(t, dict)
        ]
        named = [n for n in named if isinstance(n, str)]  # a built-in tool (web search) has no name
        return (named[0], self.tool_call) if named else None

    def _stream_words(self, body: dict, words: list[str]) -> list[str]:
        """The text deltas of a streamed answer: the numbered words, or an agent's reply in one piece."""
        return [self._text(body, words)] if self.agent is not None else words

    # --- OpenAI chat -----------------------------------------------------------------------------
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._wrap(request, False, self._chat_body)

    async def _chat_body(self, request, body, seq, fault):
        model = body.get("model", "?")
        words = _words(seq)
        inp, out = _input_tokens(body), len(words)
        rid = f"req_fake_{seq}"
        cid = f"chatcmpl-{seq}"
        created = int(time.time())
        stream = bool(body.get("stream"))
        usage = {"prompt_tokens": inp, "completion_tokens": out, "total_tokens": inp + out}
        if self.cache_read_tokens:
            usage["prompt_tokens_details"] = {"cached_tokens": min(self.cache_read_tokens, inp)}
        call = self._tool_to_call(body)
        tool, args = (call[0], json.dumps(call[1])) if call else (None, "")
        call_id = f"call_{seq}"
        finish_reason = "tool_calls" if tool else "stop"
        if not stream:
            self._log("chat", False, inp, out)
            msg = {"role": "assistant", "content": self._text(body, words), "refusal": None}
            if tool:
                fn = {"name": tool, "arguments": args}
                msg = {"role": "assistant", "content": None, "refusal": None,
                       "tool_calls": [{"id": call_id, "type": "function", "function": fn}]}  # fmt: skip
            obj = {
                "id": cid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": finish_reason}],
                "usage": usage,
            }
            return await self._send_json(request, obj, fault, rid, "x-request-id")
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(delta: dict, finish: str | None) -> bytes:
            c = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            }
            if include_usage:
                c["usage"] = None
            return _sse(c)

        events = [chunk({"role": "assistant", "content": ""}, None)]
        if tool:
            head = {
                "index": 0,
                "id": call_id,
                "type": "function",
                "function": {"name": tool, "arguments": ""},
            }
            events.append(chunk({"tool_calls": [head]}, None))
            half = len(args) // 2
            for part in (args[:half], args[half:]):
                events.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": part}}]}, None))
        else:
            events += [chunk({"content": w}, None) for w in self._stream_words(body, words)]
        events.append(chunk({}, finish_reason))
        if include_usage:
            events.append(
                _sse(
                    {
                        "id": cid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": [],
                        "usage": usage,
                    }
                )
            )
        events.append(_sse("[DONE]"))
        self._log("chat", True, inp, out)
        return await self._send_stream(request, events, fault, rid, "x-request-id")

    # --- OpenAI Responses ------------------------------------------------------------------------
    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._wrap(request, False, self._responses_body)

    async def _responses_body(self, request, body, seq, fault):
        model = body.get("model", "?")
        words = _words(seq)
        inp, out = _input_tokens(body), len(words)
        rid = f"req_fake_{seq}"
        text = "".join(words)
        msg_id = f"msg_{seq}"

        def response(status: str, output: list, usage: dict | None) -> dict:
            return {
                "id": f"resp_{seq}",
                "object": "response",
                "created_at": int(time.time()),
                "status": status,
                "model": model,
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": usage,
            }

        call = self._tool_to_call(body)
        if call is not None:  # a function call: its id fc_<n>, its call id call_<n>
            args = json.dumps(call[1])
            item = {"type": "function_call", "id": f"fc_{seq}", "call_id": f"call_{seq}", "name": call[0],
                    "arguments": args, "status": "completed"}  # fmt: skip
        else:
            text = self._text(body, words) if self.agent is not None else text
            part = {"type": "output_text", "text": text, "annotations": []}
            item = {
                "type": "message",
                "id": msg_id,
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        usage = {
            "input_tokens": inp,
            "output_tokens": out,
            "total_tokens": inp + out,
            "input_tokens_details": {"cached_tokens": min(self.cache_read_tokens, inp)},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        self._log("responses", bool(body.get("stream")), inp, out)
        if not body.get("stream"):
            return await self._send_json(
                request, response("completed", [item], usage), fault, rid, "x-request-id"
            )
        n = 0

        def ev(kind: str, **fields) -> bytes:
            nonlocal n
            n += 1
            return _sse({"type": kind, "sequence_number": n - 1, **fields}, kind)

        if call is not None:
            at = {"item_id": item["id"], "output_index": 0}
            half = len(item["arguments"]) // 2
            events = [
                ev("response.created", response=response("in_progress", [], None)),
                ev("response.output_item.added", output_index=0,
                   item={**item, "arguments": "", "status": "in_progress"}),
                *(ev("response.function_call_arguments.delta", delta=d, **at)
                  for d in (item["arguments"][:half], item["arguments"][half:])),
                ev("response.function_call_arguments.done", arguments=item["arguments"], **at),
                ev("response.output_item.done", output_index=0, item=item),
                ev("response.completed", response=response("completed", [item], usage)),
            ]  # fmt: skip
            return await self._send_stream(request, events, fault, rid, "x-request-id")
        loc = {"item_id": msg_id, "output_index": 0, "content_index": 0}
        events = [
            ev("response.created", response=response("in_progress", [], None)),
            ev(
                "response.output_item.added",
                output_index=0,
                item={**item, "status": "in_progress", "content": []},
            ),
            ev("response.content_part.added", part={**part, "text": ""}, **loc),
        ]
        deltas = [text] if self.agent is not None else words  # an agent's reply in one piece
        events += [ev("response.output_text.delta", delta=d, logprobs=[], **loc) for d in deltas]
        events += [
            ev("response.output_text.done", text=text, logprobs=[], **loc),
            ev("response.content_part.done", part=part, **loc),
            ev("response.output_item.done", output_index=0, item=item),
            ev("response.completed", response=response("completed", [item], usage)),
        ]
        return await self._send_stream(request, events, fault, rid, "x-request-id")

    # --- Anthropic Messages ----------------------------------------------------------------------
    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._wrap(request, True, self._messages_body)

    async def _messages_body(self, request, body, seq, fault):
        model = body.get("model", "?")
        words = _words(seq)
        inp, out = _input_tokens(body), len(words)
        rid = f"req_fake_{seq}"
        try:
            inp, cache = self._anthropic_cache(body, inp)
        except TooManyBreakpoints as e:
            err = {"type": "error", "error": {"type": "invalid_request_error", "message": str(e)}}
            return web.json_response(err, status=400, headers={"request-id": rid})
        message = {
            "id": f"msg_{seq}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [
                {
                    "type": "text",
                    "text": self._text(body, words) if not body.get("stream") else "".join(words),
                }
            ],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": inp, "output_tokens": out, **cache},
        }
        call = self._tool_to_call(body)
        tool = call[0] if call else None
        if call:
            use = {"type": "tool_use", "id": f"toolu_{seq}", "name": call[0], "input": call[1]}
            message.update(content=[use], stop_reason="tool_use")
        self._log("messages", bool(body.get("stream")), inp, out)
        if not body.get("stream"):
            return await self._send_json(request, message, fault, rid, "request-id")
        start = {
            **message,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": inp, "output_tokens": 1, **cache},
        }
        block = {"type": "text", "text": ""}
        if tool:
            block = {"type": "tool_use", "id": f"toolu_{seq}", "name": tool, "input": {}}
        events = [
            _sse({"type": "message_start", "message": start}, "message_start"),
            _sse({"type": "content_block_start", "index": 0, "content_block": block}, "content_block_start"),
            _sse({"type": "ping"}, "ping"),
        ]
        if call:
            args = json.dumps(call[1])
            half = len(args) // 2
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in (args[:half], args[half:])]
        else:
            deltas = [{"type": "text_delta", "text": w} for w in self._stream_words(body, words)]
        events += [
            _sse({"type": "content_block_delta", "index": 0, "delta": d}, "content_block_delta")
            for d in deltas
        ]
        events += [
            _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
            _sse(
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                    "usage": {"output_tokens": out},
                },
                "message_delta",
            ),
            _sse({"type": "message_stop"}, "message_stop"),
        ]
        return await self._send_stream(request, events, fault, rid, "request-id")

    def _anthropic_cache(self, body: dict, inp: int) -> tuple[int, dict]:
        """The input tokens and cache fields of a Messages answer: the prompt cache's (``prompt_cache``),
        else the fixed counts set (``cache_read_tokens``, ``cache_write_tokens``), else none."""
        if self.prompt_cache is not None:
            u = self.prompt_cache.usage(body)
            return u.pop("input_tokens"), u
        if not (self.cache_read_tokens or self.cache_write_tokens):
            return inp, {}
        return inp, {
            "cache_read_input_tokens": self.cache_read_tokens,
            "cache_creation_input_tokens": self.cache_write_tokens,
        }

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        async def make(request, body, seq, fault):
            return web.json_response(
                {"input_tokens": _input_tokens(body)}, headers={"request-id": f"req_{seq}"}
            )

        return await self._wrap(request, True, make)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model", "object": "model"}]})
