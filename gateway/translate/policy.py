"""What translation leaves out on purpose: THE one table of dropped fields, with the reason for each.

Rule: a field that changes the answer and has no equivalent in the target format is a 400 naming it
(``error_class="untranslatable"``); fields that only hint (caching, storage, accounting, effort) and leave
the answer's meaning alone are dropped, and each of them is listed here. The request readers consult
``TOP_LEVEL`` for whole top-level fields; the rows marked (content) document drops inside messages and
answers, done in the format modules.

A field that is in neither a reader's handled set nor this table (a new API field, say), and a server or
built-in tool with no equivalent (web search), is unknown: dropped and reported (the ``x-farm-dropped``
response header, the ledger row's ``dropped_fields``, ``gateway_translation_dropped_fields_total`` by client
and field, one log line per field), or refused by name for a project with ``translation: strict``. Nothing
is dropped unreported.

Decisions about the fields that only hint:
- Responses ``reasoning`` {effort, summary} and chat ``reasoning_effort``: carried between the two OpenAI
  formats (``reasoning.effort`` <-> ``reasoning_effort``); dropped towards Anthropic, where thinking needs
  an explicit token budget that an effort word does not give (no budget is invented).
- Effort between providers (Claude Code's ``output_config.effort``; OpenAI's ``reasoning_effort`` and
  Responses ``reasoning.effort``): mapped word for word (``EFFORT``) to a deployment whose config says
  ``effort: true`` (an OpenAI reasoning model; an Anthropic model that takes ``output_config.effort``), and
  dropped for any other: a chat model without reasoning refuses ``reasoning_effort``, and the answer's
  meaning does not depend on it. A word outside the table is not mapped (dropped as a hint).
- Anthropic ``thinking``: dropped towards OpenAI. Its budget is not turned into an effort (the client's
  effort, when it sends one, is the hint that is mapped).
- Prior reasoning in the conversation (Anthropic ``thinking`` / ``redacted_thinking`` blocks, Responses
  ``reasoning`` items) is signed or encrypted for its own provider and cannot be replayed elsewhere: dropped.
"""

from __future__ import annotations

from typing import NamedTuple


class Dropped(NamedTuple):
    src: str  # source format, or "*" for all
    field: str
    reason: str


DROPPED: tuple[Dropped, ...] = (
    # -- requests, top-level fields
    Dropped("*", "metadata", "bookkeeping on the provider's side; Anthropic metadata.user_id maps to user"),
    Dropped("*", "service_tier", "a latency/price tier of the source provider"),
    Dropped("chat", "store", "whether OpenAI keeps the completion; nothing is stored across formats"),
    Dropped("chat", "stream_options", "the gateway sets what the upstream needs (include_usage)"),
    Dropped("chat", "prediction", "predicted output only speeds generation up"),
    Dropped("chat", "prompt_cache_key", "a cache routing hint"),
    Dropped("chat", "safety_identifier", "abuse tracking id, not part of the answer"),
    Dropped("responses", "store", "whether OpenAI keeps the response; Codex sends false"),
    Dropped("responses", "include", "extra output (reasoning.encrypted_content) that other formats lack"),
    Dropped("responses", "prompt_cache_key", "a cache routing hint"),
    Dropped("responses", "safety_identifier", "abuse tracking id, not part of the answer"),
    Dropped("responses", "stream_options", "obfuscation padding of stream events"),
    Dropped("messages", "thinking", "extended thinking budget; see the module docstring"),
    Dropped("messages", "context_management", "server-side trimming of old tool results"),
    Dropped(
        "messages",
        "output_config",
        "{effort}: an effort hint (Claude Code sends it), mapped by EFFORT to a deployment with "
        "effort: true, else dropped; any other key of it is unknown",
    ),  # fmt: skip
    Dropped("responses", "client_metadata", "bookkeeping for the client's own use (Codex sends it)"),
    # -- requests, shared fields dropped only towards a format without them
    Dropped(
        "chat", "reasoning_effort", "to anthropic messages: mapped by EFFORT with effort: true, else not"
    ),
    Dropped("chat", "verbosity", "to anthropic messages: a length/style hint"),
    Dropped(
        "responses",
        "reasoning",
        "to anthropic messages: summary dropped, effort as chat's reasoning_effort (kept for chat)",
    ),  # fmt: skip
    Dropped("responses", "text.verbosity", "to anthropic messages: a length/style hint"),
    Dropped(
        "chat",
        "parallel_tool_calls",
        "true is the default everywhere; false maps to Anthropic's disable_parallel_tool_use",
    ),  # fmt: skip
    # -- (header) request headers, between API kinds (gateway.http.endpoints.proxy)
    Dropped(
        "messages",
        "anthropic-beta",
        "(header) to OpenAI: a beta flag only unlocks request fields, each translated or refused by name",
    ),  # fmt: skip
    # -- (content) inside messages, tools and answers
    Dropped("messages", "cache_control", "(content) prompt-cache breakpoints; OpenAI caches automatically"),
    Dropped("messages", "thinking blocks", "(content) signed prior reasoning, valid only for Anthropic"),
    Dropped("messages", "tool_result.is_error", "(content) to OpenAI: the result text carries the error"),
    Dropped("responses", "reasoning items", "(content) encrypted prior reasoning, valid only for OpenAI"),
    Dropped("*", "image detail", "(content) a resolution hint; Anthropic has none"),
    Dropped("*", "tools[].strict", "(content) to anthropic messages: schema adherence hint"),
    Dropped("messages", "tools[].defer_loading", "(content) a tool-search loading hint (Claude Code)"),
    Dropped("*", "message name", "(content) chat participant names; others have none"),
    Dropped(
        "*", "reasoning output", "(content) answers: thinking blocks / reasoning items are not the answer"
    ),
    Dropped("*", "annotations, logprobs", "(content) answers: citations and logprobs the client did not ask"),
)

TOP_LEVEL: dict[str, frozenset[str]] = {
    fmt: frozenset(d.field for d in DROPPED if d.src in (fmt, "*") and not d.reason.startswith(("(", "to ")))
    for fmt in ("chat", "responses", "messages")
}

# An effort word between providers, for a deployment with ``effort: true`` (see the module docstring):
# Anthropic's output_config.effort (low, medium, high; max on the largest models) and OpenAI's reasoning
# effort (none, minimal, low, medium, high; xhigh on some models), each to the nearest the other has.
EFFORT = {
    "to_openai": {"low": "low", "medium": "medium", "high": "high", "max": "high"},
    "to_anthropic": {"none": "low", "minimal": "low", "low": "low", "medium": "medium", "high": "high",
                     "xhigh": "high"},
}  # fmt: skip


def effort_for_openai(req) -> str | None:
    """The reasoning effort an Anthropic client's effort hint maps to (``req`` a translate.ir.Request), when
    the target takes one and no OpenAI word was given; else None."""
    if not req.map_effort or req.reasoning_effort is not None or req.effort is None:
        return None
    return EFFORT["to_openai"].get(req.effort)
