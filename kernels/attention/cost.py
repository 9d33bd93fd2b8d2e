"""FLOPs and bytes for the attention modes (own accounting, FlashMLA's conventions where they apply).

Dense (prefill, decode, MLA latent decode):
  flops = 2 x h_q x (d + d_v) x (query, key) pairs the causal rule lets through (exact count, so a
          causal prefill counts about half the square; no extra for softmax).
  bytes = q + K rows read + V rows read + out + lse, with K/V counted once per KV head and only up to
          each sequence's length; with shared K/V (MLA) V lives inside K and is not counted again.
Sparse (per-slot semantics, kernels.attention.reference): flops = 2 x h_q x (d + d_v) x valid index
  slots, summed over the query tokens (the kernel computes a score and a P @ V term for every valid slot,
  a repeated position once per slot; FlashMLA's tests also count flops per slot); bytes = the distinct K (and
  V) rows the batch names, once per KV head, + q + out + lse + indices. What the kernel issues is more:
  each program (one token, one KV head, one block of its heads) gathers the row of every valid slot, so
  a repeated position, a row named by several tokens and a token's second head block all re-read rows,
  mostly from L2. Those re-reads are the kernel's choice, not the problem's: the distinct rows are the
  least HBM traffic that can produce the answer (a repeat needs no second read: it doubles a weight), so
  the fraction of roofline cannot exceed 100% and a kernel that re-reads less scores better. (FlashMLA's
  sparse decode test counts bytes this way, by unique retrieved tokens.) Invalid slots (padding, or an
  index outside [0, s_k)) cost nothing. Without the indices at hand (the spec-level `cost`), the distinct
  rows of a sequence are bounded by min(s_k, s_q x topk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

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
    """`selected`: valid index slots, summed over every query token of the batch (a repeated position
    once per slot); `distinct`: distinct (sequence, position) pairs among them, the K/V rows the answer
    needs (the bytes counted)."""
    if distinct > selected:
        raise ValueError(f"distinct positions ({distinct}) cannot exceed selected ones ({selected})")
    row = d + (0 if shared_kv else d_v)
    kv = float(distinct * h_kv * row * elem)
    flops = 2.0 * h_q * (d + d_v) * selected
    idx = float(batch * s_q * topk * 4)
    read = kv + idx + _q_bytes(batch, s_q, h_q, d, elem)
    return AttentionCost(flops, read, _written_bytes(batch, s_q, h_q, d_v, elem), kv)


def valid_slots(indices: torch.Tensor, s_k: int) -> int:
    """Index slots of `indices [b, s_q, topk]` in [0, s_k), repeats counted once per slot: the (token,
    key) pairs whose scores are computed."""
    return int(((indices >= 0) & (indices < s_k)).sum())


def distinct_positions(indices: Sequence, s_k: int | None = None) -> int:
    """Distinct valid positions (>= 0, and < s_k when given) per sequence of `indices [b, s_q, topk]`,
    summed over the batch: the K/V rows each sequence needs, once each."""
    total = 0
    for row in indices:
        ok = row >= 0 if s_k is None else (row >= 0) & (row < s_k)
        total += int(row[ok].unique().numel())
    return total
