"""Input builder for paged MLA decode: seqlen distributions, q, and a cache built through the manager.

Distributions (all seeded, all values >= min_seqlen):
- "fixed":    every sequence has max_seqlen tokens.
- "uniform":  uniform integers in [min_seqlen, max_seqlen].
- "skewed":   long-tailed: seqlen = max_seqlen * u**4 (u uniform), so most sequences are short; the
              first sequence is pinned to max_seqlen so the long context is always present.
- "boundary": cycles through 1, page-1, page, page+1 and max_seqlen (page boundaries of the cache).

The cache is built by `PagedKVCache.add_sequence` on a pool whose free list is shuffled (so block tables
are non-contiguous), with an optional shared prompt prefix (prefix pages become cache hits). Every slot
not holding a token is NaN (fp8: NaN bytes and NaN scale) and every unused block-table entry is
INVALID_BLOCK_ID.

Values at FlashMLA's scale: the cached tokens are drawn as its tests draw them (N(0, 0.1^2), clamped to
[-1, 1]), which is what its correctness rule (kernels.common.mla.check: an absolute limit of 8e-4 per
element) is sized for; with unit V entries the bf16 rounding of P alone, FlashMLA's own arithmetic, breaks
that limit at 15-70 tokens. q is drawn at 1 / KV_STD (FlashMLA's tests: 0.1), so q.k / sqrt(576) keeps a
unit spread and the softmax stays peaked: a wrong scale or a shifted mask still moves the result.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from kernels.common.mla.cache import PagedKVCache
from kernels.common.mla.layout import D_QK, D_V

SeqlenDist = Literal["fixed", "uniform", "skewed", "boundary"]
SEQLEN_DISTS: tuple[str, ...] = ("fixed", "uniform", "skewed", "boundary")
KV_STD = 0.1  # FlashMLA's tests: randn / 10, clamped to [-1, 1]
Q_STD = 1.0 / KV_STD  # scores q.k / sqrt(d_qk) of unit spread


def sample_seqlens(
    dist: str, batch: int, max_seqlen: int, page_size: int, *, seed: int = 0, min_seqlen: int = 1
) -> list[int]:
    if batch < 1 or max_seqlen < 1:
        raise ValueError(f"batch and max_seqlen must be >= 1, got batch={batch}, max_seqlen={max_seqlen}")
    g = torch.Generator().manual_seed(seed)
    if dist == "fixed":
        lens = [max_seqlen] * batch
    elif dist == "uniform":
        lens = torch.randint(min_seqlen, max_seqlen + 1, (batch,), generator=g).tolist()
    elif dist == "skewed":
        u = torch.rand(batch, generator=g, dtype=torch.float64)
        lens = [max(min_seqlen, math.ceil(max_seqlen * float(x) ** 4)) for x in u]
        lens[0] = max_seqlen
    elif dist == "boundary":
        cycle = [1, page_size - 1, page_size, page_size + 1, max_seqlen]
        lens = [max(min_seqlen, cycle[i % len(cycle)]) for i in range(batch)]
    else:
        raise ValueError(f"seqlen distribution must be one of {SEQLEN_DISTS}, got {dist!r}")
    return [int(n) for n in lens]


def pages_needed(seqlens: list[int], page_size: int, shared_prefix: int = 0) -> int:
    """Pages the sequences occupy when the full pages of a common `shared_prefix` are stored once.

    Sequence i holds min(seqlen_i, shared_prefix) // page_size full prefix pages; those are shared, so
    the pool needs the largest such count once instead of every sequence's own copy.
    """
    shared = [min(n, shared_prefix) // page_size for n in seqlens]
    total = sum(-(-n // page_size) for n in seqlens)
    return total - sum(shared) + max(shared, default=0)


@dataclass
class DecodeInputs:
    q: torch.Tensor  # [batch, s_q, h_q, d_qk]
    kv_cache: torch.Tensor  # [num_pages, page_size, 1, d_qk]
    block_table: torch.Tensor  # [batch, max_blocks] int32
    cache_seqlens: torch.Tensor  # [batch] int32
    kv_scales: torch.Tensor | None  # [num_pages, page_size] fp32 (fp8 only)
    softmax_scale: float
    seqlens: list[int]
    cache: PagedKVCache  # the manager that built it: its stats() give hits, fragmentation, bytes
    d_v: int


def _cache_values(n: int, d_qk: int, gd: torch.Generator, device: str | torch.device) -> torch.Tensor:
    return (torch.randn(n, d_qk, generator=gd, device=device) * KV_STD).clamp_(-1.0, 1.0)


def build_decode_inputs(
    seqlens: list[int],
    *,
    h_q: int,
    s_q: int = 1,
    page_size: int = 64,
    kv_dtype: str = "bf16",
    q_dtype: torch.dtype = torch.bfloat16,
    d_qk: int = D_QK,
    d_v: int = D_V,
    shared_prefix: int = 0,
    extra_pages: int = 0,
    pad_blocks: int = 1,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> DecodeInputs:
    """Build q and a paged cache holding `seqlens[i]` random tokens per sequence.

    shared_prefix: the first min(shared_prefix, seqlen) tokens (ids and KV) are the same for every
    sequence, so their full pages are shared through the cache's prefix hits.
    extra_pages: spare pages in the pool beyond what the sequences need.
    pad_blocks: extra INVALID_BLOCK_ID columns at the end of the block table.
    """
    if any(n < 0 for n in seqlens):
        raise ValueError(f"seqlens must be >= 0, got {seqlens}")
    g = torch.Generator(device="cpu").manual_seed(seed)  # ids and page order
    gd = torch.Generator(device=device).manual_seed(seed + 1)  # KV and q values, made where they live
    prefix_len = min(shared_prefix, max(seqlens, default=0))
    num_pages = max(pages_needed(seqlens, page_size, prefix_len) + extra_pages, 1)
    order = torch.randperm(num_pages, generator=g).tolist()
    cache = PagedKVCache(
        num_pages, page_size, head_dim=d_qk, kv_dtype=kv_dtype, device=device, page_order=order
    )
    prefix_ids = torch.randint(0, 2**31 - 1, (prefix_len,), generator=g).tolist()
    prefix_kv = _cache_values(prefix_len, d_qk, gd, device)
    for i, n in enumerate(seqlens):
        k = min(prefix_len, n)
        ids = prefix_ids[:k] + torch.randint(0, 2**31 - 1, (n - k,), generator=g).tolist()
        kv = torch.cat([prefix_kv[:k], _cache_values(n - k, d_qk, gd, device)])
        cache.add_sequence(i, ids, kv)
    t = cache.kernel_inputs(list(range(len(seqlens))), pad_blocks=pad_blocks)
    q = (torch.randn(len(seqlens), s_q, h_q, d_qk, generator=gd, device=device) * Q_STD).to(q_dtype)
    return DecodeInputs(
        q=q,
        kv_cache=t.kv_cache,
        block_table=t.block_table,
        cache_seqlens=t.cache_seqlens,
        kv_scales=t.kv_scales,
        softmax_scale=1.0 / math.sqrt(d_qk),
        seqlens=list(seqlens),
        cache=cache,
        d_v=d_v,
    )
