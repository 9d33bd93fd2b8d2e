"""The torch reference MLA decode over a paged KV cache: fp32 math, runs anywhere (CPU included).

It gathers exactly the first cache_seqlens[b] slots of each sequence through the block table (never an
unused slot or block-table entry), dequantises fp8 with the per-token scales, or FlashMLA's 656-byte
tokens as FlashMLA does (NoPE x its tile's power-of-two scale stored in bf16, bf16 RoPE:
kernels.common.mla.layout.dequantize_flashmla), and computes in fp32 from those values. The causal rule
inside the query block: query i of s_q sees keys 0 .. seqlen - s_q + i. Softmax scale 1 / sqrt(d) unless
given; lse is a natural log. Rows that see no key get out = 0 and lse = +inf (EMPTY_ROW_LSE, FlashMLA's
convention: kernels.common.lse).
"""

from __future__ import annotations

import torch

from kernels.common.lse import scale_of
from kernels.common.mla.layout import D_V, EMPTY_ROW_LSE, dequantize_flashmla, is_flashmla_fp8


def gather_kv(
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seqlen: int,
    batch_index: int,
    kv_scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """The first `seqlen` cached tokens of one sequence as fp32 [seqlen, head_dim] (FlashMLA's fp8 tokens
    dequantised to bf16 first, as FlashMLA's references read them)."""
    page = kv_cache.shape[1]
    n_pages = -(-seqlen // page)
    pages = block_table[batch_index, :n_pages].long()
    kv = kv_cache[pages].reshape(n_pages * page, -1)[:seqlen]
    kv = dequantize_flashmla(kv).float() if is_flashmla_fp8(kv_cache) else kv.float()
    if kv_scales is not None:
        kv = kv * kv_scales[pages].reshape(-1)[:seqlen, None].float()
    return kv


def causal_visible(seqlen: int, s_q: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[s_q, seqlen] bool: key j is visible to query i iff j <= seqlen - s_q + i."""
    j = torch.arange(seqlen, device=device)
    last = seqlen - s_q + torch.arange(s_q, device=device)
    return j[None, :] <= last[:, None]


def mla_decode_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    kv_scales: torch.Tensor | None = None,
    d_v: int = D_V,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, s_q, h_q, d] -> (out [b, s_q, h_q, d_v] fp32, lse [b, h_q, s_q] fp32)."""
    b, s_q, h_q, d = q.shape
    if kv_cache.shape[-1] != d and not is_flashmla_fp8(kv_cache):
        raise ValueError(f"q head dim {d} != cache head dim {kv_cache.shape[-1]}")
    scale = scale_of(d, softmax_scale)
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h_q, s_q), EMPTY_ROW_LSE, dtype=torch.float32, device=q.device)
    for i, seqlen in enumerate(cache_seqlens.tolist()):
        if seqlen <= 0:
            continue
        kv = gather_kv(kv_cache, block_table, seqlen, i, kv_scales).to(q.device)
        scores = torch.einsum("shd,td->sht", q[i].float(), kv) * scale  # [s_q, h_q, seqlen]
        visible = causal_visible(seqlen, s_q, q.device)[:, None, :]
        scores = scores.masked_fill(~visible, float("-inf"))
        row_lse = torch.logsumexp(scores, dim=-1)  # -inf for rows that see nothing
        empty = torch.isneginf(row_lse)
        p = torch.exp(scores - torch.where(empty, 0.0, row_lse)[..., None])
        out[i] = torch.einsum("sht,tv->shv", p, kv[:, :d_v])
        lse[i] = torch.where(empty, EMPTY_ROW_LSE, row_lse).transpose(0, 1)
    return out, lse
