"""Split-KV decode in Triton, with the query heads of one KV head packed into the rows of a tile.

Decode has few query tokens (s_q = 1, or a few for speculative / multi-token prediction), so a
prefill-style grid over query rows would leave most of the GPU idle and re-read K/V once per query
head. Here the rows of a tile are the (token, head) pairs sharing one KV head: row r is token
r // group, head kvh x group + r % group. That makes K/V rows read once per KV head, and for the MLA
latent form (one KV head, 128 query heads, V inside K) once per sequence.

Stage 1 `_decode_split_kernel`, grid (b x h_kv, num_splits, row blocks): split s walks keys
[s x chunk, (s + 1) x chunk) of its sequence (chunk a multiple of BLOCK_N), with the causal rule of
kernels.attention.reference, and writes a normalised partial output and a partial lse (fp32, natural
log; -inf for a split with no visible key, so the combine gives it weight 0).
Stage 2 `_decode_combine_kernel`, grid (b x h_kv, rows): merges splits by lse into out [b, s_q, h_q,
d_v] and lse [b, h_q, s_q]; a row no split saw gets out 0 and lse +inf (kernels.common.lse). Splits are
chosen from the SM count (`choose_splits`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.attention.triton_prefill import _check
from kernels.common.lse import scale_of
from kernels.common.triton_attention import (
    LOG2E,
    attend_keys,
    head_dims,
    lens_arg,
    load_q,
    lse_shift,
    merge_splits,
    row_outputs,
    row_strides,
    rows_block,
    seq_keys,
    softmax_init,
    split_count,
    store_result,
    tile_meta,
)
from kernels.hardware import HOPPER_SMS

NUM_SMS = HOPPER_SMS


def choose_splits(
    batch: int, h_kv: int, row_blocks: int, s_k: int, block_n: int, num_sms: int = NUM_SMS
) -> int:
    """Enough splits for programs to cover the SMs about once, each split keeping >= 256 keys."""
    return split_count(batch * h_kv * row_blocks, s_k, triton.cdiv(s_k, block_n), num_sms)


@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, po_ptr, pl_ptr, lens_ptr,
    sm_scale_log2,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_pob, stride_pos, stride_pom,
    stride_plb, stride_pls,
    S_Q, S_K, H_KV, GROUP, CHUNK,
    D1: tl.constexpr, D2: tl.constexpr, BLOCK_D2: tl.constexpr,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_LENS: tl.constexpr, F32: tl.constexpr, V_IN_K: tl.constexpr,
):  # fmt: skip
    bk = tl.program_id(0)
    split = tl.program_id(1)
    mb = tl.program_id(2)
    b = bk // H_KV
    kvh = bk % H_KV
    s_k = seq_keys(lens_ptr, b, S_K, HAS_LENS)
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < S_Q * GROUP
    tok = offs_m // GROUP
    head = kvh * GROUP + offs_m % GROUP
    q_rows = q_ptr + b * stride_qb + tok * stride_qs + head * stride_qh
    q1, q2 = load_q(q_rows, m_ok, D1, D2, BLOCK_D2)
    last = s_k - S_Q + tok  # the last key each row sees (causal)
    start = split * CHUNK
    end = tl.minimum(start + CHUNK, s_k)
    m_i, l_i, acc = softmax_init(BLOCK_M, BLOCK_DV)
    k_base = k_ptr + b * stride_kb + kvh * stride_kh
    v_base = v_ptr + b * stride_vb + kvh * stride_vh
    m_i, l_i, acc = attend_keys(
        q1, q2, k_base, v_base, stride_ks, stride_vs, start, end, end, last, m_i, l_i, acc, sm_scale_log2,
        D1, D2, BLOCK_D2, DV, BLOCK_DV, BLOCK_N, CAUSAL, F32, V_IN_K,
    )  # fmt: skip
    po_rows = po_ptr + bk * stride_pob + split * stride_pos + offs_m * stride_pom
    pl_rows = pl_ptr + bk * stride_plb + split * stride_pls + offs_m
    store_result(po_rows, pl_rows, m_i, l_i, acc, m_ok, DV, BLOCK_DV, False)


@triton.jit
def _decode_combine_kernel(
    po_ptr, pl_ptr, o_ptr, lse_ptr,
    stride_pob, stride_pos, stride_pom,
    stride_plb, stride_pls,
    stride_ob, stride_os, stride_oh,
    stride_lb, stride_lh,
    H_KV, GROUP, NUM_SPLITS,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    bk = tl.program_id(0)
    row = tl.program_id(1)
    b = bk // H_KV
    tok = row // GROUP
    head = (bk % H_KV) * GROUP + row % GROUP
    offs_s = tl.arange(0, BLOCK_S)
    s_ok = offs_s < NUM_SPLITS
    lse_s = tl.load(pl_ptr + bk * stride_plb + offs_s * stride_pls + row, mask=s_ok, other=float("-inf"))
    shift = lse_shift(lse_s)
    w = tl.exp(lse_s - shift)  # 0 for empty splits
    total = tl.sum(w, axis=0)
    offs_v = tl.arange(0, BLOCK_DV)
    v_ok = offs_v < DV
    parts = tl.load(
        po_ptr + bk * stride_pob + offs_s[:, None] * stride_pos + row * stride_pom + offs_v[None, :],
        mask=s_ok[:, None] & v_ok[None, :] & (w > 0.0)[:, None],
        other=0.0,
    )
    out, lse = merge_splits(tl.sum(parts * w[:, None], axis=0), total, shift)
    tl.store(o_ptr + b * stride_ob + tok * stride_os + head * stride_oh + offs_v, out, mask=v_ok)
    tl.store(lse_ptr + b * stride_lb + head * stride_lh + tok, lse)


def decode_attention_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    softmax_scale: float | None = None,
    seqlens_k: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_m: int | None = None,
    block_n: int = 64,
    num_warps: int | None = None,
    num_stages: int = 2,
    num_sms: int = NUM_SMS,
    launches: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention: q [b, s_q, h_q, d], k [b, s_k, h_kv, d], v [b, s_k, h_kv, d_v] (V may be a view
    into K) -> (out [b, s_q, h_q, d_v] in q's dtype, lse [b, h_q, s_q] fp32)."""
    b, s_q, h_q, d = q.shape
    _check(q, k, v)
    s_k, h_kv = k.shape[1], k.shape[2]
    group = h_q // h_kv
    rows = s_q * group
    dims = head_dims(d, v.shape[-1])
    bm = rows_block(rows, dims.block_dv, block_m)
    row_blocks = triton.cdiv(rows, bm)
    splits = num_splits or choose_splits(b, h_kv, row_blocks, s_k, block_n, num_sms)
    chunk = triton.cdiv(triton.cdiv(max(s_k, 1), splits), block_n) * block_n
    scale = scale_of(d, softmax_scale)
    dev = q.device
    part_out = torch.empty(b * h_kv, splits, rows, dims.dv, dtype=torch.float32, device=dev)
    part_lse = torch.empty(b * h_kv, splits, rows, dtype=torch.float32, device=dev)
    lens = lens_arg(seqlens_k, part_lse)
    h1 = _decode_split_kernel[(b * h_kv, splits, row_blocks)](
        q, k, v, part_out, part_lse, lens,
        scale * LOG2E,
        *row_strides(q, k, v, part_out),
        part_lse.stride(0), part_lse.stride(1),
        s_q, s_k, h_kv, group, chunk,
        CAUSAL=causal, HAS_LENS=seqlens_k is not None,
        **tile_meta(q, k, v, dims, bm, block_n, num_warps, num_stages),
    )  # fmt: skip
    out, lse = row_outputs(q, dims.dv)
    h2 = _decode_combine_kernel[(b * h_kv, rows)](
        part_out, part_lse, out, lse,
        *row_strides(part_out),
        part_lse.stride(0), part_lse.stride(1),
        *row_strides(out),
        lse.stride(0), lse.stride(1),
        h_kv, group, splits,
        DV=dims.dv, BLOCK_DV=dims.block_dv, BLOCK_S=max(2, triton.next_power_of_2(splits)),
        num_warps=4,
    )  # fmt: skip
    if launches is not None:
        launches.extend([("_decode_split_kernel", h1), ("_decode_combine_kernel", h2)])
    return out.to(q.dtype), lse
