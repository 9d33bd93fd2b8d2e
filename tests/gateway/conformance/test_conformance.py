"""The conformance suite: what real clients send (gateway/ops/client_shapes/*.json, one tool-using task per
client: Claude Code, Codex, the openai SDK's chat and Responses, the anthropic SDK, the OpenAI Agents SDK on
Responses and on chat; the README there says how they were recorded and how to refresh them), replayed
through translation to every other wire format, both turns of the task (the first request; the one
carrying the tool's result), whole and streamed.

- Requests, all six pairs: the conversation the upstream gets is the client's (system text, every text,
  tool call and tool result in order, the tools and the sampling settings), and what was left out is
  exactly what was reported as dropped (a strict project is refused naming the first of it).
- Answers, all six pairs: the fake upstream answers the translated request over HTTP in its own format
  (a call of the client's file-reading tool, then the file's content); translated back, whole or streamed,
  it reads through the client's SDK types as the same call or text.
- Through the gateway, the three pairs it routes (a client on a model of the other provider kind): the
  recorded bodies sent by the real SDKs, answered as above, with an ok ledger row naming what was dropped.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import aiohttp
import anthropic
import pytest
from openai.types.chat import ChatCompletion
from openai.types.responses import Response
from sdk_streams import anthropic_final, chat_final, responses_final

from gateway.errors import BadRequest
from gateway.translate import (
    StreamTranslator,
    chat,
    messages,
    responses,
    translate_request,
    translate_response,
)
from gateway.translate.ir import FORMATS
from gateway.translate.namespaces import flat_name, tool_names
from testkit.gateway.agents import READERS, play_model, tool_result

RECORDED = Path(__file__).resolve().parents[3] / "gateway" / "ops" / "client_shapes"
RECORDINGS = {p.stem: json.loads(p.read_text()) for p in sorted(RECORDED.glob("*.json"))}
WORK_FILE = Path("/work/a.txt")  # the recordings' file (scripts/record_client_shapes.py writes /work)
PARSE = {"chat": chat.parse_request, "responses": responses.parse_request, "messages": messages.parse_request}
UPSTREAM_PATH = {"chat": "/chat/completions", "responses": "/responses", "messages": "/messages"}
GATEWAY_MODEL = {"messages": "gpt-fake", "chat": "claude-fake", "responses": "claude-fake"}
GATEWAY_UPSTREAM = {"gpt-fake": "chat", "claude-fake": "messages"}

REQUESTS = [(n, turn, dst) for n, r in RECORDINGS.items() for turn in (0, 1) for dst in FORMATS
            if dst != r["format"]]  # fmt: skip


def test_every_client_and_pair_is_recorded():
    assert set(RECORDINGS) >= {"claude-code", "codex", "openai-chat", "openai-responses", "anthropic",
                               "openai-agents"}  # fmt: skip
    assert {(RECORDINGS[n]["format"], dst) for n, _, dst in REQUESTS} == {
        (s, d) for s in FORMATS for d in FORMATS if s != d
    }
    for name, rec in RECORDINGS.items():
        first, second = rec["requests"]
        assert rec["version"] and tool_result(first) is None and tool_result(second), name


def with_stream(body: dict, stream: bool) -> dict:
    out = copy.deepcopy(body)
    out["stream"] = stream
    if not stream:
        out.pop("stream_options", None)  # chat refuses it without a stream
    return out


# --- requests ---------------------------------------------------------------------------------------------


def _texts(content: object, kinds: tuple[str, ...] = ("text", "input_text", "output_text")) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [p["text"] for p in content or [] if isinstance(p, dict) and p.get("type") in kinds]


def _image(part: dict) -> str | None:
    if part.get("type") == "image_url":  # chat
        return part["image_url"]["url"]
    if part.get("type") == "input_image":  # Responses
        return part["image_url"]
    if part.get("type") == "image":  # Anthropic
        src = part["source"]
        return src["url"] if src["type"] == "url" else f"data:{src['media_type']};base64,{src['data']}"
    return None


def _parts(side: str, content: object) -> list[tuple]:
    out: list[tuple] = [(side, "text", t) for t in _texts(content) if t]
    for p in content if isinstance(content, list) else []:
        if isinstance(p, dict) and _image(p) is not None:
            out.append((side, "image", _image(p)))
    return out


def content_of(fmt: str, body: dict) -> dict:
    """What a request body asks, read from its JSON here, apart from the translator's own readers: the
    system text (Anthropic keeps one system prompt, so it is compared apart from the turns), the turns'
    texts, images, tool calls and tool results in order, the function tools (a Codex namespace's as
    NS__NAME; built-in tools are dropped and reported) and the sampling settings."""
    system: list[str] = []
    parts: list[tuple] = []
    tools: list[tuple] = []
    if fmt == "chat":
        for m in body["messages"]:
            role = m["role"]
            if role in ("system", "developer"):
                system += _texts(m["content"])
            elif role == "tool":
                parts.append(("user", "result", m["tool_call_id"], "".join(_texts(m["content"]))))
            else:
                parts += _parts(role, m.get("content"))
                for c in m.get("tool_calls") or []:
                    fn = c["function"]
                    parts.append((role, "call", c["id"], fn["name"], json.loads(fn["arguments"])))
        for t in body.get("tools") or []:
            fn = t["function"]
            tools.append((fn["name"], fn.get("description") or None, fn.get("parameters")))
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
    elif fmt == "responses":
        system += [body["instructions"]] if body.get("instructions") else []
        items = body["input"]
        for it in [{"role": "user", "content": items}] if isinstance(items, str) else items:
            kind = it.get("type", "message")
            if kind == "message" and it["role"] in ("system", "developer"):
                system += _texts(it["content"])
            elif kind == "message":
                parts += _parts(it["role"], it["content"])
            elif kind == "function_call":
                name = flat_name(it["namespace"], it["name"]) if it.get("namespace") else it["name"]
                parts.append(("assistant", "call", it["call_id"], name, json.loads(it["arguments"])))
            elif kind == "function_call_output":
                out = it["output"]
                parts.append(("user", "result", it["call_id"], out if isinstance(out, str) else "".join(
                    _texts(out))))  # fmt: skip
        for t in body.get("tools") or []:
            subs = [(t["name"], s) for s in t["tools"]] if t["type"] == "namespace" else [(None, t)]
            for ns, f in subs:
                if f["type"] == "function":
                    name = flat_name(ns, f["name"]) if ns else f["name"]
                    tools.append((name, f.get("description") or None, f.get("parameters")))
        limit = body.get("max_output_tokens")
    else:
        system += _texts(body.get("system"))
        for m in body["messages"]:
            if m["role"] == "system":
                system += _texts(m["content"])
                continue
            parts += _parts(m["role"], m["content"])
            for b in m["content"] if isinstance(m["content"], list) else []:
                if b["type"] == "tool_use":
                    parts.append((m["role"], "call", b["id"], b["name"], b["input"]))
                elif b["type"] == "tool_result":
                    parts.append(("user", "result", b["tool_use_id"], "".join(_texts(b.get("content")))))
        for t in body.get("tools") or []:
            if t.get("type", "custom") == "custom":
                tools.append((t["name"], t.get("description") or None, t["input_schema"]))
        limit = body.get("max_tokens")
    return {
        "system": " ".join(" ".join(system).split()),  # blocks may be joined by blank lines: one prompt
        "parts": _merged(parts),
        "tools": tools,
        "max_tokens": limit,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": bool(body.get("stream")),
        "tool_choice": _choice(body.get("tool_choice")),
    }


def _merged(parts: list[tuple]) -> list[tuple]:
    """Adjacent texts of one side as one (a format may join a turn's text blocks)."""
    out: list[tuple] = []
    for p in parts:
        if out and p[1] == "text" and out[-1][1] == "text" and out[-1][0] == p[0]:
            out[-1] = (p[0], "text", out[-1][2] + "\n" + p[2])
        else:
            out.append(p)
    return out


def _choice(choice: object) -> object:
    if isinstance(choice, dict):
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        kind = {"any": "required", "function": "tool"}.get(choice["type"], choice["type"])
        return (kind, name) if kind == "tool" else kind
    return choice


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name,turn,dst", REQUESTS)
def test_the_request_survives_translation(name, turn, dst, stream):
    rec = RECORDINGS[name]
    src = rec["format"]
    body = with_stream(rec["requests"][turn], stream)
    dropped: list[str] = []
    out = translate_request(body, src, dst, upstream_model="upstream-model", dropped=dropped)
    assert out["model"] == "upstream-model"
    sent, got = content_of(src, body), content_of(dst, out)
    for key, value in sent.items():
        if value is None and key in ("max_tokens", "tool_choice"):
            continue  # Anthropic's required max_tokens is filled in; no choice is "auto"
        assert got[key] == value, key
    # what was left out is what was reported, and a strict project is refused for the first of it
    assert dropped == PARSE[src](body, dst).dropped
    if dropped:
        with pytest.raises(BadRequest, match=f"^{dropped[0].replace('[', '.').replace(']', '.')}: "):
            translate_request(body, src, dst, upstream_model="m", strict=True)
    else:
        translate_request(body, src, dst, upstream_model="m", strict=True)


# --- answers ----------------------------------------------------------------------------------------------


def outcome(fmt: str, answer: object) -> tuple:
    """An answer as the client's SDK reads it: ("call", name, arguments) or ("text", text)."""
    if fmt == "chat":
        msg = answer.choices[0].message
        if msg.tool_calls:
            (call,) = msg.tool_calls
            return "call", call.function.name, json.loads(call.function.arguments)
        return "text", msg.content
    if fmt == "responses":
        calls = [o for o in answer.output if o.type == "function_call"]
        if calls:
            (call,) = calls
            return "call", call.name, json.loads(call.arguments)
        return "text", answer.output_text
    uses = [b for b in answer.content if b.type == "tool_use"]
    if uses:
        (use,) = uses
        return "call", use.name, use.input
    return "text", "".join(b.text for b in answer.content if b.type == "text")


def expected(body: dict) -> tuple:
    """What the fake model of testkit.gateway.agents answers: a call of the client's file-reading tool on
    the first turn, the tool's result on the second."""
    result = tool_result(body)
    if result is not None:
        return "text", f"The file says: {result}"
    names = json.dumps(body.get("tools"))
    reader = next(r for r in READERS if f'"{r}"' in names)
    return "call", reader, READERS[reader](str(WORK_FILE))


READ_WHOLE = {"chat": ChatCompletion.model_validate, "responses": Response.model_validate,
              "messages": anthropic.types.Message.model_validate}  # fmt: skip
READ_STREAM = {"chat": chat_final, "responses": responses_final, "messages": anthropic_final}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name,turn,upstream", REQUESTS)
async def test_the_answer_comes_back_in_the_clients_format(name, turn, upstream, stream, fake):
    rec = RECORDINGS[name]
    src = rec["format"]
    body = with_stream(rec["requests"][turn], stream)
    fake.agent, fake.reply = play_model(WORK_FILE)
    up = translate_request(body, src, upstream, upstream_model="upstream-model")
    async with aiohttp.ClientSession() as s, s.post(fake.base_url + UPSTREAM_PATH[upstream], json=up) as r:
        assert r.status == 200
        data = await r.read()
    names = tool_names(body) if src == "responses" else None
    if stream:
        t = StreamTranslator(upstream, src, public_model="public-model", tool_names=names)
        answer = READ_STREAM[src](t.feed(data) + t.finish())
        assert not t.failed
    else:
        answer = READ_WHOLE[src](
            translate_response(json.loads(data), upstream, src, public_model="public-model", tool_names=names)
        )
    assert outcome(src, answer) == expected(body)


# --- through the gateway ----------------------------------------------------------------------------------


def _split(method, body: dict) -> dict:
    """The body as SDK keyword arguments: the ones the SDK method knows, the rest in extra_body."""
    import inspect

    known = set(inspect.signature(method).parameters)
    return {k: v for k, v in body.items() if k in known} | {
        "extra_body": {k: v for k, v in body.items() if k not in known}
    }


async def _send(fmt: str, gw, oai, anth, body: dict):
    """``body`` sent by the client's real SDK; the answer as the SDK reads it (streams accumulated)."""
    stream = body.pop("stream")
    if fmt == "messages":
        client = anth(gw)
        if stream:
            async with client.messages.stream(**_split(client.messages.stream, body)) as s:
                return await s.get_final_message()
        # a timeout of its own: the SDK refuses a whole answer of Claude Code's max_tokens without one
        return await client.messages.create(**_split(client.messages.create, body), timeout=60)
    client = oai(gw)
    create = client.chat.completions.create if fmt == "chat" else client.responses.create
    if not stream:
        return await create(**_split(create, body))
    events = await create(stream=True, **_split(create, body))
    if fmt == "responses":
        done = [e async for e in events if e.type == "response.completed"]
        return done[0].response
    from openai.lib.streaming.chat import ChatCompletionStreamState

    state = ChatCompletionStreamState()
    async for chunk in events:
        state.handle_chunk(chunk)
    return state.get_final_completion()


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("name", sorted(RECORDINGS))
async def test_the_recorded_client_through_the_gateway(name, stream, gateway, fake, oai, anth):
    rec = RECORDINGS[name]
    src = rec["format"]
    model = GATEWAY_MODEL[src]
    fake.agent, fake.reply = play_model(WORK_FILE)
    for body in rec["requests"]:
        sent = with_stream({**body, "model": model}, stream)
        answer = await _send(src, gateway, oai, anth, copy.deepcopy(sent))
        assert outcome(src, answer) == expected(sent)
    rows = await gateway.rows()
    assert len(rows) == 2 and all(r["status"] == "ok" and r["stream"] == stream for r in rows), rows
    upstream = GATEWAY_UPSTREAM[model]
    assert {r["translation"] for r in rows} == {f"{src}->{upstream}"}
    for row, body in zip(rows, rec["requests"], strict=True):
        reported: list[str] = []
        translate_request(with_stream(body, stream), src, upstream, upstream_model="m", dropped=reported)
        assert (row["dropped_fields"] or "") == ",".join(reported), row
