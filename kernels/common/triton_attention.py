"""The Triton building blocks of attention kernels (attention's prefill, decode and sparse kernels, and
the paged MLA decode of kernels.common.mla).

Head dimensions: `tl.dot` needs power-of-two tiles, so a head dim d is split as d = D1 + D2 with D1 the
largest power of two <= d and D2 the rest (576 = 512 + 64, 192 = 128 + 64, 128 = 128 + 0); the tail is
padded to a power of two >= 16 and masked. The QK^T score of a tile is the sum of the two dots.
V's dim is padded to a power of two and masked.

Dot precision: on a GPU, bf16/fp16 operands go to the tensor cores as they are (fp32 accumulate; P is
rounded to the input dtype before P @ V) and fp32 operands use IEEE fp32 (no TF32). The interpreter
(TRITON_INTERPRET=1) computes bf16 dots wrong, so there every operand is upcast to fp32 (`F32=True`).
The interpreter's fp32 -> bf16 cast truncates, so there the kernels store fp32 and torch rounds.

lse (kernels.common.lse): natural log; the online softmax runs in base 2 and converts back when it
stores. A row's final lse is EMPTY_ROW_LSE (+inf, out 0) when it saw no key: `finish_row` (single-pass
kernels) and `merge_splits` (the split-KV combine) write that. A split-KV partial is finished with
`finish` instead, which keeps the log-sum-exp of an empty set, -inf, so that the combine weights an
empty split by exp(-inf) = 0; only the merged lse of a row no split saw becomes +inf.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kernels.hardware import triton_interpreting

LOG2E = 1.4426950408889634
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 64


interpreting = triton_interpreting


@dataclass(frozen=True)
class HeadDims:
    d1: int  # power-of-two part of the QK head dim
    d2: int  # the rest (0 if d is a power of two)
    block_d2: int  # the rest padded to a power of two >= 16
    dv: int
    block_dv: int

    @property
    def has_d2(self) -> bool:
        return self.d2 > 0


def head_dims(d: int, d_v: int) -> HeadDims:
    if d < 16 or d_v < 1:
        raise ValueError(f"head dims must be d >= 16 and d_v >= 1, got d={d}, d_v={d_v}")
    d1 = 1 << (d.bit_length() - 1)
    d2 = d - d1
    return HeadDims(
        d1, d2, max(16, triton.next_power_of_2(max(d2, 1))), d_v, max(16, triton.next_power_of_2(d_v))
    )


def v_in_k(k: torch.Tensor, v: torch.Tensor, dims: HeadDims) -> bool:
    """V is the first D1 channels of the K rows (MLA's latent cache): the kernels reuse the K tile."""
    return v.data_ptr() == k.data_ptr() and v.stride() == k.stride() and dims.dv == dims.d1


def rows_block(rows: int, block_dv: int, requested: int | None = None) -> int:
    """Query rows per tile: the smallest of 16/32/64 covering `rows`, halved while the fp32
    accumulator [rows, block_dv] would exceed 16K elements (register pressure on a GPU)."""
    if requested:
        return requested
    bm = 16 if rows <= 16 else 32 if rows <= 32 else 64
    while bm > 16 and bm * block_dv > 16384:
        bm //= 2
    return bm


def warps_for(block_m: int, block_dv: int, requested: int | None = None) -> int:
    return requested or (8 if block_m * block_dv >= 16384 else 4)


def split_count(programs: int, keys: float, chunks: int, num_sms: int) -> int:
    """Splits per sequence for a split-KV decode: enough that `programs` x splits covers the SMs about
    once, capped so that a split keeps >= MIN_KEYS_PER_SPLIT of the sequence's `keys` and at least one of
    its `chunks` (key blocks, pages), and by MAX_SPLITS; at least 1."""
    want = triton.cdiv(num_sms, max(programs, 1))
    by_keys = max(1, int(keys // MIN_KEYS_PER_SPLIT))
    return max(1, min(want, by_keys, max(1, chunks), MAX_SPLITS))


def use_f32_dots(dtype: torch.dtype) -> bool:
    """Upcast dot operands to fp32 (interpreter, or fp32 inputs where IEEE precision is wanted)."""
    return interpreting() or dtype == torch.float32


def store_dtype(want: torch.dtype) -> torch.dtype:
    """The dtype the kernel writes `out` in (fp32 in the interpreter, where torch then rounds)."""
    return torch.float32 if interpreting() else want


def tile_meta(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dims: HeadDims,
    block_m: int,
    block_n: int,
    num_warps: int | None,
    num_stages: int,
) -> dict:
    """The launch keywords the attention kernels share: head-dim split, tiles, dot precision, V in K,
    warps and stages."""
    return dict(
        D1=dims.d1, D2=dims.d2, BLOCK_D2=dims.block_d2, DV=dims.dv, BLOCK_DV=dims.block_dv,
        BLOCK_M=block_m, BLOCK_N=block_n, F32=use_f32_dots(q.dtype), V_IN_K=v_in_k(k, v, dims),
        num_warps=warps_for(block_m, dims.block_dv, num_warps), num_stages=num_stages,
    )  # fmt: skip


def row_outputs(
    q: torch.Tensor, d_v: int, want: torch.dtype | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The outputs of q [b, s_q, h_q, d]'s rows: out [b, s_q, h_q, d_v] in the dtype the kernel stores for
    `want` (q's dtype by default; `store_dtype`) and lse [b, h_q, s_q] fp32."""
    b, s_q, h_q = q.shape[:3]
    out = torch.empty(b, s_q, h_q, d_v, dtype=store_dtype(want or q.dtype), device=q.device)
    return out, torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)


def lens_arg(seqlens_k: torch.Tensor | None, placeholder: torch.Tensor) -> torch.Tensor:
    """The per-sequence key counts as the kernels read them (int32 on the placeholder's device), or the
    placeholder when there are none (HAS_LENS=False: never read)."""
    if seqlens_k is None:
        return placeholder
    return seqlens_k.to(device=placeholder.device, dtype=torch.int32)


def row_strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The strides of the first three dims of each tensor in turn (batch, token, head of [b, s, h, d]), the
    launch arguments of the kernels' row pointers."""
    return tuple(stride for t in tensors for stride in t.stride()[:3])


@triton.jit
def seq_keys(lens_ptr, b, S_K, HAS_LENS: tl.constexpr):
    """Sequence b's key count: lens[b] when per-sequence lengths are given, else S_K."""
    if HAS_LENS:
        s_k = tl.load(lens_ptr + b)
    else:
        s_k = S_K
    return s_k


@triton.jit
def dot(a, b, F32: tl.constexpr):
    if F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def load_q(rows_ptr, row_ok, D1: tl.constexpr, D2: tl.constexpr, BLOCK_D2: tl.constexpr):
    """The two head-dim parts of the query rows `rows_ptr [M]` (0 where masked)."""
    offs1 = tl.arange(0, D1)
    offs2 = D1 + tl.arange(0, BLOCK_D2)
    q1 = tl.load(rows_ptr[:, None] + offs1[None, :], mask=row_ok[:, None], other=0.0)
    q2 = tl.load(
        rows_ptr[:, None] + offs2[None, :], mask=row_ok[:, None] & (offs2 < D1 + D2)[None, :], other=0.0
    )
    return q1, q2


@triton.jit
def store_rows(rows_ptr, x, row_ok, DV: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Write the first DV channels of `x [M, BLOCK_DV]` to the rows `rows_ptr [M]` (masked rows skipped)."""
    offs = tl.arange(0, BLOCK_DV)
    tl.store(rows_ptr[:, None] + offs[None, :], x, mask=row_ok[:, None] & (offs < DV)[None, :])


@triton.jit
def qk_scores(
    q1,
    q2,
    k_rows_ptr,
    key_ok,
    scale,
    D1: tl.constexpr,
    D2: tl.constexpr,
    BLOCK_D2: tl.constexpr,
    F32: tl.constexpr,
):
    """q @ k^T x `scale` for the key rows `k_rows_ptr [N]` (masked keys read as 0): ([M, N] fp32, the K
    tile's first D1 channels, which serve as V when V is the start of K and d_v == D1, as in MLA)."""
    offs1 = tl.arange(0, D1)
    k1 = tl.load(k_rows_ptr[:, None] + offs1[None, :], mask=key_ok[:, None], other=0.0)
    s = dot(q1, tl.trans(k1), F32)
    if D2 > 0:
        offs2 = D1 + tl.arange(0, BLOCK_D2)
        k2 = tl.load(
            k_rows_ptr[:, None] + offs2[None, :], mask=key_ok[:, None] & (offs2 < D1 + D2)[None, :], other=0.0
        )
        s += dot(q2, tl.trans(k2), F32)
    return s * scale, k1


@triton.jit
def load_v(k1, v_rows_ptr, key_ok, DV: tl.constexpr, BLOCK_DV: tl.constexpr, V_IN_K: tl.constexpr):
    """The V tile of the key rows: the K tile's first channels `k1` when V lies in K, else loaded from
    `v_rows_ptr [N]` (masked keys read as 0)."""
    if V_IN_K:
        v = k1
    else:
        offs = tl.arange(0, BLOCK_DV)
        v = tl.load(
            v_rows_ptr[:, None] + offs[None, :], mask=key_ok[:, None] & (offs < DV)[None, :], other=0.0
        )
    return v


@triton.jit
def visible_keys(offs_n, key_ok, last, CAUSAL: tl.constexpr):
    """[M, N]: key n exists and, when causal, is at or before row m's last visible key `last [M]`."""
    visible = key_ok[None, :]
    if CAUSAL:
        visible = visible & (offs_n[None, :] <= last[:, None])
    return visible


@triton.jit
def softmax_init(BLOCK_M: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The online-softmax state of rows that have seen no key: m = -inf, l = 0, acc = 0."""
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    return m_i, l_i, acc


@triton.jit
def online_weights(s, visible, m_i, l_i):
    """The bookkeeping of one online-softmax update: the new row maxima, the new sums, the factor `alpha`
    the old accumulator is rescaled by and the tile's weights `p` (base 2; invisible scores weigh 0)."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    return m_new, l_i * alpha + tl.sum(p, axis=1), alpha, p


@triton.jit
def attend_keys(
    q1, q2, k_base, v_base, stride_ks, stride_vs, lo, hi, key_end, last, m_i, l_i, acc, sm_scale_log2,
    D1: tl.constexpr, D2: tl.constexpr, BLOCK_D2: tl.constexpr, DV: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, F32: tl.constexpr, V_IN_K: tl.constexpr,
):  # fmt: skip
    """The online softmax of one block of query rows over keys lo .. hi of a KV head (k_base, v_base),
    BLOCK_N at a time; keys from key_end on do not exist, and when causal row m sees keys up to last[m]."""
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < key_end
        s, k1 = qk_scores(q1, q2, k_base + offs_n * stride_ks, n_ok, sm_scale_log2, D1, D2, BLOCK_D2, F32)
        v = load_v(k1, v_base + offs_n * stride_vs, n_ok, DV, BLOCK_DV, V_IN_K)
        visible = visible_keys(offs_n, n_ok, last, CAUSAL)
        m_i, l_i, acc = softmax_step(s, visible, m_i, l_i, acc, v, F32)
    return m_i, l_i, acc


@triton.jit
def softmax_step(s, visible, m_i, l_i, acc, v, F32: tl.constexpr):
    """One online-softmax update (base 2; `s` already scaled by log2(e) x softmax scale).

    Invisible scores become -inf; a row that has seen nothing yet keeps m = -inf and l = 0 (the
    exponent is taken against 0 there so no NaN appears)."""
    m_new, l_i, alpha, p = online_weights(s, visible, m_i, l_i)
    if F32:
        pv = dot(p, v, F32)
    else:
        pv = dot(p.to(v.dtype), v, F32)
    acc = acc * alpha[:, None] + pv
    return m_new, l_i, acc


@triton.jit
def finish(m_i, l_i, acc):
    """A split-KV PARTIAL: normalised output and natural-log lse; rows that saw no key get 0 and -inf
    (the empty set's log-sum-exp, weighted 0 by the combine). A row's final result: `finish_row`."""
    has = l_i > 0.0
    l_safe = tl.where(has, l_i, 1.0)
    out = acc / l_safe[:, None]
    lse = tl.where(has, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
    return out, lse


@triton.jit
def finish_row(m_i, l_i, acc):
    """A row's FINAL normalised output and natural-log lse; a row that saw no key gets out 0 and lse
    +inf (kernels.common.lse.EMPTY_ROW_LSE)."""
    out, lse = finish(m_i, l_i, acc)
    return out, tl.where(l_i > 0.0, lse, float("inf"))


@triton.jit
def store_result(
    o_rows_ptr, lse_rows_ptr, m_i, l_i, acc, row_ok,
    DV: tl.constexpr, BLOCK_DV: tl.constexpr, FINAL: tl.constexpr,
):  # fmt: skip
    """Finish a block of rows and write out [M, DV] to `o_rows_ptr [M]` and the lse to `lse_rows_ptr [M]`
    (masked rows skipped): a row's FINAL result (`finish_row`) or a split-KV partial (`finish`)."""
    if FINAL:
        out, lse = finish_row(m_i, l_i, acc)
    else:
        out, lse = finish(m_i, l_i, acc)
    store_rows(o_rows_ptr, out, row_ok, DV, BLOCK_DV)
    tl.store(lse_rows_ptr, lse, mask=row_ok)


@triton.jit
def lse_shift(lses):
    """The largest split lse, or 0 when every split is empty (-inf): exp(lse_s - shift) is then 0 for an
    empty split and never NaN."""
    m = tl.max(lses, axis=0)
    return tl.where(m == float("-inf"), 0.0, m)


@triton.jit
def merge_splits(acc, total, shift):
    """Merge split-KV partials by their lse: with w_s = exp(lse_s - shift), acc = sum_s w_s out_s and
    total = sum_s w_s, the output is acc / total and the lse shift + log(total) (natural log); a row no
    split saw (every partial -inf) gets out 0 and lse +inf (kernels.common.lse.EMPTY_ROW_LSE)."""
    has = total > 0.0
    total_safe = tl.where(has, total, 1.0)
    return acc / total_safe, tl.where(has, shift + tl.log(total_safe), float("inf"))
