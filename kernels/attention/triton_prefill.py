"""Flash-attention forward in Triton: online softmax, causal (bottom-right aligned), GQA.

Grid (cdiv(s_q, BLOCK_M), b x h_q): a program owns BLOCK_M query rows of one head and walks the keys of
that head's KV head (h // group) BLOCK_N at a time, stopping at the last key its last row can see. The
causal rule, the per-sequence key counts and the empty-row convention are those of
kernels.attention.reference. Returns out [b, s_q, h_q, d_v] (q's dtype) and lse [b, h_q, s_q] fp32
(natural log; out 0 and lse +inf for a row that sees no key, kernels.common.lse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.common.lse import scale_of
from kernels.common.triton_attention import (
    LOG2E,
    attend_keys,
    head_dims,
    lens_arg,
    load_q,
    row_outputs,
    row_strides,
    rows_block,
    seq_keys,
    softmax_init,
    store_result,
    tile_meta,
)


@triton.jit
def _flash_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, lens_ptr,
    sm_scale_log2,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    S_Q, S_K, H_Q, GROUP,
    D1: tl.constexpr, D2: tl.constexpr, BLOCK_D2: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, F32: tl.constexpr, V_IN_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H_Q
    h = bh % H_Q
    kvh = h // GROUP
    s_k = seq_keys(lens_ptr, b, S_K, HAS_LENS)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < S_Q
    q1, q2 = load_q(q_ptr + b * stride_qb + offs_m * stride_qs + h * stride_qh, m_ok, D1, D2, BLOCK_D2)
    last = s_k - S_Q + offs_m  # the last key each row sees (causal)
    hi = s_k
    if CAUSAL:
        hi = tl.minimum(s_k, (pid_m + 1) * BLOCK_M - 1 + s_k - S_Q + 1)
    m_i, l_i, acc = softmax_init(BLOCK_M, BLOCK_DV)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    m_i, l_i, acc = attend_keys(
        q1, q2, k_base, v_base, stride_ks, stride_vs, 0, hi, s_k, last, m_i, l_i, acc, sm_scale_log2,
        D1, D2, BLOCK_D2, DV, BLOCK_DV, BLOCK_N, CAUSAL, F32, V_IN_K,
    )  # fmt: skip
    o_rows = o_ptr + b * stride_ob + offs_m * stride_os + h * stride_oh
    lse_rows = lse_ptr + b * stride_lb + h * stride_lh + offs_m
    store_result(o_rows, lse_rows, m_i, l_i, acc, m_ok, DV, BLOCK_DV, True)


def flash_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int = 2,
    launches: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v] -> (out, lse).

    Any strides are accepted as long as the head dims are contiguous (V may be a view into K, as in
    MLA). `launches`, when given, receives (name, compiled kernel) for resource inspection.
    """
    b, s_q, h_q, d = q.shape
    _check(q, k, v)
    dims = head_dims(d, v.shape[-1])
    scale = scale_of(d, softmax_scale)
    out, lse = row_outputs(q, dims.dv)
    lens = lens_arg(seqlens_k, lse)
    bm = rows_block(s_q, dims.block_dv, block_m)
    grid = (triton.cdiv(s_q, bm), b * h_q)
    handle = _flash_fwd_kernel[grid](
        q, k, v, out, lse, lens,
        scale * LOG2E,
        *row_strides(q, k, v, out),
        lse.stride(0), lse.stride(1),
        s_q, k.shape[1], h_q, h_q // k.shape[2],
        CAUSAL=causal, HAS_LENS=seqlens_k is not None,
        **tile_meta(q, k, v, dims, bm, block_n, num_warps, num_stages),
    )  # fmt: skip
    if launches is not None:
        launches.append(("_flash_fwd_kernel", handle))
    return out.to(q.dtype), lse


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    b, _, h_q, d = q.shape
    if k.dim() != 4 or k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must be [{b}, s_k, h_kv, {d}], got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"v must be [{b}, {k.shape[1]}, {k.shape[2]}, d_v], got {tuple(v.shape)}")
    if h_q % k.shape[2]:
        raise ValueError(f"h_q ({h_q}) must be a multiple of h_kv ({k.shape[2]})")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("q, k and v must be contiguous in the head dimension")
