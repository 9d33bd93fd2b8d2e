"""The Triton kernels of the split-KV MLA decode over a paged KV cache (split and combine), and their
default tiles per compile target.

Stage 1, `_split_kernel`, a 1-D grid of chunks x row blocks with the row block fastest: program id =
chunk * row_blocks + row_block. The chunks come from a split plan (kernels.common.mla.split_plan, built on
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
power-of-two scales FlashMLA's quantiser writes, kernels.common.mla.layout; the interpreter rounds by bits,
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
    take 208-252 registers uncapped (252 at 64 x 32, s_q 2, since the tile's store went to a shared jit
    helper), 211-228 under the same 240 cap at 2 stages with no spills and the same SASS, so they run
    capped too.
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
The host side, mla_decode_triton, is kernels.common.mla.triton_decode. Importing this module on a machine
without a CUDA device sets TRITON_INTERPRET=1 if it is unset (that must happen before triton's first import
in the process; see _INTERPRET_TOO_LATE).
"""

from __future__ import annotations

import os
import sys

import torch

from kernels.common.mla.layout import is_flashmla_fp8, is_fp8

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

from kernels.common.triton_attention import (  # noqa: E402
    dot,
    merge_splits,
    online_weights,
    softmax_init,
    softmax_step,
    store_result,
)

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
    wgmma tile at 3 stages and its 64 x 16 / 64 x 32 tiles at 2 stages, and 208 for the per-token fp8
    cache's 32 x 16 / 32 x 32 tiles at 2 stages (caps 216 to 240 spill 8 B there at s_q > 1); without
    the cap they take up to 252-255 registers."""
    _known_target(target)
    if target != "sm_90a" or num_warps != 8:
        return None
    wide_plain = kv_format == "plain" and block_m == WGMMA_ROWS
    if wide_plain and (block_n, num_stages) in ((64, 3), (32, 2), (16, 2)):
        return 240
    if kv_format == "fp8" and block_m == 32 and block_n in (16, 32) and num_stages == 2:
        return 208
    return None


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
    m_new, l_i, alpha, p = online_weights(s, visible, m_i, l_i)
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
    seqlen = tl.load(seqlens_ptr + b)
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

    po_rows = po_ptr + c * stride_poc + offs_m * stride_pom
    store_result(po_rows, pl_ptr + c * stride_plc + offs_m, m_i, l_i, acc, m_ok, D_NOPE, BLOCK_DN, False)


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
