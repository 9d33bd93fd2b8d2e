"""Automatic prompt-cache breakpoints (gateway.translate.cache_points): where they go, never the client's own,
never more than four, never below the model's minimum; which deployments get them (auto_cache_models); and
the fake upstream's Anthropic cache (testkit.gateway.prompt_cache) they are measured against."""

from __future__ import annotations

import copy

import pytest

from gateway.config import GatewaySettings
from gateway.core.pricing import PriceTable
from gateway.translate.cache_points import (
    MAX_BREAKPOINTS,
    add_breakpoints,
    auto_cache_models,
    has_cache_control,
    min_cacheable_tokens,
)
from testkit.gateway.prompt_cache import PromptCache, TooManyBreakpoints

LONG = "Follow the repository's conventions. " * 200  # ~7,400 characters: ~1,850 tokens
TOOLS = [
    {"name": f"tool{i}", "description": LONG[:400], "input_schema": {"type": "object"}} for i in range(3)
]


def _marks(body: dict) -> list[str]:
    """Where the body's breakpoints are: tools.N, system.N, messages.N.M."""
    out = [f"tools.{i}" for i, t in enumerate(body.get("tools") or []) if "cache_control" in t]
    system = body.get("system")
    if isinstance(system, list):
        out += [f"system.{i}" for i, b in enumerate(system) if "cache_control" in b]
    for i, m in enumerate(body.get("messages") or []):
        if isinstance(m["content"], list):
            out += [f"messages.{i}.{j}" for j, b in enumerate(m["content"]) if "cache_control" in b]
    return out


def _agent_turn(n: int) -> dict:
    """An agent loop's request after ``n`` tool calls: system, tools, the task, then call/result pairs."""
    messages: list[dict] = [{"role": "user", "content": "Fix the failing test in tests/test_x.py"}]
    for i in range(n):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "tool0", "input": {"cmd": f"step {i}"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Step {i}."}, use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"output {i} " * 40}
        messages.append({"role": "user", "content": [result]})
    return {
        "model": "m",
        "max_tokens": 100,
        "system": LONG,
        "tools": copy.deepcopy(TOOLS),
        "messages": messages,
    }


def test_an_agent_turn_gets_tools_system_previous_turn_and_last_block():
    body = _agent_turn(3)
    before = copy.deepcopy(body)
    out = add_breakpoints(body, 1024)
    assert body == before  # the client's body is never changed
    # tools alone (~300 tokens) are under the minimum: no breakpoint there; the system's covers them
    assert _marks(out) == ["system.0", "messages.4.0", "messages.6.0"]
    assert out["system"] == [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    # what the breakpoints do not touch is the same (the content only gained cache_control)
    assert out["messages"][:4] == body["messages"][:4] and out["tools"] == body["tools"]


def test_long_tools_get_their_own_and_never_more_than_four():
    body = _agent_turn(2)
    body["tools"] = [{**t, "description": LONG} for t in TOOLS]
    out = add_breakpoints(body, 1024)
    assert _marks(out) == ["tools.2", "system.0", "messages.2.0", "messages.4.0"]
    assert len(_marks(out)) == MAX_BREAKPOINTS


def test_a_prompt_under_the_minimum_is_left_as_it_came():
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert add_breakpoints(body, 1024) is None
    # above the minimum only where the prefix is: the system alone is short, the whole conversation is not
    body["messages"] = [{"role": "user", "content": LONG}]
    assert _marks(add_breakpoints(body, 1024)) == ["messages.0.0"]


def test_thinking_and_empty_blocks_are_never_marked():
    body = _agent_turn(1)
    body["messages"][1]["content"] = [{"type": "thinking", "thinking": "hm", "signature": "s"}]
    body["messages"].append(
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "ok"},
                {"type": "thinking", "thinking": "x", "signature": "s"},
            ],
        }
    )
    out = add_breakpoints(body, 1024)
    last = out["messages"][-1]["content"]
    assert "cache_control" in last[0] and "cache_control" not in last[1]  # the block before the thinking one
    assert add_breakpoints({"messages": [{"role": "user", "content": ""}], "system": ""}, 1) is None


@pytest.mark.parametrize(
    "where",
    ["top", "tool", "system", "message", "tool_result_inner"],
)
def test_the_clients_own_breakpoints_are_seen_wherever_they_are(where):
    body = _agent_turn(1)
    cc = {"type": "ephemeral"}
    if where == "top":
        body["cache_control"] = cc
    elif where == "tool":
        body["tools"][0]["cache_control"] = cc
    elif where == "system":
        body["system"] = [{"type": "text", "text": LONG, "cache_control": cc}]
    elif where == "message":
        body["messages"][0] = {
            "role": "user",
            "content": [{"type": "text", "text": "x", "cache_control": cc}],
        }
    else:
        body["messages"][2]["content"][0]["content"] = [{"type": "text", "text": "out", "cache_control": cc}]
    assert has_cache_control(body)
    assert not has_cache_control(_agent_turn(1))


def test_minimums_by_model_family():
    assert min_cacheable_tokens("claude-sonnet-4-5-20250929") == 1024
    assert min_cacheable_tokens("claude-haiku-4-5") == 4096
    assert min_cacheable_tokens("claude-opus-4-5-20251101") == 4096
    assert min_cacheable_tokens("claude-opus-4-1") == 1024
    assert min_cacheable_tokens("claude-3-5-haiku-latest") == 2048
    assert min_cacheable_tokens("my-own-model") == 1024


def test_which_deployments_get_breakpoints():
    providers = {
        "an": {"kind": "anthropic", "base_url": "http://127.0.0.1:1/v1"},
        "oa": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1"},
    }
    models = {
        "sonnet": {"provider": "an", "upstream_model": "claude-sonnet-4-5"},  # default price: 0.30 < 3.0
        "unpriced": {"provider": "an", "upstream_model": "claude-next"},  # no price: nothing to gain known
        "forced": {
            "provider": "an",
            "upstream_model": "claude-next",
            "prompt_caching": "on",
            "prompt_cache_min_tokens": 50,
        },  # fmt: skip
        "off": {"provider": "an", "upstream_model": "claude-haiku-4-5", "prompt_caching": "off"},
        "gpt": {"provider": "oa", "upstream_model": "gpt-5"},  # OpenAI caches by itself
        "flat": {"provider": "an", "upstream_model": "claude-flat"},  # cache reads priced as input
    }
    prices = {"claude-flat": {"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cached_input_per_mtok": 1.0}}
    settings = GatewaySettings(providers=providers, models=models, prices=prices)
    got = auto_cache_models(settings, PriceTable(settings.prices))
    assert got == {("sonnet", "claude-sonnet-4-5"): 1024, ("forced", "claude-next"): 50}


# --- the fake's cache, which the gateway's breakpoints are measured against -------------------------
def test_the_fake_cache_reads_what_a_previous_turn_wrote_and_refuses_a_fifth_breakpoint():
    cache = PromptCache(min_tokens=1024)
    plain = [cache.usage(_agent_turn(n)) for n in (1, 2)]  # no breakpoints: nothing cached, nothing read
    assert all(u["cache_read_input_tokens"] == u["cache_creation_input_tokens"] == 0 for u in plain)
    first = cache.usage(add_breakpoints(_agent_turn(1), 1024))
    assert first["cache_read_input_tokens"] == 0 and first["cache_creation_input_tokens"] > 1024
    second = cache.usage(add_breakpoints(_agent_turn(2), 1024))
    total = sum(second.values())
    assert second["cache_read_input_tokens"] == sum(first.values())  # the whole previous prompt is read
    assert second["cache_creation_input_tokens"] == total - sum(first.values())  # the new turn is written
    assert second["input_tokens"] == 0
    assert plain[1]["input_tokens"] == total  # the same prompt, the same tokens, cached or not

    body = _agent_turn(3)
    for block in (body["messages"][0], body["messages"][2], body["messages"][4], body["messages"][6]):
        block["content"] = [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]
    body["system"] = [{"type": "text", "text": LONG, "cache_control": {"type": "ephemeral"}}]
    with pytest.raises(TooManyBreakpoints, match="maximum of 4"):
        cache.usage(body)


def test_the_fake_cache_writes_nothing_under_its_minimum():
    cache = PromptCache(min_tokens=100_000)
    u = cache.usage(add_breakpoints(_agent_turn(2), 1024))
    assert u["cache_creation_input_tokens"] == u["cache_read_input_tokens"] == 0 and u["input_tokens"] > 0
