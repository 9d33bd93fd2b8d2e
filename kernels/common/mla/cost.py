"""Cost model for paged MLA decode: FlashMLA's accounting for GB/s, the distinct bytes for the roofline.

bytes = KV actually read (sum of seqlen x bytes per token: d_qk x elem size, plus the per-token fp32 scale
        for fp8; 656 for fp8_flashmla, as FlashMLA counts it)
        + q + out. The block table, seqlens and lse are not counted (negligible). FlashMLA's convention:
        every sequence's KV is counted, a shared prefix once per sequence that reads it, and the split
        partials not at all. GB/s is on these bytes, so it compares with FlashMLA's published figures.
hbm bytes (Cost.hbm_bytes: the roofline and hbm_fraction) = the distinct bytes HBM moves: a shared
        prefix's pages once (they are stored once: kernels.paged_mla.inputs.pages_needed), plus, per
        trial, the fp32 split partials the split kernel writes and the combine reads back
        (`partial_bytes`: they depend on the trial's split plan, about +17% at b128 h128 s4096). Where
        the two differ, a trial reports both (gbps and hbm_gbps).
flops = sum over batch of 2 x h_q x s_q x seqlen x (d_qk + d_v). The causal mask inside an s_q > 1 block
        is ignored, as FlashMLA does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.base import Cost
from kernels.common.mla.layout import D_QK, D_V, elem_size, kv_bytes_per_token


@dataclass(frozen=True)
class DecodeCost(Cost):
    """The farm's Cost (read = KV + q, written = out) with its breakdown; rates come from
    kernels.base.derive_rates."""

    kv_bytes: float = 0.0
    q_bytes: float = 0.0
    out_bytes: float = 0.0


def mla_decode_cost(
    cache_seqlens: Sequence[int] | torch.Tensor,
    *,
    h_q: int,
    s_q: int = 1,
    kv_dtype: str = "bf16",
    q_dtype: str = "bf16",
    out_dtype: str = "bf16",
    d_qk: int = D_QK,
    d_v: int = D_V,
    shared_prefix: int = 0,
    page_size: int = 64,
) -> DecodeCost:
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    batch = len(lens)
    total = sum(int(n) for n in lens)
    per_token = kv_bytes_per_token(kv_dtype, d_qk)
    kv_bytes = total * per_token
    # the prefix tokens every sequence after the first re-reads from the one stored copy: its full pages
    # (a sequence's partial prefix page is its own, as kernels.paged_mla.inputs.pages_needed stores it)
    shared = [min(int(n), shared_prefix) // page_size * page_size for n in lens]
    reread = sum(shared) - max(shared, default=0)
    q_bytes = batch * s_q * h_q * d_qk * elem_size(q_dtype)
    out_bytes = batch * s_q * h_q * d_v * elem_size(out_dtype)
    flops = 2.0 * h_q * s_q * total * (d_qk + d_v)
    return DecodeCost(
        flops=flops,
        bytes_read=float(kv_bytes + q_bytes),
        bytes_written=float(out_bytes),
        hbm_bytes_moved=float(kv_bytes + q_bytes + out_bytes - reread * per_token) if reread else None,
        kv_bytes=float(kv_bytes),
        q_bytes=float(q_bytes),
        out_bytes=float(out_bytes),
    )


def partial_bytes(chunks: int, rows: int, d_v: int = D_V) -> float:
    """The split partials' HBM traffic: fp32 out [chunks, rows, d_v] and lse [chunks, rows], written by the
    split kernel and read back by the combine."""
    return 2.0 * chunks * rows * (d_v + 1) * 4
