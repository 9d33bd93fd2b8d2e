"""FLOPs and bytes for the attention modes (own accounting, FlashMLA's conventions where they apply).

Dense (prefill, decode, MLA latent decode):
  flops = 2 x h_q x (d + d_v) x (query, key) pairs the causal rule lets through (exact count, so a
          causal prefill counts about half the square; no extra for softmax).
  bytes = q + K rows read + V rows read + out + lse, with K/V counted once per KV head and only up to
          each sequence's length; with shared K/V (MLA) V lives inside K and is not counted again.
Sparse: flops = 2 x h_q x (d + d_v) x selected positions (per query token: each token's scores are
  computed); bytes = the distinct K (and V) rows the batch names, once per KV head (the least HBM
  traffic that can produce the answer: rows named by several tokens are read once, so the fraction of
  roofline cannot exceed 100%), + q + out + lse + indices. Without the indices at hand (the spec-level
  `cost`), the distinct rows of a sequence are bounded by min(s_k, s_q x topk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kernels.base import Cost


@dataclass(frozen=True)
class AttentionCost(Cost):
    """The farm's Cost with the K/V bytes broken out; rates come from kernels.base.derive_rates."""

    kv_bytes: float = 0.0


def visible_pairs(s_q: int, s_k: int, causal: bool = True) -> int:
    """(query, key) pairs the bottom-right causal rule lets through for one sequence."""
    if not causal:
        return s_q * s_k
    # query i sees min(s_k, max(0, s_k - s_q + i + 1)) keys
    return sum(min(s_k, max(0, s_k - s_q + i + 1)) for i in range(s_q))


def _q_bytes(batch: int, s_q: int, h_q: int, d: int, elem: int) -> float:
    return float(batch * s_q * h_q * d * elem)


def _written_bytes(batch: int, s_q: int, h_q: int, d_v: int, elem: int) -> float:
    return float(batch * s_q * h_q * (d_v * elem + 4))  # out, lse (fp32)


def dense_cost(
    lens: Sequence[int],
    *,
    s_q: int,
    h_q: int,
    h_kv: int,
    d: int,
    d_v: int,
    elem: int,
    causal: bool = True,
    shared_kv: bool = False,
) -> AttentionCost:
    pairs = sum(visible_pairs(s_q, n, causal) for n in lens)
    row = d + (0 if shared_kv else d_v)
    kv = float(sum(lens) * h_kv * row * elem)
    flops = 2.0 * h_q * (d + d_v) * pairs
    b = len(lens)
    return AttentionCost(
        flops, kv + _q_bytes(b, s_q, h_q, d, elem), _written_bytes(b, s_q, h_q, d_v, elem), kv
    )


def sparse_cost(
    selected: int,
    *,
    distinct: int,
    batch: int,
    s_q: int,
    topk: int,
    h_q: int,
    h_kv: int,
    d: int,
    d_v: int,
    elem: int,
    shared_kv: bool = False,
) -> AttentionCost:
    """`selected`: positions attended, summed over every query token of the batch; `distinct`: distinct
    (sequence, position) pairs among them, the K/V rows actually read."""
    if distinct > selected:
        raise ValueError(f"distinct positions ({distinct}) cannot exceed selected ones ({selected})")
    row = d + (0 if shared_kv else d_v)
    kv = float(distinct * h_kv * row * elem)
    flops = 2.0 * h_q * (d + d_v) * selected
    idx = float(batch * s_q * topk * 4)
    read = kv + idx + _q_bytes(batch, s_q, h_q, d, elem)
    return AttentionCost(flops, read, _written_bytes(batch, s_q, h_q, d_v, elem), kv)


def distinct_positions(indices: Sequence) -> int:
    """Distinct valid (>= 0) positions per sequence of `indices [b, s_q, topk]`, summed over the batch."""
    return sum(int(row[row >= 0].unique().numel()) for row in indices)
