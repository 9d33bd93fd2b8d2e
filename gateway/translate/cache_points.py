"""Prompt-cache breakpoints the gateway adds to an Anthropic Messages request that carries none.

Anthropic caches a prompt's prefix (tools, then system, then messages) only up to a block marked
``cache_control``; a client that marks nothing (every OpenAI-format client translated to Anthropic, a script
on the anthropic SDK) pays the full input price for the same system prompt and tools on every turn. For a
model whose cache reads cost less than its input (``prompt_caching: auto`` in the model's config, the
default; ``on`` / ``off`` force it), ``add_breakpoints`` marks, when the client marked nothing anywhere:

- the last tool definition and the last system block (a prefix every session of the agent shares),
- the last block of the previous turn (the last user message before the last assistant message: the end of
  the prefix the previous request of an agent loop wrote, so its read is exact however many blocks the new
  turn added),
- the last block of the conversation (what the next turn reads),

each only where the prefix up to it is at least the model's minimum cacheable length (a shorter one is not
cached at all), never more than four. A cache write costs more than input (1.25x for the 5-minute cache), a
read far less (0.1x): a prefix read once again has paid for its write.

Facts from Anthropic's prompt caching documentation (https://docs.claude.com/en/docs/build-with-claude/
prompt-caching, read 2026-12; the minimums as the anthropic-sdk-python issue 1194 quotes that page):

- at most 4 blocks with ``cache_control`` per request (a fifth is a 400); a top-level ``cache_control``
  (automatic caching) is the client's own choice as much as a block's;
- the prefix is cached in the order tools, system, messages, up to and including the marked block; a hit is
  looked for at each breakpoint and at the block boundaries up to about 20 blocks before it;
- minimum cacheable prompt length: 4096 tokens for Claude Opus 4.6, Opus 4.5 and Haiku 4.5; 1024 for
  Sonnet 4.6, Sonnet 4.5, Opus 4.1, Opus 4, Sonnet 4 and Sonnet 3.7; 2048 for Haiku 3.5 and Haiku 3; a shorter
  prefix is processed uncached, without an error;
- thinking blocks cannot carry ``cache_control`` themselves; empty text blocks cannot be cached;
- the default lifetime is 5 minutes, refreshed by each read; writes cost 1.25x the input price, reads 0.1x.

Pure functions: the caller (gateway.http.targets) decides per deployment whether caching applies
(``auto_cache_models``) and sends the body returned.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.core import jsoncodec

if TYPE_CHECKING:
    from gateway.config import GatewaySettings, ModelPrice
    from gateway.core.pricing import PriceTable

MAX_BREAKPOINTS = 4
EPHEMERAL = {"type": "ephemeral"}
# (a model id's family, as it appears in the id) -> the minimum cacheable prompt length in tokens; the first
# family found in the id wins, so the longer names come first
MIN_CACHEABLE_TOKENS: tuple[tuple[str, int], ...] = (
    ("opus-4-6", 4096),
    ("opus-4-5", 4096),
    ("haiku-4-5", 4096),
    ("haiku-3-5", 2048),
    ("3-5-haiku", 2048),
    ("3-haiku", 2048),
    ("haiku-3", 2048),
    ("sonnet", 1024),
    ("opus", 1024),
)
DEFAULT_MIN_TOKENS = 1024  # a model of no known family: the smallest documented minimum
_CHARS_PER_TOKEN = 4  # the estimate of gateway.core.usage
# the content blocks that can carry cache_control (thinking and redacted_thinking cannot)
_MARKABLE = frozenset(
    {"text", "image", "document", "tool_use", "tool_result", "search_result", "server_tool_use"}
)


def min_cacheable_tokens(upstream_model: str) -> int:
    """The documented minimum cacheable prompt length of the model's family (DEFAULT_MIN_TOKENS when no
    family is known from its id)."""
    name = upstream_model.lower().replace(".", "-")
    for family, tokens in MIN_CACHEABLE_TOKENS:
        if family in name:
            return tokens
    return DEFAULT_MIN_TOKENS


def auto_cache_models(settings: GatewaySettings, prices: PriceTable) -> dict[tuple[str, str], int]:
    """(public model, upstream model) of every anthropic deployment the gateway adds breakpoints for ->
    the shortest prefix worth one. ``prompt_caching: auto``: where the deployment's price bills cache reads
    below its input price (no price, or no cheaper read: nothing to gain)."""
    out: dict[tuple[str, str], int] = {}
    for name, route in settings.models.items():
        if route.prompt_caching == "off":
            continue
        for d in route.deployments:
            provider = settings.providers.get(d.provider)
            if provider is None or provider.kind != "anthropic":
                continue
            if route.prompt_caching == "auto" and not _reads_cheaper(prices.price(d.upstream_model, name)):
                continue
            out[(name, d.upstream_model)] = route.prompt_cache_min_tokens or min_cacheable_tokens(
                d.upstream_model
            )
    return out


def _reads_cheaper(price: ModelPrice | None) -> bool:
    """Whether the price bills a cache read below an input token (no price: nothing known to gain)."""
    read = None if price is None else price.cached_input_per_mtok
    return price is not None and read is not None and read < price.input_per_mtok


def has_cache_control(body: Mapping[str, Any]) -> bool:
    """Whether the client marked anything for the cache: a top-level ``cache_control`` (automatic caching),
    a tool, a system block, a message's content block or a block inside a tool result."""
    if "cache_control" in body:
        return True
    system = body.get("system")
    lists: list[Any] = [body.get("tools"), system if isinstance(system, list) else None]
    messages = body.get("messages")
    if isinstance(messages, list):
        lists.extend(m.get("content") for m in messages if isinstance(m, dict))
    return any(_marked(items) for items in lists)


def _marked(items: Any) -> bool:
    if not isinstance(items, list):
        return False
    for item in items:
        if isinstance(item, dict):
            if "cache_control" in item:
                return True
            if item.get("type") == "tool_result" and _marked(item.get("content")):
                return True
    return False


def _tokens(obj: Any) -> int:
    return len(jsoncodec.dumps(obj)) // _CHARS_PER_TOKEN


def add_breakpoints(body: Mapping[str, Any], min_tokens: int) -> dict[str, Any] | None:
    """``body`` (an Anthropic Messages request the client marked nothing in) with breakpoints where they pay,
    or None when none does (a prompt shorter than ``min_tokens``, or nothing markable). The body given is
    never changed: the parts marked are copies."""
    tools, system, messages = body.get("tools"), body.get("system"), body.get("messages")
    tools = tools if isinstance(tools, list) and tools else None
    messages = messages if isinstance(messages, list) else []
    at = _tokens(tools) if tools else 0  # the estimated prefix so far
    out: dict[str, Any] = dict(body)
    marks = 0
    if tools and at >= min_tokens and isinstance(tools[-1], dict):
        out["tools"] = [*tools[:-1], {**tools[-1], "cache_control": EPHEMERAL}]
        marks += 1
    if system:
        at += _tokens(system)
        marked = _mark_content(system) if at >= min_tokens else None
        if marked is not None:
            out["system"] = marked
            marks += 1
    ends = [at := at + _tokens(m) for m in messages]  # the prefix through each message
    turns, changed = list(messages), False
    for i in _conversation_points(messages):
        if marks >= MAX_BREAKPOINTS or ends[i] < min_tokens:
            continue
        m = turns[i]
        marked = _mark_content(m.get("content")) if isinstance(m, dict) else None
        if marked is not None:
            turns[i] = {**m, "content": marked}
            marks, changed = marks + 1, True
    if not marks:
        return None
    if changed:
        out["messages"] = turns
    return out


def _conversation_points(messages: list[Any]) -> Iterable[int]:
    """The messages whose last block gets a breakpoint: the previous turn's last (the last user message
    before the last assistant message), then the conversation's last."""
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    assistant = next((i for i in range(len(roles) - 1, -1, -1) if roles[i] == "assistant"), -1)
    previous = next((i for i in range(assistant - 1, -1, -1) if roles[i] == "user"), None)
    return [i for i in (previous, len(messages) - 1) if i is not None and i >= 0]


def _mark_content(content: Any) -> list[dict[str, Any]] | None:
    """``content`` (a string or a list of blocks) with its last markable block marked, or None when it has
    none (an empty text, only thinking blocks)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content, "cache_control": EPHEMERAL}] if content else None
    if not isinstance(content, list):
        return None
    for j in range(len(content) - 1, -1, -1):
        block = content[j]
        if not isinstance(block, dict) or block.get("type") not in _MARKABLE:
            continue
        if block.get("type") == "text" and not block.get("text"):
            continue
        return [*content[:j], {**block, "cache_control": EPHEMERAL}, *content[j + 1 :]]
    return None
