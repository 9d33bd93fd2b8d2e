"""Top-k sparse attention in Triton (DeepSeek sparse attention): each query token attends only to the
KV rows its indices name, gathered by index.

Grid (b x s_q, h_kv, row blocks): a program owns one query token and BLOCK_M of the query heads that
share one KV head (all heads of a token share its indices). It walks `indices[b, i]` BLOCK_N slots at a
time, gathers those K rows (and the V rows, which may live inside K as in MLA) and runs the online
softmax. An index outside [0, s_k_b) (-1 is the padding value) is an invalid slot: masked, never
dereferenced.

Semantics (kernels.attention.reference, FlashMLA's): the softmax is over the index SLOTS. A position
named twice is gathered twice and counted twice, as FlashMLA's sparse references do; there is no
de-duplication anywhere, so the timed call is the kernel alone. lse is the natural log; a token
whose slots are all invalid gets out 0 and lse +inf (kernels.common.lse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.triton_prefill import _check
from kernels.common.lse import scale_of
from kernels.common.triton_attention import (
    LOG2E,
    head_dims,
    lens_arg,
    load_q,
    load_v,
    qk_scores,
    row_outputs,
    row_strides,
    rows_block,
    seq_keys,
    softmax_init,
    softmax_step,
    store_result,
    tile_meta,
)


@triton.jit
def _sparse_kernel(
    q_ptr, k_ptr, v_ptr, idx_ptr, o_ptr, lse_ptr, lens_ptr,
    sm_scale_log2,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ib, stride_is,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    S_Q, S_K, H_KV, GROUP, TOPK,
    D1: tl.constexpr, D2: tl.constexpr, BLOCK_D2: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LENS: tl.constexpr, F32: tl.constexpr, V_IN_K: tl.constexpr,
):  # fmt: skip
    bt = tl.program_id(0)
    kvh = tl.program_id(1)
    mb = tl.program_id(2)
    b = bt // S_Q
    t = bt % S_Q
    s_k = seq_keys(lens_ptr, b, S_K, HAS_LENS)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < GROUP
    head = kvh * GROUP + offs_m
    q1, q2 = load_q(q_ptr + b * stride_qb + t * stride_qs + head * stride_qh, m_ok, D1, D2, BLOCK_D2)
    m_i, l_i, acc = softmax_init(BLOCK_M, BLOCK_DV)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    idx_row = idx_ptr + b * stride_ib + t * stride_is
    for n0 in range(0, TOPK, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_row + offs_n, mask=offs_n < TOPK, other=-1)
        ok = (idx >= 0) & (idx < s_k)
        pos = tl.where(ok, idx, 0).to(tl.int64)
        s, k1 = qk_scores(q1, q2, k_base + pos * stride_ks, ok, sm_scale_log2, D1, D2, BLOCK_D2, F32)
        v = load_v(k1, v_base + pos * stride_vs, ok, DV, BLOCK_DV, V_IN_K)
        m_i, l_i, acc = softmax_step(s, ok[None, :], m_i, l_i, acc, v, F32)
    o_rows = o_ptr + b * stride_ob + t * stride_os + head * stride_oh
    lse_rows = lse_ptr + b * stride_lb + head * stride_lh + t
    store_result(o_rows, lse_rows, m_i, l_i, acc, m_ok, DV, BLOCK_DV, True)


def sparse_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    *,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int = 2,
    launches: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v], indices [b, s_q, topk] int
    -> (out [b, s_q, h_q, d_v] in q's dtype, lse [b, h_q, s_q] fp32, natural log). Every valid slot counts,
    repeats included. int32 indices on q's device are used as they are (no copy in the timed call)."""
    b, s_q, h_q, d = q.shape
    _check(q, k, v)
    if indices.dim() != 3 or indices.shape[:2] != (b, s_q):
        raise ValueError(f"indices must be [{b}, {s_q}, topk], got {tuple(indices.shape)}")
    h_kv = k.shape[2]
    group = h_q // h_kv
    dims = head_dims(d, v.shape[-1])
    idx = indices.to(device=q.device, dtype=torch.int32).contiguous()
    topk = idx.shape[-1]
    bm = rows_block(group, dims.block_dv, block_m)
    scale = scale_of(d, softmax_scale)
    out, lse = row_outputs(q, dims.dv)
    lens = lens_arg(seqlens_k, lse)
    handle = _sparse_kernel[(b * s_q, h_kv, triton.cdiv(group, bm))](
        q, k, v, idx, out, lse, lens,
        scale * LOG2E,
        *row_strides(q, k, v),
        idx.stride(0), idx.stride(1),
        *row_strides(out),
        lse.stride(0), lse.stride(1),
        s_q, k.shape[1], h_kv, group, topk,
        HAS_LENS=seqlens_k is not None,
        **tile_meta(q, k, v, dims, bm, block_n, num_warps, num_stages),
    )  # fmt: skip
    if launches is not None:
        launches.append(("_sparse_kernel", handle))
    return out.to(q.dtype), lse
