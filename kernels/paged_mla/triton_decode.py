"""Triton split-KV MLA decode over a paged KV cache, plus the combine kernel.

Stage 1, `_split_kernel`, a 1-D grid of chunks x row blocks with the row block fastest: program id =
chunk * row_blocks + row_block. The chunks come from a split plan (kernels.paged_mla.split_plan, built on
the host from the lengths, outside the timed call): each is one token range [start, end) of one sequence,
and the chunks of one work unit of the plan are consecutive, so one unit's work runs as neighbouring
programs. Blocks are dispatched in id order, so the row blocks that read one KV range run side by side
and share it through L2 instead of each pulling it from HBM at a different time. The query rows of one
sequence are the s_q x h_q (token, head) pairs, all attending to the same single KV head. A program
walks its chunk BLOCK_N tokens at a time, looks each token's page up in the block table, loads the
576-channel rows (the first 512 reused as V) and runs an online softmax (base 2). An fp8 cache with
per-token scales is converted to bf16 as it is (exact: every e4m3 value is a bf16 value) and its scale
applied after the dots, to the scores (q . k_j x scale_j) and to P's columns before P @ V
(sum_j p_ij scale_j v_j). FlashMLA's fp8 layout (656 B/token: fp8 NoPE with one fp32 scale per 128
channels, bf16 RoPE) is read through three views of the same bytes and its NoPE dequantised to bf16 with
its tile's scale, as FlashMLA does (fp8 x scale in fp32, rounded to nearest bf16: exact for the
power-of-two scales FlashMLA's quantiser writes, kernels.paged_mla.layout; the interpreter rounds by bits,
since its own bf16 cast truncates), so the K it multiplies is the reference's bf16 K on a GPU and in the
interpreter alike. It writes a partial output (normalised, fp32) and a partial lse
(natural log, fp32) per chunk; a chunk with no visible key writes out 0 and lse -inf.
Every load is masked by the token's position < seqlen, so no slot past a sequence's length and no unused
block-table entry is ever dereferenced. Any page size works (the family's spec takes 1 to
layout.MAX_PAGE_SIZE): a token's page and slot come from its own position, so a BLOCK_N tile may
straddle pages and need not divide the page (default_block_n rounds other page sizes up to a power of
two; only the shipped spec's pages, layout.PAGE_SIZES, are register-checked below).

Stage 2, `_combine_kernel`, grid (batch, rows): merges a sequence's chunks by their lse
(out = sum_s exp(lse_s - lse) out_s, lse = log sum_s exp(lse_s)), writes out [b, s_q, h_q, d_v] in
q's dtype and lse [b, h_q, s_q] fp32; a row with no key anywhere gets out 0 and lse +inf (FlashMLA's
value; the convention of kernels.common.lse).

Default tiles on sm_90a (what the compiler makes of them: kernels.compiled, checked by
tests/kernels/paged_mla/test_paged_mla_compiled.py at the shipped spec's shapes), all with 8 warps, 2 stages
unless said otherwise; registers are capped (Triton's `maxnreg`, default_maxnreg) only where the capped
kernel compiles without spills (scripts/paged_mla_regs.py compiles the variants below):
  plain (bf16) cache, >= 64 query rows (h_q x s_q): BLOCK_M 64, BLOCK_N min(64, page). The dots are
    warpgroup MMAs (wgmma, M = 64 per warpgroup; the two warpgroups split N), Q and the K tile sit in
    shared memory (the K tile arrives by cp.async, double-buffered: ~216 KB); the fp32 accumulator
    [64, 512] alone is 128 registers a thread. At 2 stages the 64 x 64 tile takes 255 registers without
    spills, and a cap spills (240: 24 B, 232: 64 B); at 3 stages (221,696 B of shared memory, 512 B more:
    the K tile is not triple-buffered) a 240 cap compiles without spills, the same 76 wgmma and 3,376 SASS
    instructions as uncapped (3,368 at 2 stages), so that is the default (default_num_stages,
    default_maxnreg; a caller that sets num_stages 2 gets no cap). Also tried: BLOCK_N 32 (225-237
    registers, no spills at 2 or 3 stages) doubles the wgmma instructions of Q K^T (N 16 per warpgroup)
    and the accumulator rescales per token; 1 stage spills (304 B at 64, 208 B at 32); 4 warps (one
    warpgroup) spill ~1.1 KB, 16 warps (128-register limit) 184 B. Pages 16 and 32 (BLOCK_N 16 / 32)
    take 212-229 registers uncapped.
  fewer than 64 rows (h_q 16: 16 or 32 rows): BLOCK_M 16 / 32 with mma.sync. wgmma's M is 64 per
    warpgroup, so it would need the rows padded to 64: 4x / 2x the MMA and softmax work on masked rows
    for the same KV bytes.
  fp8 caches: mma.sync, BLOCK_M 32 (16 at <= 16 rows), BLOCK_N 32 at page >= 64 and 16 below (per-token
    scales); BLOCK_M 16, BLOCK_N 16 for FlashMLA's layout. An fp8 tile must pass through registers to
    become bf16 (the bf16 one goes to shared memory by cp.async); on top of the 128-register accumulator
    of a 64-row wgmma tile that spills on sm_90a (190-620 B of stack at every BLOCK_N from 16 to 64,
    1 to 3 stages; 16 warps cap a thread at 128 registers and spill more; a bf16 tile loaded through
    registers, num_stages 1, spills the same way), and with FlashMLA's layout a 32-row tile spills too
    (40-176 B). Halving the accumulator by splitting d_v over two programs would make each program redo
    Q K^T, ~1.5x the MMA work of a decode that is already compute-bound on an H200 at h_q 128 (~280 kFLOP
    per 1152-byte bf16 token: 240 FLOP/B against the H200's ~206).
  per-token fp8 cache, 32-row tiles: 254-255 registers uncapped, no spills; capped at 208 (default_maxnreg)
    no spills at every page and s_q 1 / 2, 24-40 more SASS instructions (2,696 against 2,656 at 32 x 32),
    the same 104 mma.sync. Caps 216-240 spill 8 B at s_q > 1 (240 is clean at s_q 1 and at 32 x 16),
    and at 1 or 3 stages under a 232-240 cap too; 4 warps spill 96 B uncapped. BLOCK_M 16 (the sm_100a
    tile: 160-172 registers, no spills) issues the same mma.sync per row but converts each fp8 tile once
    per 16 rows: 1,888 SASS instructions for 16 rows against 2,656 for 32 (1.4x a row). FlashMLA's layout
    (16 x 16) takes 226-229 registers uncapped.
  FlashMLA's layout reads its four per-128-channel scales as four [BLOCK_N] loads, not as one gathered
    [BLOCK_N, 512] tensor of pointers: 229 registers and no spills on sm_90a (255 and 48-64 B of stack on
    sm_100a with the gather).

Default tiles on sm_100a (B200; default_tiles(..., "sm_100a"), the same 8 warps and 2 stages), measured
the same way at the shipped spec's shapes; the per-block shared memory limit is 232,448 B as on sm_90a:
  plain (bf16) cache, >= 64 rows: BLOCK_M 64, BLOCK_N min(32, page), on tcgen05. The sm_90a tile
    (BLOCK_N 64) needs 352,816 B of shared memory here at page >= 64 (tcgen05 reads both operands from
    shared memory, and the pipelined K tile is 73,728 B a stage), so a B200 would prune it; BLOCK_N 32 needs
    213,552 B at 226-228 registers, no spills (BLOCK_N 64 at 1 stage fits, 147,464 B, but spills 176 B).
  fewer than 64 rows (h_q 16): BLOCK_M 16 / 32 as on sm_90a, mma.sync, BLOCK_N min(32, page) (56-76 KB,
    113-184 registers).
  per-token fp8 cache: BLOCK_M 16 (BLOCK_N as on sm_90a): 172 registers, no spills. The sm_90a tile
    (BLOCK_M 32, BLOCK_N 32) spills 8 B at 255 registers here; 32 x 16 compiles at 255 without spills,
    too close to the limit to ship; 64-row tcgen05 tiles spill 96-160 B (the tile passes through registers).
  FlashMLA's fp8 layout: BLOCK_M 16, BLOCK_N 16 as on sm_90a: 232-234 registers, no spills.

Causal rule for s_q > 1 (multi-token prediction): query token i sees keys 0 .. seqlen - s_q + i.

Dots: on a GPU the operands are bf16 (fp32 accumulate; P is rounded to bf16 before P @ V, as FlashMLA
does). In the interpreter (TRITON_INTERPRET=1) they are fp32, since the interpreter's bf16 dot is wrong.
Importing this module on a machine without a CUDA device sets TRITON_INTERPRET=1 if it is unset (that
must happen before triton's first import in the process; see _INTERPRET_TOO_LATE).
"""

from __future__ import annotations

import math
import os
import sys

import torch

from kernels.compiled import launch_target
from kernels.hardware import HOPPER_SMS, triton_interpreting
from kernels.paged_mla.layout import (
    D_QK,
    D_V,
    FLASHMLA_FP8_BYTES,
    FLASHMLA_ROPE_OFFSET,
    FLASHMLA_SCALE_OFFSET,
    is_flashmla_fp8,
    is_fp8,
)
from kernels.paged_mla.split_plan import SplitPlan, balanced_plan, default_num_units, uniform_plan

# No GPU (a CPU worker, a laptop): the kernels can only run in the interpreter. Triton reads the variable
# when a function is decorated, its own tl.* helpers included, so this works only if triton was not
# imported yet; otherwise mla_decode_triton raises a clear error instead of an obscure one.
_INTERPRET_TOO_LATE = (
    not torch.cuda.is_available() and "TRITON_INTERPRET" not in os.environ and "triton" in sys.modules
)
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernels.attention.triton_common import (  # noqa: E402
    LOG2E,
    dot,
    finish,
    merge_splits,
    softmax_init,
    softmax_step,
    split_count,
    store_dtype,
    store_rows,
)

DEFAULT_NUM_SMS = HOPPER_SMS


interpreting = triton_interpreting


WGMMA_ROWS = 64  # a warpgroup MMA's M: 64 rows per warpgroup (sm_90a)


def kv_format_of(kv_cache: torch.Tensor) -> str:
    """ "plain" (bf16/fp16), "fp8" (e4m3 with per-token scales) or "fp8_flashmla" (656 B/token)."""
    if is_flashmla_fp8(kv_cache):
        return "fp8_flashmla"
    return "fp8" if is_fp8(kv_cache.dtype) else "plain"


TILE_TARGETS = ("sm_90a", "sm_100a")  # compile targets with their own default tiles (kernels.compiled)


def _known_target(target: str) -> None:
    if target not in TILE_TARGETS:
        raise ValueError(
            f"unknown target {target!r} for paged MLA default tiles (known: {', '.join(TILE_TARGETS)})"
        )


def default_block_m(rows: int, kv_format: str = "plain", target: str = "sm_90a") -> int:
    """Query rows (s_q x h_q pairs) per program when the caller does not choose (see "Default tiles" in
    the module docstring): 64 for a plain cache with >= 64 rows (wgmma / tcgen05), else 16 / 32
    (mma.sync); 16 for FlashMLA's fp8 layout, and for the per-token fp8 cache on sm_100a."""
    _known_target(target)
    if kv_format == "fp8_flashmla":
        return 16
    if kv_format == "plain" and rows >= WGMMA_ROWS:
        return WGMMA_ROWS
    if kv_format == "fp8" and target == "sm_100a":
        return 16
    return 16 if rows <= 16 else 32


def default_block_n(page_size: int, fp8: bool, kv_format: str | None = None, target: str = "sm_90a") -> int:
    """Cached tokens per step when the caller does not choose, a power of two >= 16 at any page size: for a
    plain cache min(64, page) on sm_90a and min(32, page) on sm_100a, the page rounded up to a power of
    two first; for the per-token fp8 cache 32 at page >= 64 and 16 below; 16 for FlashMLA's fp8 layout
    (see "Default tiles" in the module docstring)."""
    _known_target(target)
    if kv_format == "fp8_flashmla":
        return 16
    if fp8:
        return 32 if page_size >= 64 else 16
    return max(16, min(32 if target == "sm_100a" else 64, triton.next_power_of_2(page_size)))


def default_tiles(rows: int, page_size: int, kv_format: str, target: str) -> tuple[int, int]:
    """(block_m, block_n) by default for a launch on `target`; the split plan and the kernel both take
    them from here, so the plan's blocks are the kernel's."""
    return (
        default_block_m(rows, kv_format, target),
        default_block_n(page_size, kv_format != "plain", kv_format, target),
    )


def default_num_stages(block_m: int, block_n: int, kv_format: str, target: str) -> int:
    """Pipeline stages when the caller does not choose: 2, except 3 for a plain cache's 64 x 64 wgmma
    tile on sm_90a, where default_maxnreg's 240-register cap compiles without spills (at 2 stages that
    cap spills 24 B; see "Default tiles on sm_90a" in the module docstring)."""
    _known_target(target)
    wide = kv_format == "plain" and block_m == WGMMA_ROWS and block_n == 64
    return 3 if target == "sm_90a" and wide else 2


def default_maxnreg(
    block_m: int, block_n: int, kv_format: str, target: str, num_stages: int, num_warps: int = 8
) -> int | None:
    """The register cap per thread (Triton's `maxnreg` launch option, ptxas's .maxnreg) when the caller
    does not choose, None for none (ptxas's own limit, 255). Only where the capped kernel was compiled
    without spills at the shipped spec's shapes: on sm_90a with 8 warps, 240 for a plain cache's 64 x 64
    wgmma tile at 3 stages and 208 for the per-token fp8 cache's 32 x 16 / 32 x 32 tiles at 2 stages (caps
    216 to 240 spill 8 B there at s_q > 1); without the cap both take 254-255 registers."""
    _known_target(target)
    if target != "sm_90a" or num_warps != 8:
        return None
    if kv_format == "plain" and (block_m, block_n, num_stages) == (WGMMA_ROWS, 64, 3):
        return 240
    if kv_format == "fp8" and block_m == 32 and block_n in (16, 32) and num_stages == 2:
        return 208
    return None


def choose_num_splits(
    cache_seqlens: torch.Tensor | list[int],
    *,
    rows: int,
    block_m: int = 16,
    page_size: int = 64,
    num_sms: int = DEFAULT_NUM_SMS,
) -> int:
    """How many splits per sequence, so that batch x splits x row blocks roughly fills the SMs once.

    splits = ceil(num_sms / (batch x row_blocks)), then capped so that a split of the mean-length
    sequence still holds >= MIN_KEYS_PER_SPLIT tokens, by the longest sequence's page count (a split
    never gets less than a page) and by MAX_SPLITS (kernels.attention.triton_common.split_count); at
    least 1. rows = s_q x h_q.
    """
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    if not lens or max(lens) <= 0:
        return 1
    programs = len(lens) * triton.cdiv(rows, block_m)
    return split_count(programs, sum(lens) / len(lens), triton.cdiv(max(lens), page_size), num_sms)


@triton.jit
def _round_bf16(x):
    """fp32 -> the nearest bf16 value (ties to even), kept in fp32: the GPU's bf16 conversion, done on the
    bits because the interpreter's cast truncates. NaN stays NaN, +-inf stays +-inf."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _scaled_v_step(s, visible, m_i, l_i, acc, v, v_scale, F32: tl.constexpr):
    """softmax_step with V's rows scaled by v_scale: l sums p, acc sums (p x v_scale) @ v."""
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_safe)
    p = tl.math.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    pv = dot((p * v_scale[None, :]).to(v.dtype), v, F32)
    return m_new, l_i, alpha[:, None] * acc + pv


@triton.jit
def _split_kernel(
    q_ptr,
    kv_ptr,
    scale_ptr,
    rope_ptr,
    bt_ptr,
    seqlens_ptr,
    chunk_seq_ptr,
    chunk_start_ptr,
    chunk_end_ptr,
    po_ptr,
    pl_ptr,
    sm_scale_log2,
    stride_qb,
    stride_qs,
    stride_qh,
    stride_kvb,
    stride_kvp,
    stride_sb,
    stride_sp,
    stride_rb,
    stride_rp,
    stride_btb,
    stride_poc,
    stride_pom,
    stride_plc,
    H_Q,
    S_Q,
    PAGE: tl.constexpr,
    D_NOPE: tl.constexpr,
    D_ROPE: tl.constexpr,
    BLOCK_DN: tl.constexpr,
    BLOCK_DR: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KV_FORMAT: tl.constexpr,  # 0 plain, 1 fp8 + per-token scale, 2 FlashMLA's fp8 (per-128 scales)
    SCALE_OFF: tl.constexpr,  # where a token's scales start in scale_ptr's elements (format 2)
    ROPE_OFF: tl.constexpr,  # where a token's RoPE part starts in rope_ptr's elements
    F32: tl.constexpr,
    OVERREAD: tl.constexpr,  # test-only: pretend every sequence is this many tokens longer
):
    rows = S_Q * H_Q
    row_blocks = tl.cdiv(rows, BLOCK_M)
    pid = tl.program_id(0)
    mb = pid % row_blocks  # fastest: the row blocks of one chunk run together
    offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < rows
    tok = offs_m // H_Q  # query token index inside the s_q block
    head = offs_m % H_Q
    offs_dn = tl.arange(0, BLOCK_DN)
    offs_dr = tl.arange(0, BLOCK_DR)
    dn_ok = offs_dn < D_NOPE
    dr_ok = offs_dr < D_ROPE

    c = pid // row_blocks  # one chunk of the plan; a unit's chunks are consecutive programs
    b = tl.load(chunk_seq_ptr + c)
    start = tl.load(chunk_start_ptr + c)
    end = tl.load(chunk_end_ptr + c)
    q_rows = q_ptr + b * stride_qb + tok * stride_qs + head * stride_qh
    q_n = tl.load(q_rows[:, None] + offs_dn[None, :], mask=m_ok[:, None] & dn_ok[None, :], other=0.0)
    q_r = tl.load(q_rows[:, None] + D_NOPE + offs_dr[None, :], mask=m_ok[:, None] & dr_ok[None, :], other=0.0)
    if F32:
        q_n = q_n.to(tl.float32)
        q_r = q_r.to(tl.float32)
    else:
        q_n = q_n.to(tl.bfloat16)
        q_r = q_r.to(tl.bfloat16)
    seqlen = tl.load(seqlens_ptr + b) + OVERREAD
    limit = seqlen - S_Q + tok + 1  # keys visible to each row: [0, limit)

    m_i, l_i, acc = softmax_init(BLOCK_M, BLOCK_DN)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < end
        blk = tl.load(bt_ptr + b * stride_btb + offs_n // PAGE, mask=n_ok, other=0).to(tl.int64)
        slot = offs_n % PAGE
        kv_rows = kv_ptr + blk * stride_kvb + slot * stride_kvp
        k_n = tl.load(kv_rows[:, None] + offs_dn[None, :], mask=n_ok[:, None] & dn_ok[None, :], other=0.0)
        rope_rows = rope_ptr + blk * stride_rb + slot * stride_rp + ROPE_OFF
        k_r = tl.load(rope_rows[:, None] + offs_dr[None, :], mask=n_ok[:, None] & dr_ok[None, :], other=0.0)
        if KV_FORMAT == 2:  # NoPE x its 128-channel tile's scale, rounded to bf16 (as FlashMLA)
            sc_rows = scale_ptr + blk * stride_sb + slot * stride_sp + SCALE_OFF
            sc = tl.zeros([BLOCK_N, BLOCK_DN], tl.float32)
            for t in tl.static_range(D_NOPE // 128):  # one [BLOCK_N] load per tile, no [N, 512] gather
                sc_t = tl.load(sc_rows + t, mask=n_ok, other=0.0)
                sc = tl.where((offs_dn // 128 == t)[None, :], sc_t[:, None], sc)
            if F32:
                k_n = _round_bf16(k_n.to(tl.float32) * sc)  # the same bf16 values, held in fp32
            else:
                k_n = (k_n.to(tl.float32) * sc).to(tl.bfloat16)
        else:
            k_n = k_n.to(q_n.dtype)  # bf16 for the tensor cores (exact from fp8), or fp32 (F32)
        k_r = k_r.to(q_r.dtype)
        s = dot(q_n, tl.trans(k_n), F32) + dot(q_r, tl.trans(k_r), F32)
        visible = n_ok[None, :] & (offs_n[None, :] < limit[:, None])
        if KV_FORMAT == 1:  # per-token scale on the scores and on P's columns (V = the NoPE channels)
            sc = tl.load(scale_ptr + blk * stride_sb + slot * stride_sp, mask=n_ok, other=0.0)
            s = s * (sc * sm_scale_log2)[None, :]
            m_i, l_i, acc = _scaled_v_step(s, visible, m_i, l_i, acc, k_n, sc, F32)
        else:
            s = s * sm_scale_log2
            m_i, l_i, acc = softmax_step(s, visible, m_i, l_i, acc, k_n, F32)

    out, lse = finish(m_i, l_i, acc)
    store_rows(po_ptr + c * stride_poc + offs_m * stride_pom, out, m_ok, D_NOPE, BLOCK_DN)
    tl.store(pl_ptr + c * stride_plc + offs_m, lse, mask=m_ok)


@triton.jit
def _combine_kernel(
    po_ptr,
    pl_ptr,
    seq_chunks_ptr,
    out_ptr,
    lse_ptr,
    stride_poc,
    stride_pom,
    stride_plc,
    stride_ob,
    stride_os,
    stride_oh,
    stride_lb,
    stride_lh,
    H_Q,
    D_NOPE: tl.constexpr,
    BLOCK_DN: tl.constexpr,
):
    """Sequence b's partials are the chunks seq_chunks[b] .. seq_chunks[b + 1] - 1 of the plan."""
    b = tl.program_id(0)
    r = tl.program_id(1)
    tok = r // H_Q
    head = r % H_Q
    c_lo = tl.load(seq_chunks_ptr + b)
    c_hi = tl.load(seq_chunks_ptr + b + 1)
    top = tl.full([], float("-inf"), tl.float32)
    for c in range(c_lo, c_hi):
        top = tl.maximum(top, tl.load(pl_ptr + c * stride_plc + r))
    shift = tl.where(top == float("-inf"), 0.0, top)  # lse_shift of the sequence's partials
    offs_d = tl.arange(0, BLOCK_DN)
    d_ok = offs_d < D_NOPE
    acc = tl.zeros([BLOCK_DN], tl.float32)
    total = tl.full([], 0.0, tl.float32)
    for c in range(c_lo, c_hi):
        w = tl.exp(tl.load(pl_ptr + c * stride_plc + r) - shift)  # 0 for an empty chunk
        o = tl.load(po_ptr + c * stride_poc + r * stride_pom + offs_d, mask=d_ok, other=0.0)
        acc += w * o
        total += w
    out, lse = merge_splits(acc, total, shift)
    lse = tl.where(total > 0.0, lse, float("inf"))  # a row no chunk saw: +inf, as FlashMLA
    o_ptr = out_ptr + b * stride_ob + tok * stride_os + head * stride_oh + offs_d
    tl.store(o_ptr, out.to(out_ptr.dtype.element_ty), mask=d_ok)
    tl.store(lse_ptr + b * stride_lb + head * stride_lh + tok, lse)


def plan_for(
    cache_seqlens: torch.Tensor | list[int],
    num_splits: int | str | None,
    *,
    rows: int,
    block_m: int,
    block_n: int,
    page_size: int,
    num_sms: int = DEFAULT_NUM_SMS,
) -> SplitPlan:
    """The split plan of a batch (reads the lengths on the host: build it outside the timed call).
    num_splits an int: the uniform plan with that many splits per sequence; "auto" or None: the balanced
    plan over SMs // row blocks units of block_n-token blocks."""
    if num_splits is None or num_splits == "auto":
        units = default_num_units(num_sms, triton.cdiv(rows, block_m))
        return balanced_plan(cache_seqlens, num_units=units, block=block_n)
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits must be a positive integer or 'auto', got {num_splits!r}")
    return uniform_plan(cache_seqlens, num_splits=num_splits, page_size=page_size)


def mla_decode_triton(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    num_splits: int | str | None = None,
    plan: SplitPlan | None = None,
    softmax_scale: float | None = None,
    kv_scales: torch.Tensor | None = None,
    d_v: int = D_V,
    num_sms: int = DEFAULT_NUM_SMS,
    block_m: int | None = None,
    block_n: int | None = None,
    target: str | None = None,
    num_warps: int = 8,
    num_stages: int | None = None,
    maxnreg: int | None = None,
    out_dtype: torch.dtype | None = None,
    _overread: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode. q [b, s_q, h_q, d], block_table [b, max_blocks] int32, cache_seqlens [b] int32;
    kv_cache [blocks, page, 1, d] bf16/fp16, or fp8 e4m3 with kv_scales [blocks, page] fp32 per token, or
    FlashMLA's fp8 layout [blocks, page, 1, 656] (kernels.paged_mla.layout; d = 576, no kv_scales).
    Returns out [b, s_q, h_q, d_v] (q's dtype unless out_dtype) and lse [b, h_q, s_q] fp32.

    block_m / block_n None take the defaults of `target` (sm_90a, sm_100a; None: the target being
    compiled for inside kernels.compiled.capturing, else this host's); num_stages None and maxnreg None
    those of the tiles on that target (default_num_stages, default_maxnreg); maxnreg 0: no register cap.
    The work split is `plan` (kernels.paged_mla.split_plan, built beforehand so the timed call reads
    nothing on the host), else built here from cache_seqlens with `num_splits` (see plan_for).
    `_overread` is for tests only: it makes the kernel read that many slots past every sequence's end.
    """
    if _INTERPRET_TOO_LATE:
        raise RuntimeError(
            "no CUDA device and triton was imported before TRITON_INTERPRET=1 was set: set it in the "
            "environment (or before the first `import triton`) to run the Triton kernels in the interpreter"
        )
    b, s_q, h_q, d = q.shape
    flashmla = is_flashmla_fp8(kv_cache)
    width = FLASHMLA_FP8_BYTES if flashmla else d
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != width:
        raise ValueError(f"kv_cache must be [blocks, page, 1, {width}], got {tuple(kv_cache.shape)}")
    if flashmla and (d, d_v) != (D_QK, D_V):
        raise ValueError(f"FlashMLA's fp8 layout holds d_qk {D_QK} / d_v {D_V}, got q dim {d} and d_v {d_v}")
    if not 0 < d_v <= d:
        raise ValueError(f"d_v must be in (0, {d}], got {d_v}")
    if block_table.shape[0] != b or cache_seqlens.shape != (b,):
        raise ValueError("block_table and cache_seqlens must have the batch size of q")
    fp8 = is_fp8(kv_cache.dtype) and not flashmla
    page = kv_cache.shape[1]
    if fp8 and (kv_scales is None or kv_scales.shape != kv_cache.shape[:2]):
        raise ValueError(f"an fp8 cache needs kv_scales of shape {tuple(kv_cache.shape[:2])}")
    if fp8 and kv_scales is not None and kv_scales.stride(1) != 1:
        raise ValueError("kv_scales must be contiguous over the slots of a page")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("q and kv_cache must be contiguous in the head dimension")
    rows = s_q * h_q
    kv_format = kv_format_of(kv_cache)
    bm, bn = block_m, block_n
    tgt = target or launch_target()
    if bm is None or bn is None:
        dm, dn = default_tiles(rows, page, kv_format, tgt)
        bm, bn = bm or dm, bn or dn
    if min(bm, bn) < 16 or bm & (bm - 1) or bn & (bn - 1):
        raise ValueError(f"block_m and block_n must be powers of two >= 16 (tl.dot), got {bm} and {bn}")
    if num_stages is None:
        num_stages = default_num_stages(bm, bn, kv_format, tgt)
    if maxnreg is None:
        maxnreg = default_maxnreg(bm, bn, kv_format, tgt, num_stages, num_warps)
    caps = {"maxnreg": maxnreg} if maxnreg else {}  # Triton's NVIDIA backend; the interpreter drops it
    built_here = plan is None  # then copied to q's device below (a caller that times passes one there)
    if plan is None and cache_seqlens.is_meta:  # compile evidence only: every block table full
        plan = plan_for(
            [block_table.shape[1] * page] * b, num_splits, rows=rows, block_m=bm, block_n=bn,
            page_size=page, num_sms=num_sms,
        )  # fmt: skip
    if plan is None:
        lens = cache_seqlens.tolist()
        if lens and max(lens) > block_table.shape[1] * page:
            raise ValueError(
                f"a seqlen of {max(lens)} needs more than the block table's {block_table.shape[1]} pages"
            )
        lens = [n + _overread for n in lens]
        plan = plan_for(lens, num_splits, rows=rows, block_m=bm, block_n=bn, page_size=page, num_sms=num_sms)
    if built_here:
        plan = plan.to(q.device)
    if plan.batch != b:
        raise ValueError(f"the split plan is for a batch of {plan.batch}, q has {b}")
    dev = q.device
    if plan.chunk_seq.device != dev:  # copied in every call, it would stall each timed sample
        raise ValueError(
            f"the split plan is on {plan.chunk_seq.device}, q on {dev}: move it there once, before the calls "
            "(plan.to(device))"
        )
    programs = plan.num_chunks * triton.cdiv(rows, bm)
    if programs > 2**31 - 1:
        raise ValueError(f"{plan.num_chunks} chunks x row blocks is {programs} programs (> 2^31 - 1)")
    scale = 1.0 / math.sqrt(d) if softmax_scale is None else softmax_scale
    block_table = block_table.to(torch.int32)
    cache_seqlens = cache_seqlens.to(torch.int32)
    chunks = max(plan.num_chunks, 1)
    part_out = torch.empty(chunks, rows, d_v, dtype=torch.float32, device=dev)
    part_lse = torch.empty(chunks, rows, dtype=torch.float32, device=dev)
    d_rope = d - d_v
    if flashmla:  # the same bytes seen as fp32 (scales) and bf16 (RoPE); strides in those elements
        kv = kv_cache.view(torch.float8_e4m3fn)
        scales, rope = kv_cache.view(torch.float32), kv_cache.view(torch.bfloat16)
        fmt, scale_off, rope_off = 2, FLASHMLA_SCALE_OFFSET // 4, FLASHMLA_ROPE_OFFSET // 2
    else:
        kv, rope, rope_off = kv_cache, kv_cache, d_v
        scales = kv_scales if fp8 else part_lse  # any pointer; never read unless fp8
        fmt, scale_off = (1 if fp8 else 0), 0
    assert scales is not None
    if programs:
        _split_kernel[(programs,)](
            q, kv, scales, rope, block_table, cache_seqlens,
            plan.chunk_seq, plan.chunk_start, plan.chunk_end,
            part_out, part_lse,
            scale * LOG2E,
            q.stride(0), q.stride(1), q.stride(2),
            kv.stride(0), kv.stride(1),
            scales.stride(0), scales.stride(1) if scales.dim() > 1 else 0,
            rope.stride(0), rope.stride(1),
            block_table.stride(0),
            part_out.stride(0), part_out.stride(1),
            part_lse.stride(0),
            h_q, s_q,
            PAGE=page, D_NOPE=d_v, D_ROPE=d_rope,
            BLOCK_DN=triton.next_power_of_2(d_v), BLOCK_DR=max(16, triton.next_power_of_2(max(d_rope, 1))),
            BLOCK_M=bm, BLOCK_N=bn, KV_FORMAT=fmt, SCALE_OFF=scale_off, ROPE_OFF=rope_off,
            F32=interpreting(), OVERREAD=_overread,
            num_warps=num_warps, num_stages=num_stages, **caps,
        )  # fmt: skip
    want = out_dtype or q.dtype
    # The interpreter's fp32 -> bf16/fp16 cast truncates instead of rounding to nearest: there the kernel
    # stores fp32 and torch rounds. On a GPU the kernel stores `want` directly (round to nearest even).
    out = torch.empty(b, s_q, h_q, d_v, dtype=store_dtype(want), device=dev)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=dev)
    _combine_kernel[(b, rows)](
        part_out, part_lse, plan.seq_chunks, out, lse,
        part_out.stride(0), part_out.stride(1),
        part_lse.stride(0),
        out.stride(0), out.stride(1), out.stride(2),
        lse.stride(0), lse.stride(1),
        h_q,
        D_NOPE=d_v, BLOCK_DN=triton.next_power_of_2(d_v),
        num_warps=4,
    )  # fmt: skip
    return out.to(want), lse
