"""The trace-driven cache benchmark: a synthetic multi-turn trace replayed through the cache manager.

One trial = one trace, sized from the decode shape it sits next to in a sweep, replayed through a
`PagedKVCache(store=False)` at the trial's page size:
  concurrency   = batch (live requests at once, as in a decode batch), or config.concurrency
  contexts      grow to about `context` tokens (shape.seqlen, or config.context): a system prompt of
                context/4, then per turn a user message and a reply whose lengths are drawn so the last
                turn ends below context
  pool          = ceil(pool x pages for concurrency x context tokens): pool 1.0 holds a full decode batch
                of the shape; below 1.0 the pool is under pressure (evictions, rejected / preempted
                requests)
  decode_chunk  = tokens per decode event, max(1, context // 256) unless the config sets it
Config keys (all optional): context, concurrency, conversations (default 2 x concurrency), turns (3),
system_prompts (4), pool (1.0), decode_chunk, seed (0). The trace reads page_size and kv_dtype (bytes per
page) from the shape, batch and seqlen unless the config overrides them, and nothing else.

Results: final counters (hit rate, evictions, fragmentation, bytes per token, peak bytes resident, rejected
and preempted requests) and a time series over the replayed events, downsampled to <= MAX_POINTS points,
in the report's generic shape {"xlabel", "x", "series": {name: ys}, "title"}. Every series is a
percentage (evictions as the share of the page allocations so far that had to evict a cached page), so
that they share one axis.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from kernels.common.mla.cache import CacheStats
from kernels.paged_mla.trace import ReplayResult, replay_trace, synthetic_trace

MAX_POINTS = 200
TRACE_CONFIG_KEYS = (
    "context",
    "concurrency",
    "conversations",
    "turns",
    "system_prompts",
    "pool",
    "decode_chunk",
    "seed",
)


@dataclass(frozen=True)
class TraceSetup:
    page_size: int
    kv_dtype: str
    concurrency: int
    max_context: int
    conversations: int
    turns: int
    system_prompts: int
    system_len: int
    user_len: tuple[int, int]
    reply_len: tuple[int, int]
    decode_chunk: int
    num_pages: int
    seed: int


def trace_setup(shape: dict[str, Any], config: dict[str, Any]) -> TraceSetup:
    batch = int(config.get("concurrency", shape["batch"]))
    seqlen = int(config.get("context", shape["seqlen"]))
    page = int(shape["page_size"])
    turns = int(config.get("turns", 3))
    system_len = max(1, seqlen // 4)
    per_turn = max(2, (seqlen - system_len) // turns)  # user + reply of one turn stay below this
    user_hi = max(1, per_turn // 4)
    reply_hi = max(1, per_turn // 2)
    pool = float(config.get("pool", 1.0))
    return TraceSetup(
        page_size=page,
        kv_dtype=str(shape["kv_dtype"]),
        concurrency=batch,
        max_context=seqlen,
        conversations=int(config.get("conversations", 2 * batch)),
        turns=turns,
        system_prompts=int(config.get("system_prompts", 4)),
        system_len=system_len,
        user_len=(max(1, user_hi // 2), user_hi),
        reply_len=(max(1, reply_hi // 2), reply_hi),
        decode_chunk=int(config.get("decode_chunk", max(1, seqlen // 256))),
        num_pages=max(1, math.ceil(pool * batch * -(-seqlen // page))),
        seed=int(config.get("seed", 0)),
    )


def validate_trace_config(config: dict[str, Any]) -> None:
    for key, value in config.items():
        if key not in TRACE_CONFIG_KEYS:
            raise ValueError(
                f"config.{key} does not apply to cache_trace (known: {', '.join(TRACE_CONFIG_KEYS)})"
            )
        if key == "pool":
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 16:
                raise ValueError(f"config.pool must be a number in (0, 16] (got {value!r})")
        elif key == "seed":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"config.seed must be an integer >= 0 (got {value!r})")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"config.{key} must be a positive integer (got {value!r})")


def run_trace_bench(setup: TraceSetup) -> tuple[dict[str, Any], dict[str, Any]]:
    """Build and replay the trace: (the trial's metrics with the time series, its correctness record)."""
    t0 = time.perf_counter()
    events = synthetic_trace(
        conversations=setup.conversations,
        turns=setup.turns,
        system_prompts=setup.system_prompts,
        system_len=setup.system_len,
        user_len=setup.user_len,
        reply_len=setup.reply_len,
        decode_chunk=setup.decode_chunk,
        concurrency=setup.concurrency,
        seed=setup.seed,
    )
    t1 = time.perf_counter()
    result = replay_trace(
        events, page_size=setup.page_size, num_pages=setup.num_pages, kv_dtype=setup.kv_dtype
    )
    replay_s = time.perf_counter() - t1
    final = result.final
    prompt_tokens = sum(len(e.tokens) for e in events if e.kind == "start")
    metrics = {
        "events": len(events),
        "requests": sum(e.kind == "start" for e in events),
        "tokens": sum(len(e.tokens) for e in events if e.kind != "finish"),
        "trace_build_s": t1 - t0,
        "replay_s": replay_s,
        "us_per_event": 1e6 * replay_s / max(len(events), 1),
        "page_size": setup.page_size,
        "pool_pages": setup.num_pages,
        "pool_bytes": setup.num_pages * final.page_bytes,
        "page_hit_rate": final.hit_rate,
        # comparable across page sizes: the share of prompt tokens served from cached pages
        "reused_prompt_fraction": final.hits * setup.page_size / prompt_tokens if prompt_tokens else 0.0,
        "page_hits": final.hits,
        "page_misses": final.misses,
        "evictions": final.evictions,
        "pages_allocated": final.pages_allocated,
        "rejected": result.rejected,
        "preempted": result.preempted,
        "peak_bytes_resident": result.peak_bytes_resident,
        "peak_bytes_in_use": max(s.bytes_in_use for s in result.samples),
        "peak_live_tokens": max(s.live_tokens for s in result.samples),
        "mean_fragmentation_pct": _mean(_fragmentation_pct(s) for s in result.samples),
        "mean_bytes_per_token": _mean(s.bytes_per_token for s in result.samples if s.live_tokens),
        "bytes_per_token_raw": final.page_bytes / setup.page_size,
        "timeseries": timeseries(result, setup),
    }
    return metrics, check_replay(result)


def check_replay(result: ReplayResult) -> dict[str, Any]:
    """Invariants every replay keeps (a cache-manager bug breaks them): the correctness record."""
    problems = []
    for i, s in enumerate(result.samples):
        if s.pages_in_use + s.pages_cached + s.pages_free != s.num_pages:
            problems.append(f"event {i}: in use + cached + free pages != the pool ({s.num_pages})")
            break
        if not 0 <= s.fragmentation <= s.pages_in_use * (s.page_size - 1):  # every in-use page holds a token
            problems.append(f"event {i}: fragmentation {s.fragmentation} out of range")
            break
    final = result.final
    if final.live_sequences or final.pages_in_use or final.live_tokens:
        problems.append(
            f"after every request finished: {final.live_sequences} sequences, {final.pages_in_use} pages "
            f"and {final.live_tokens} tokens still live"
        )
    return {"passed": not problems, "method": "cache_invariants", "message": "; ".join(problems) or "ok"}


def timeseries(result: ReplayResult, setup: TraceSetup) -> dict[str, Any]:
    samples = result.samples
    idx = _downsample(len(samples), MAX_POINTS)
    pool = setup.num_pages

    def pct(f: Callable[[CacheStats], float]) -> list[float]:
        return [round(100.0 * f(samples[i]), 3) for i in idx]

    return {
        "xlabel": "trace event",
        "x": [i + 1 for i in idx],
        "series": {
            "hit rate %": pct(lambda s: s.hit_rate),
            "pool resident %": pct(lambda s: (s.pages_in_use + s.pages_cached) / pool),
            "pool in use %": pct(lambda s: s.pages_in_use / pool),
            "fragmentation % of slots": pct(lambda s: _fragmentation_pct(s) / 100.0),
            "allocations that evicted %": pct(lambda s: s.evictions / max(s.pages_allocated, 1)),
        },
        "title": (
            f"KV cache trace, page {setup.page_size}: {setup.conversations} conversations x {setup.turns} "
            f"turns, {setup.concurrency} live, pool {pool} pages"
        ),
    }


def _fragmentation_pct(s: CacheStats) -> float:
    return 100.0 * s.fragmentation / s.allocated_slots if s.allocated_slots else 0.0


def _downsample(n: int, k: int) -> list[int]:
    """At most k indices spread evenly over range(n), always keeping the last one."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0
