"""A synthetic multi-turn serving trace, replayed through the cache manager (bookkeeping only).

The trace: `conversations` chats, each on one of `system_prompts` shared system prompts, each with
`turns` requests. A request's prompt is the whole conversation so far (system prompt, earlier user
messages and replies) plus a new user message; it then decodes its reply `decode_chunk` tokens per
event and finishes. At most `concurrency` requests are live; their decode steps interleave round-robin.
So prefixes repeat across conversations (system prompts) and across turns (the history), contexts grow,
and finished requests leave cached pages behind for the LRU.

Replay (`replay_trace`) feeds the events to a `PagedKVCache(store=False)` and samples its counters after
every event. A request that does not fit is rejected (at start) or preempted (mid-decode: it is freed and
its remaining events are dropped); both are counted, and the other requests are untouched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kernels.common.mla.cache import CacheStats, OutOfPagesError, PagedKVCache
from kernels.common.mla.layout import D_QK


@dataclass(frozen=True)
class TraceEvent:
    kind: str  # "start" (tokens = the prompt), "append" (decoded tokens), "finish"
    request: str
    tokens: tuple[int, ...] = ()


def synthetic_trace(
    *,
    conversations: int = 8,
    turns: int = 3,
    system_prompts: int = 2,
    system_len: int = 256,
    user_len: tuple[int, int] = (16, 96),
    reply_len: tuple[int, int] = (16, 128),
    decode_chunk: int = 8,
    concurrency: int = 4,
    seed: int = 0,
) -> list[TraceEvent]:
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(1, 2**31 - 1) for _ in range(n)]

    systems = [toks(system_len) for _ in range(system_prompts)]
    history = {c: list(systems[c % system_prompts]) for c in range(conversations)}
    pending = [(c, t) for t in range(turns) for c in range(conversations)]  # turn-major: turns interleave
    live: dict[str, tuple[int, list[int]]] = {}  # request -> (conversation, reply tokens still to decode)
    events: list[TraceEvent] = []
    while pending or live:
        while pending and len(live) < concurrency:
            busy = {c for c, _ in live.values()}
            ready = [p for p in pending if p[0] not in busy]  # a conversation's next turn waits for its last
            if not ready:
                break
            conv, turn = ready[0]
            pending.remove((conv, turn))
            history[conv] += toks(rng.randint(*user_len))
            req = f"c{conv}t{turn}"
            live[req] = (conv, toks(rng.randint(*reply_len)))
            events.append(TraceEvent("start", req, tuple(history[conv])))
        for req in list(live):
            conv, reply = live[req]
            chunk, rest = reply[:decode_chunk], reply[decode_chunk:]
            events.append(TraceEvent("append", req, tuple(chunk)))
            history[conv] += chunk
            if rest:
                live[req] = (conv, rest)
            else:
                events.append(TraceEvent("finish", req))
                del live[req]
    return events


@dataclass
class ReplayResult:
    page_size: int
    num_pages: int
    samples: list[CacheStats] = field(default_factory=list)  # after every event, skipped ones included
    rejected: int = 0
    preempted: int = 0

    @property
    def final(self) -> CacheStats:
        return self.samples[-1]

    @property
    def peak_bytes_resident(self) -> int:
        return max((s.bytes_resident for s in self.samples), default=0)


def replay_trace(
    events: list[TraceEvent], *, page_size: int, num_pages: int, head_dim: int = D_QK, kv_dtype: str = "bf16"
) -> ReplayResult:
    cache = PagedKVCache(num_pages, page_size, head_dim=head_dim, kv_dtype=kv_dtype, store=False)
    result = ReplayResult(page_size, num_pages)
    dropped: set[str] = set()
    for ev in events:
        if ev.request in dropped:  # its remaining events are skipped; the sample keeps x = event index
            result.samples.append(result.samples[-1])
            continue
        try:
            if ev.kind == "start":
                cache.add_sequence(ev.request, ev.tokens)
            elif ev.kind == "append":
                cache.append(ev.request, ev.tokens)
            else:
                cache.free_sequence(ev.request)
        except OutOfPagesError:
            dropped.add(ev.request)
            if ev.kind == "start":
                result.rejected += 1
            else:
                result.preempted += 1
                cache.free_sequence(ev.request)
        result.samples.append(cache.stats())
    return result
