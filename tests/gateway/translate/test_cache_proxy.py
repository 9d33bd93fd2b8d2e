"""Prompt caching through the gateway, with the real SDKs against the fake upstream playing Anthropic's cache
(testkit.gateway.prompt_cache): a client that marks nothing, in any of the three formats, gets breakpoints
on an Anthropic model, so its second turn reads what its first wrote; the client's own breakpoints are sent
as they came; ``prompt_caching: off`` sends none. On every translation pair, streamed or not, the cache reads
and writes reach the ledger row, its cost and the client's own usage."""

from __future__ import annotations

import anthropic
import openai
import pytest

from testkit.gateway.prompt_cache import PromptCache

SYSTEM = "You are a careful coding agent. Read before you write; run the tests after each change. " * 120
PRICE = {
    "input_per_mtok": 3.0,
    "output_per_mtok": 15.0,
    "cached_input_per_mtok": 0.3,
    "cache_write_per_mtok": 3.75,
}
PRICES = {
    "claude-fake": PRICE,
    "gpt-upstream": {"input_per_mtok": 2.0, "output_per_mtok": 8.0, "cached_input_per_mtok": 0.5},
}


def _cost(row: dict) -> float:
    fresh = row["input_tokens"] - row["cached_input_tokens"] - row["cache_write_tokens"]
    return (
        fresh * 3.0
        + row["cached_input_tokens"] * 0.3
        + row["cache_write_tokens"] * 3.75
        + row["output_tokens"] * 15.0
    ) / 1e6


async def _chat(
    client: openai.AsyncOpenAI, model: str, turns: list[str], stream: bool
) -> list[tuple[str, int]]:
    """Each turn's (answer text, cached tokens the client was told of), the conversation growing."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM}]
    out = []
    for q in turns:
        messages.append({"role": "user", "content": q})
        if stream:
            text, cached = "", None
            async for c in await client.chat.completions.create(
                model=model, messages=messages, stream=True, stream_options={"include_usage": True}
            ):
                text += "".join(ch.delta.content or "" for ch in c.choices)
                if c.usage is not None:
                    cached = c.usage.prompt_tokens_details.cached_tokens
        else:
            r = await client.chat.completions.create(model=model, messages=messages)
            text, cached = r.choices[0].message.content, r.usage.prompt_tokens_details.cached_tokens
        out.append((text, cached))
        messages.append({"role": "assistant", "content": text})
    return out


async def _responses(
    client: openai.AsyncOpenAI, model: str, turns: list[str], stream: bool
) -> list[tuple[str, int]]:
    items: list[dict] = []
    out = []
    for q in turns:
        items.append({"role": "user", "content": q})
        if stream:
            final = None
            async for ev in await client.responses.create(
                model=model, instructions=SYSTEM, input=items, stream=True
            ):
                if ev.type == "response.completed":
                    final = ev.response
        else:
            final = await client.responses.create(model=model, instructions=SYSTEM, input=items)
        out.append((final.output_text, final.usage.input_tokens_details.cached_tokens))
        items.append({"role": "assistant", "content": final.output_text})
    return out


async def _messages(
    client: anthropic.AsyncAnthropic, model: str, turns: list[str], stream: bool, system: object = SYSTEM
) -> list[tuple[str, int]]:
    messages: list[dict] = []
    out = []
    for q in turns:
        messages.append({"role": "user", "content": q})
        kw = {"model": model, "max_tokens": 64, "system": system, "messages": messages}
        if stream:
            async with client.messages.stream(**kw) as s:
                final = await s.get_final_message()
        else:
            final = await client.messages.create(**kw)
        text = "".join(b.text for b in final.content if b.type == "text")
        out.append((text, final.usage.cache_read_input_tokens or 0))
        messages.append({"role": "assistant", "content": text})
    return out


def _breakpoints(body: dict) -> int:
    n = int("cache_control" in body)
    system = body.get("system")
    blocks = [*(body.get("tools") or []), *(system if isinstance(system, list) else [])]
    for m in body.get("messages") or []:
        blocks += m["content"] if isinstance(m["content"], list) else []
    return n + sum("cache_control" in b for b in blocks)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("client", ["chat", "responses", "messages"])
async def test_a_client_that_marks_nothing_reads_its_previous_turn_from_the_cache(
    start_gateway, fake, oai, anth, client, stream
):
    fake.prompt_cache = PromptCache(min_tokens=1024)
    gw = await start_gateway(prices=PRICES)
    turns = ["Find the failing test.", "Now fix it.", "Run the suite again."]
    if client == "chat":
        seen = await _chat(oai(gw), "claude-fake", turns, stream)
    elif client == "responses":
        seen = await _responses(oai(gw), "claude-fake", turns, stream)
    else:
        seen = await _messages(anth(gw), "claude-fake", turns, stream)
    sent = [s.body for s in fake.seen if s.path == "/v1/messages"]
    assert len(sent) == 3 and all(1 <= _breakpoints(b) <= 4 for b in sent)
    log = fake.prompt_cache.log
    assert log[0]["read"] == 0 and log[0]["written"] > 1024  # the first turn writes its prompt
    assert all(
        u["read"] >= log[i]["read"] + log[i]["written"] for i, u in enumerate(log[1:])
    )  # then reads it
    rows = [r for r in await gw.rows() if r["status"] == "ok"]
    assert len(rows) == 3
    for row, u, (_, told) in zip(rows, log, seen, strict=True):
        assert not row["tokens_estimated"]
        assert (row["cached_input_tokens"], row["cache_write_tokens"]) == (u["read"], u["written"])
        assert row["input_tokens"] == u["read"] + u["written"] + u["input"]
        assert row["cost_usd"] == pytest.approx(_cost(row), rel=1e-9)
        assert told == u["read"]  # the client is told of its cache reads in its own format


async def test_the_clients_own_breakpoints_go_as_they_came(start_gateway, fake, anth):
    """Claude Code marks its own: the gateway adds none and moves none (one here, so one upstream)."""
    fake.prompt_cache = PromptCache(min_tokens=1024)
    gw = await start_gateway(prices=PRICES)
    own = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    await _messages(anth(gw), "claude-fake", ["a", "b"], False, system=own)
    sent = [s.body for s in fake.seen if s.path == "/v1/messages"]
    assert [_breakpoints(b) for b in sent] == [1, 1] and sent[1]["system"] == own
    assert [u["read"] > 0 for u in fake.prompt_cache.log] == [False, True]  # its own breakpoint works


@pytest.mark.parametrize("setting", ["off", "auto-unpriced"])
async def test_no_breakpoints_where_caching_is_off_or_does_not_pay(start_gateway, fake, oai, setting):
    fake.prompt_cache = PromptCache(min_tokens=1024)
    route = {"provider": "an", "upstream_model": "claude-upstream"}
    if setting == "off":
        route["prompt_caching"] = "off"
    models = {
        "gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"},
        "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
        "claude-fake": route,
    }
    gw = await start_gateway(prices=PRICES if setting == "off" else {}, models=models)
    seen = await _chat(oai(gw), "claude-fake", ["one", "two"], False)
    sent = [s.body for s in fake.seen if s.path == "/v1/messages"]
    assert [_breakpoints(b) for b in sent] == [0, 0]
    assert [u["read"] for u in fake.prompt_cache.log] == [0, 0] and [c for _, c in seen] == [0, 0]


async def test_a_short_prompt_goes_as_it_came(start_gateway, fake, anth):
    """Under the model's minimum a breakpoint would cache nothing: the client's bytes go untouched."""
    gw = await start_gateway(prices=PRICES)
    await anth(gw).messages.create(
        model="claude-fake", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
    )
    assert _breakpoints(fake.seen[-1].body) == 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_anthropic_client_on_an_openai_model_gets_its_cached_tokens(
    start_gateway, fake, anth, stream
):
    """messages -> chat: OpenAI's cached prompt tokens reach the ledger, the cost and the client as
    Anthropic's cache_read_input_tokens (input_tokens then excludes them, as Anthropic's does)."""
    gw = await start_gateway(prices=PRICES)
    fake.cache_read_tokens = 40
    kw = {
        "model": "gpt-fake",
        "max_tokens": 16,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "hi"}],
    }
    if stream:
        async with anth(gw).messages.stream(**kw) as s:
            final = await s.get_final_message()
    else:
        final = await anth(gw).messages.create(**kw)
    (row,) = await gw.rows()
    inp = fake.usage_log[-1][2]
    assert (row["input_tokens"], row["cached_input_tokens"], row["cache_write_tokens"]) == (inp, 40, 0)
    assert row["cost_usd"] == pytest.approx(((inp - 40) * 2.0 + 40 * 0.5 + row["output_tokens"] * 8.0) / 1e6)
    assert final.usage.cache_read_input_tokens == 40 and final.usage.input_tokens == inp - 40
