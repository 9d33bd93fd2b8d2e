"""Anthropic's prompt cache as the fake upstream plays it (``FakeUpstream(prompt_cache=PromptCache())``).

A request's prompt is a sequence of blocks in Anthropic's order: each tool definition, each system block,
then each content block of each message (a string is one text block). A block's tokens are its canonical
JSON length over 4, ``cache_control`` left out. A block marked ``cache_control`` is a breakpoint (a
top-level ``cache_control``: the last block is one, Anthropic's automatic caching); more than
``MAX_BREAKPOINTS`` is a 400, as Anthropic answers. For each breakpoint the cache is looked up at it and at
the ``LOOKBACK`` block boundaries before it; the longest prefix found is read. After the request, each
breakpoint's prefix at least ``min_tokens`` long is in the cache. The usage then is Anthropic's:
``cache_read_input_tokens`` (the prefix read), ``cache_creation_input_tokens`` (from there to the last
cached breakpoint) and ``input_tokens`` (the rest). Entries do not expire (a replay lasts seconds, the
5-minute lifetime is not at issue).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

MAX_BREAKPOINTS = 4
LOOKBACK = 20


class TooManyBreakpoints(ValueError):
    pass


def _blocks(body: dict) -> list[tuple[bytes, bool]]:
    """(canonical bytes, marked) of each block of the prompt, in cache order."""
    out: list[tuple[bytes, bool]] = []

    def add(kind: str, block: object) -> None:
        marked = isinstance(block, dict) and "cache_control" in block
        if isinstance(block, dict):
            block = {k: v for k, v in block.items() if k != "cache_control"}
        out.append((f"{kind}:".encode() + json.dumps(block, sort_keys=True).encode(), marked))

    for tool in body.get("tools") or []:
        add("tool", tool)
    system = body.get("system")
    for block in [{"type": "text", "text": system}] if isinstance(system, str) else system or []:
        add("system", block)
    for m in body.get("messages") or []:
        content = m.get("content")
        for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or []:
            add(str(m.get("role")), block)
    if "cache_control" in body and out:
        out[-1] = (out[-1][0], True)
    return out


def prompt_digest(body: dict) -> str:
    """A digest of the prompt a Messages request shows the model: its blocks in cache order, cache markers
    left out (a request with breakpoints and the same without have the same digest)."""
    return hashlib.sha256(b"".join(data for data, _ in _blocks(body))).hexdigest()[:12]


@dataclass
class PromptCache:
    min_tokens: int = 1024
    entries: set[bytes] = field(default_factory=set)
    reads: int = 0  # requests that read from the cache
    writes: int = 0  # requests that wrote to it
    log: list[dict[str, int]] = field(default_factory=list)  # per request: read, written, input (uncached)

    def usage(self, body: dict) -> dict[str, int]:
        """The usage fields of one request (input_tokens, cache_creation_input_tokens,
        cache_read_input_tokens), the cache updated; TooManyBreakpoints past the limit."""
        blocks = _blocks(body)
        marks = [i for i, (_, marked) in enumerate(blocks) if marked]
        if len(marks) > MAX_BREAKPOINTS:
            found = len(marks)
            raise TooManyBreakpoints(
                f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {found}."
            )
        digest, keys, ends, total = hashlib.sha256(), [], [], 0
        for data, _ in blocks:
            digest.update(data)
            keys.append(digest.copy().digest())
            total += max(1, len(data) // 4)
            ends.append(total)
        read_at = -1
        for b in marks:
            for i in range(b, max(-1, b - LOOKBACK - 1), -1):
                if keys[i] in self.entries:
                    read_at = max(read_at, i)
                    break
        read = ends[read_at] if read_at >= 0 else 0
        written = 0
        for b in marks:
            if ends[b] >= self.min_tokens:
                self.entries.add(keys[b])
                written = max(written, ends[b] - read)
        self.log.append({"read": read, "written": written, "input": total - read - written})
        self.reads += read > 0
        self.writes += written > 0
        return {
            "input_tokens": total - read - written,
            "cache_creation_input_tokens": written,
            "cache_read_input_tokens": read,
        }
