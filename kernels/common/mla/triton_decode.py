"""The host side of the split-KV paged MLA decode: mla_decode_triton checks its inputs, picks the tiles
and the split plan and launches the split and combine kernels of kernels.common.mla.decode_kernels (their
docstring has the algorithm and the default tiles per compile target).

Causal rule for s_q > 1 (multi-token prediction): query token i sees keys 0 .. seqlen - s_q + i.
Importing it on a machine without a CUDA device sets TRITON_INTERPRET=1 if it is unset (decode_kernels,
imported before triton).
"""

from __future__ import annotations

from typing import Any

import torch

# isort: off
from kernels.common.mla.decode_kernels import (  # first: it sets TRITON_INTERPRET before triton's import
    _INTERPRET_TOO_LATE,
    _combine_kernel,
    _split_kernel,
    default_maxnreg,
    default_num_stages,
    default_tiles,
    kv_format_of,
)
import triton

# isort: on
from kernels.common.lse import scale_of
from kernels.common.mla.layout import (
    D_QK,
    D_V,
    FLASHMLA_FP8_BYTES,
    FLASHMLA_ROPE_OFFSET,
    FLASHMLA_SCALE_OFFSET,
    is_flashmla_fp8,
    is_fp8,
)
from kernels.common.mla.split_plan import SplitPlan, balanced_plan, default_num_units, uniform_plan
from kernels.common.triton_attention import LOG2E, split_count, store_dtype
from kernels.compiled import launch_target
from kernels.hardware import HOPPER_SMS, triton_interpreting

DEFAULT_NUM_SMS = HOPPER_SMS


interpreting = triton_interpreting


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
    never gets less than a page) and by MAX_SPLITS (kernels.common.triton_attention.split_count); at
    least 1. rows = s_q x h_q.
    """
    lens = cache_seqlens.tolist() if isinstance(cache_seqlens, torch.Tensor) else list(cache_seqlens)
    if not lens or max(lens) <= 0:
        return 1
    programs = len(lens) * triton.cdiv(rows, block_m)
    return split_count(programs, sum(lens) / len(lens), triton.cdiv(max(lens), page_size), num_sms)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Paged MLA decode. q [b, s_q, h_q, d], block_table [b, max_blocks] int32, cache_seqlens [b] int32;
    kv_cache [blocks, page, 1, d] bf16/fp16, or fp8 e4m3 with kv_scales [blocks, page] fp32 per token, or
    FlashMLA's fp8 layout [blocks, page, 1, 656] (kernels.common.mla.layout; d = 576, no kv_scales).
    Returns out [b, s_q, h_q, d_v] (q's dtype unless out_dtype) and lse [b, h_q, s_q] fp32.

    block_m / block_n None take the defaults of `target` (sm_90a, sm_100a; None: the target being
    compiled for inside kernels.compiled.capturing, else this host's); num_stages None and maxnreg None
    those of the tiles on that target (default_num_stages, default_maxnreg); maxnreg 0: no register cap.
    The work split is `plan` (kernels.common.mla.split_plan, built beforehand so the timed call reads
    nothing on the host), else built here from cache_seqlens with `num_splits` (see plan_for).
    """
    if _INTERPRET_TOO_LATE:
        raise RuntimeError(
            "no CUDA device and triton was imported before TRITON_INTERPRET=1 was set: set it in the "
            "environment (or before the first `import triton`) to run the Triton kernels in the interpreter"
        )
    b, s_q, h_q, d = q.shape
    _check_inputs(q, kv_cache, block_table, cache_seqlens, kv_scales, d_v)
    rows, page = s_q * h_q, kv_cache.shape[1]
    tiles = (kv_format_of(kv_cache), block_m, block_n, target or launch_target())
    launch = _launch_options(rows, page, *tiles, num_warps, num_stages, maxnreg)
    bm, bn = launch["BLOCK_M"], launch["BLOCK_N"]
    plan = _decode_plan(plan, cache_seqlens, block_table, num_splits, rows, bm, bn, page, num_sms, q.device)
    programs = plan.num_chunks * triton.cdiv(rows, bm)
    if programs > 2**31 - 1:
        raise ValueError(f"{plan.num_chunks} chunks x row blocks is {programs} programs (> 2^31 - 1)")
    scale = scale_of(d, softmax_scale)
    chunks = max(plan.num_chunks, 1)
    part_out = torch.empty(chunks, rows, d_v, dtype=torch.float32, device=q.device)
    part_lse = torch.empty(chunks, rows, dtype=torch.float32, device=q.device)
    if programs:
        kv, scales, rope, formats = _kv_views(kv_cache, kv_scales, d_v, fallback=part_lse)
        block_table = block_table.to(torch.int32)
        _split_kernel[(programs,)](
            q, kv, scales, rope, block_table, cache_seqlens.to(torch.int32),
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
            PAGE=page, D_NOPE=d_v, D_ROPE=d - d_v,
            BLOCK_DN=triton.next_power_of_2(d_v), BLOCK_DR=max(16, triton.next_power_of_2(max(d - d_v, 1))),
            F32=interpreting(), **formats, **launch,
        )  # fmt: skip
    return _combine(part_out, part_lse, plan, (b, s_q, h_q, d_v), out_dtype or q.dtype)


def _check_inputs(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    kv_scales: torch.Tensor | None,
    d_v: int,
) -> None:
    """Refuse, naming the argument, inputs the kernels cannot read."""
    b, _, _, d = q.shape
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
    if fp8 and (kv_scales is None or kv_scales.shape != kv_cache.shape[:2]):
        raise ValueError(f"an fp8 cache needs kv_scales of shape {tuple(kv_cache.shape[:2])}")
    if fp8 and kv_scales is not None and kv_scales.stride(1) != 1:
        raise ValueError("kv_scales must be contiguous over the slots of a page")
    if q.stride(-1) != 1 or kv_cache.stride(-1) != 1:
        raise ValueError("q and kv_cache must be contiguous in the head dimension")


def _launch_options(
    rows: int,
    page: int,
    kv_format: str,
    block_m: int | None,
    block_n: int | None,
    target: str,
    num_warps: int,
    num_stages: int | None,
    maxnreg: int | None,
) -> dict[str, Any]:
    """The split kernel's tiles and launch options: the caller's, else the target's defaults."""
    bm, bn = block_m, block_n
    if bm is None or bn is None:
        dm, dn = default_tiles(rows, page, kv_format, target)
        bm, bn = bm or dm, bn or dn
    if min(bm, bn) < 16 or bm & (bm - 1) or bn & (bn - 1):
        raise ValueError(f"block_m and block_n must be powers of two >= 16 (tl.dot), got {bm} and {bn}")
    if num_stages is None:
        num_stages = default_num_stages(bm, bn, kv_format, target)
    if maxnreg is None:
        maxnreg = default_maxnreg(bm, bn, kv_format, target, num_stages, num_warps)
    caps = {"maxnreg": maxnreg} if maxnreg else {}  # Triton's NVIDIA backend; the interpreter drops it
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": num_warps, "num_stages": num_stages, **caps}


def _decode_plan(
    plan: SplitPlan | None,
    cache_seqlens: torch.Tensor,
    block_table: torch.Tensor,
    num_splits: int | str | None,
    rows: int,
    bm: int,
    bn: int,
    page: int,
    num_sms: int,
    device: torch.device,
) -> SplitPlan:
    """The caller's plan (already on q's device), or one built here from the lengths and copied there."""
    b = block_table.shape[0]
    if plan is None:
        if cache_seqlens.is_meta:  # compile evidence only: every block table full
            lens = [block_table.shape[1] * page] * b
        else:
            lens = cache_seqlens.tolist()
            if lens and max(lens) > block_table.shape[1] * page:
                raise ValueError(
                    f"a seqlen of {max(lens)} needs more than the block table's {block_table.shape[1]} pages"
                )
        plan = plan_for(lens, num_splits, rows=rows, block_m=bm, block_n=bn, page_size=page, num_sms=num_sms)
        plan = plan.to(device)
    if plan.batch != b:
        raise ValueError(f"the split plan is for a batch of {plan.batch}, q has {b}")
    if plan.chunk_seq.device != device:  # copied in every call, it would stall each timed sample
        raise ValueError(
            f"the split plan is on {plan.chunk_seq.device}, q on {device}: move it there once, before the "
            "calls (plan.to(device))"
        )
    return plan


def _kv_views(
    kv_cache: torch.Tensor, kv_scales: torch.Tensor | None, d_v: int, fallback: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, int]]:
    """The cache as the split kernel reads it: (NoPE, scales, RoPE) views and the format's constants.
    FlashMLA's layout is the same bytes seen as fp8, fp32 (scales) and bf16 (RoPE), its offsets in those
    elements; a cache without scales passes `fallback`, a pointer the kernel never reads."""
    if is_flashmla_fp8(kv_cache):
        kv = kv_cache.view(torch.float8_e4m3fn)
        scales, rope = kv_cache.view(torch.float32), kv_cache.view(torch.bfloat16)
        formats = {
            "KV_FORMAT": 2,
            "SCALE_OFF": FLASHMLA_SCALE_OFFSET // 4,
            "ROPE_OFF": FLASHMLA_ROPE_OFFSET // 2,
        }
        return kv, scales, rope, formats
    fp8 = is_fp8(kv_cache.dtype)
    scales = kv_scales if fp8 and kv_scales is not None else fallback
    return kv_cache, scales, kv_cache, {"KV_FORMAT": 1 if fp8 else 0, "SCALE_OFF": 0, "ROPE_OFF": d_v}


def _combine(
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    plan: SplitPlan,
    out_shape: tuple[int, int, int, int],
    want: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge each sequence's partials into out [b, s_q, h_q, d_v] (`want`) and lse [b, h_q, s_q] fp32.
    The interpreter's fp32 -> bf16/fp16 cast truncates instead of rounding to nearest: there the kernel
    stores fp32 and torch rounds. On a GPU the kernel stores `want` directly (round to nearest even)."""
    b, s_q, h_q, d_v = out_shape
    dev = part_out.device
    out = torch.empty(b, s_q, h_q, d_v, dtype=store_dtype(want), device=dev)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=dev)
    _combine_kernel[(b, s_q * h_q)](
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
