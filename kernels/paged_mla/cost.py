"""Cost model for paged MLA decode (FlashMLA's accounting).

bytes = KV actually read (sum of seqlen x bytes per token: d_qk x elem size, plus the per-token fp32 scale
        for fp8; 656 for fp8_flashmla, as FlashMLA counts it)
        + q + out. The block table, seqlens and lse are not counted (negligible).
flops = sum over batch of 2 x h_q x s_q x seqlen x (d_qk + d_v). The causal mask inside an s_q > 1 block
        is ignored, as FlashMLA does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels.base import Cost
from kernels.paged_mla.layout import D_QK, D_V, elem_size, kv_bytes_per_token


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
) -> DecodeCost:
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    batch = len(lens)
    total = sum(int(n) for n in lens)
    kv_bytes = total * kv_bytes_per_token(kv_dtype, d_qk)
    q_bytes = batch * s_q * h_q * d_qk * elem_size(q_dtype)
    out_bytes = batch * s_q * h_q * d_v * elem_size(out_dtype)
    flops = 2.0 * h_q * s_q * total * (d_qk + d_v)
    return DecodeCost(
        flops=flops,
        bytes_read=float(kv_bytes + q_bytes),
        bytes_written=float(out_bytes),
        kv_bytes=float(kv_bytes),
        q_bytes=float(q_bytes),
        out_bytes=float(out_bytes),
    )
