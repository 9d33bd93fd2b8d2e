"""Seeded inputs for the attention family, with memory a kernel must not read poisoned with NaN.

- Dense: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v]; with `shared_kv` (the MLA
  latent form) v is the view k[..., :d_v] of one cached row. Key rows at or past a sequence's length
  (`seqlens`) are NaN.
- Sparse (`build_sparse`, on dense inputs) indices [b, s_q, topk] int32: query i of sequence b
  (position s_k_b - s_q + i) gets up to `topk` distinct random positions among the keys it may see, in
  random order, the rest -1, as a top-k indexer (and FlashMLA's test data) proposes them. A repeated
  position is legal input (it counts once per slot, kernels.attention.reference) but never generated
  here: the peer suite (tests/kernels/peers) and the reference tests build their own repeats. Key rows
  that no index of their sequence names are NaN, so a kernel reading outside its indices shows up.
Values are standard normal, drawn on the CPU generator so a seed gives the same inputs on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kernels.measure.correctness import fill_nan


@dataclass
class AttentionInputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    seqlens_k: torch.Tensor | None  # [b] int32, None when every sequence has s_k keys
    indices: torch.Tensor | None  # [b, s_q, topk] int32 for the sparse modes
    softmax_scale: float

    @property
    def lens(self) -> list[int]:
        b, s_k = self.k.shape[0], self.k.shape[1]
        return [s_k] * b if self.seqlens_k is None else [int(n) for n in self.seqlens_k.tolist()]


def _randn(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype=dtype, device=device)


def build_dense(
    batch: int,
    s_q: int,
    s_k: int,
    h_q: int,
    h_kv: int,
    d: int,
    d_v: int,
    *,
    dtype: torch.dtype = torch.bfloat16,
    seed: int = 0,
    device: str | torch.device = "cpu",
    shared_kv: bool = False,
    seqlens: list[int] | None = None,
    poison: bool = True,
) -> AttentionInputs:
    if shared_kv and d_v > d:
        raise ValueError(f"shared K/V needs d_v <= d, got d={d}, d_v={d_v}")
    gen = torch.Generator().manual_seed(seed)
    q = _randn((batch, s_q, h_q, d), gen, dtype, device)
    k = _randn((batch, s_k, h_kv, d), gen, dtype, device)
    v = k[..., :d_v] if shared_kv else _randn((batch, s_k, h_kv, d_v), gen, dtype, device)
    lens = None
    if seqlens is not None:
        if len(seqlens) != batch or any(not 0 <= n <= s_k for n in seqlens):
            raise ValueError(f"seqlens must be {batch} values in [0, {s_k}], got {seqlens}")
        lens = torch.tensor(seqlens, dtype=torch.int32, device=device)
        if poison:
            for i, n in enumerate(seqlens):
                fill_nan(k, (i, slice(n, None)))
                if not shared_kv:
                    fill_nan(v, (i, slice(n, None)))
    return AttentionInputs(q, k, v, lens, None, 1.0 / math.sqrt(d))


def sparse_indices(
    batch: int,
    s_q: int,
    s_k: int,
    topk: int,
    *,
    seed: int = 0,
    seqlens: list[int] | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """Distinct random visible positions per query (causal, bottom-right aligned), -1 padded."""
    gen = torch.Generator().manual_seed(seed + 7)
    lens = torch.tensor(seqlens if seqlens is not None else [s_k] * batch)
    score = torch.rand(batch, s_q, s_k, generator=gen)
    j = torch.arange(s_k)[None, None, :]
    last = lens[:, None, None] - s_q + torch.arange(s_q)[None, :, None]
    score = score.masked_fill(j > last, float("-inf"))
    top, idx = score.topk(min(topk, s_k), dim=-1)
    idx = torch.where(torch.isneginf(top), -1, idx)
    if topk > s_k:
        idx = torch.cat([idx, torch.full((batch, s_q, topk - s_k), -1, dtype=idx.dtype)], dim=-1)
    return idx.to(device=device, dtype=torch.int32)


def build_sparse(x: AttentionInputs, topk: int, *, seed: int = 0, poison: bool = True) -> AttentionInputs:
    """The dense inputs `x` with top-k `indices` (`sparse_indices` over its sequences' keys, drawn from
    `seed`); with `poison`, key rows that no index of their sequence names are NaN."""
    batch, s_q = x.q.shape[:2]
    s_k = x.k.shape[1]
    x.indices = sparse_indices(batch, s_q, s_k, topk, seed=seed, seqlens=x.lens, device=x.k.device)
    if poison:
        named = torch.zeros(batch, s_k + 1, dtype=torch.bool, device=x.k.device)
        named.scatter_(1, torch.where(x.indices >= 0, x.indices, s_k).long().reshape(batch, -1), True)
        unused = ~named[:, :s_k]
        fill_nan(x.k, unused)
        if x.v.data_ptr() != x.k.data_ptr():  # not a view into K (shared_kv): poisoned with it already
            fill_nan(x.v, unused)
    return x
