"""The Triton FP8 GEMM with fine-grained scales: D[M,N] (bf16) = A[M,K] (fp8) x B[N,K]^T (fp8).

One program computes a block_m x block_n tile of D. Programs are ordered in bands of group_m tile rows
(all column tiles of a band before the next band), so tiles running together share A rows and B columns
in L2. Each K step loads an A tile [block_m, block_k] and a B tile [block_k, block_n] (B is stored
[N, K], K-major, which is what the fp8 tensor-core path wants), multiplies them into a fresh fp32 partial
sum, multiplies that by the step's scales (A's per-row scale of the K group, B's per-column scale of its
group x group block: block_n may span several weight blocks) and adds it into the fp32 accumulator.
That is DeepGEMM's promotion: no more than one K group is ever summed in the tensor core's
reduced-precision accumulator. The scale group (scale_group, kernels.fp8_gemm.quant.SCALE_GROUPS: 128,
the default, or 64) is a constexpr; block_k must divide it so a step has one scale, and the operand
checks judge the scales' shapes by it.
Every load and the store are masked: M, N and K need not be multiples of the block.

Dots: on a GPU the operands stay fp8 e4m3 (tl.dot fp8 x fp8 -> fp32, wgmma on SM90). In the interpreter
(TRITON_INTERPRET=1) they are upcast to fp32 first, as the interpreter's low-precision dots are not to be
trusted; that path is the only one the CPU tests exercise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl

from kernels.fp8_gemm.quant import FP8, GROUP, cdiv, check_scale_group
from kernels.fp8_gemm.tiles import TileConfig
from kernels.hardware import triton_interpreting

KERNEL_NAME = "_fp8_gemm_kernel"


interpreting = triton_interpreting


@triton.jit
def _fp8_gemm_kernel(
    a_ptr,
    b_ptr,
    d_ptr,
    as_ptr,
    bs_ptr,
    M,
    N,
    K,
    K_GROUPS,
    stride_am,
    stride_ak,
    stride_bn,
    stride_bk,
    stride_dm,
    stride_dn,
    stride_asm,
    stride_ask,
    stride_bsn,
    stride_bsk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    SCALE_GROUP: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    band_size = GROUP_M * tiles_n  # programs per band of GROUP_M tile rows
    band = pid // band_size
    band_first_row = band * GROUP_M
    band_rows = tl.minimum(tiles_m - band_first_row, GROUP_M)
    in_band = pid % band_size
    tile_m = band_first_row + in_band % band_rows
    tile_n = in_band // band_rows

    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    row_ok = rows < M
    col_ok = cols < N
    rows_l = rows.to(tl.int64)
    cols_l = cols.to(tl.int64)

    a_tile = a_ptr + rows_l[:, None] * stride_am + ks[None, :] * stride_ak
    b_tile = b_ptr + ks[:, None] * stride_bk + cols_l[None, :] * stride_bn
    a_scale_row = as_ptr + rows_l * stride_asm
    b_scale_col = bs_ptr + (cols_l // SCALE_GROUP) * stride_bsn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        k0 = step * BLOCK_K
        k_ok = ks < K - k0
        a = tl.load(a_tile, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_tile, mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        group = k0 // SCALE_GROUP
        g_ok = group < K_GROUPS
        sa = tl.load(a_scale_row + group * stride_ask, mask=row_ok & g_ok, other=0.0)
        sb = tl.load(b_scale_col + group * stride_bsk, mask=col_ok & g_ok, other=0.0)
        if UPCAST:
            partial = tl.dot(a.to(tl.float32), b.to(tl.float32))
        else:
            partial = tl.dot(a, b, out_dtype=tl.float32)
        acc += partial * sa[:, None] * sb[None, :]
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    d = d_ptr + rows_l[:, None] * stride_dm + cols_l[None, :] * stride_dn
    tl.store(d, acc.to(tl.bfloat16), mask=row_ok[:, None] & col_ok[None, :])


def check_operands(
    a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor, group: int = GROUP
) -> tuple[int, int, int]:
    """(M, N, K) of valid operands with scales of 1 x group and group x group; ValueError naming the
    operand otherwise."""
    if a.dtype != FP8 or b.dtype != FP8:
        raise ValueError(f"A and B must be {FP8} (got {a.dtype}, {b.dtype})")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need A [M, K] and B [N, K] (got {tuple(a.shape)}, {tuple(b.shape)})")
    m, k = a.shape
    n = b.shape[0]
    if tuple(a_scales.shape) != (m, cdiv(k, group)):
        raise ValueError(f"a_scales must be [M, ceil(K/{group})] = {(m, cdiv(k, group))}")
    if tuple(b_scales.shape) != (cdiv(n, group), cdiv(k, group)):
        raise ValueError(
            f"b_scales must be [ceil(N/{group}), ceil(K/{group})] = {(cdiv(n, group), cdiv(k, group))}"
        )
    if a_scales.dtype != torch.float32 or b_scales.dtype != torch.float32:
        raise ValueError("scales must be float32")
    return m, n, k


def prepare(
    a: torch.Tensor,
    a_scales: torch.Tensor,
    b: torch.Tensor,
    b_scales: torch.Tensor,
    cfg: TileConfig,
    *,
    out: torch.Tensor | None = None,
    scale_group: int = GROUP,
) -> tuple[torch.Tensor, Callable[[], Any]]:
    """D = A x B^T with A's 1 x g and B's g x g scales, g = scale_group (64 or 128: the granularity the
    operands were quantized with; the scales' shapes are checked against it), D bf16 [M, N] (`out` when
    given). Checks the operands once and returns (D, launch): launch() runs the kernel into D and returns
    the compiled kernel (None in the interpreter). The timed region is then the launch alone."""
    check_scale_group(scale_group)
    m, n, k = check_operands(a, a_scales, b, b_scales, scale_group)
    if scale_group % cfg.block_k:
        raise ValueError(
            f"block_k {cfg.block_k} must divide the scale group {scale_group} so one K step has one scale"
        )
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    elif tuple(out.shape) != (m, n) or out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bf16 [{m}, {n}] (got {out.dtype} {tuple(out.shape)})")
    kernel = _fp8_gemm_kernel[(cdiv(m, cfg.block_m) * cdiv(n, cfg.block_n),)]
    args = (
        a, b, out, a_scales, b_scales,
        m, n, k, a_scales.shape[1],
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        a_scales.stride(0), a_scales.stride(1), b_scales.stride(0), b_scales.stride(1),
    )  # fmt: skip
    meta = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        SCALE_GROUP=scale_group, UPCAST=interpreting(),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out, lambda: kernel(*args, **meta)


def meta_launch(m: int, n: int, k: int, cfg: TileConfig, scale_group: int = GROUP) -> Callable[[], Any]:
    """The launch of `prepare` on meta tensors of the real shapes and layouts (no storage): what
    kernels.compiled captures to compile this config exactly as the JIT would for the trial."""
    meta = torch.device("meta")
    g = scale_group
    a = torch.empty((m, k), dtype=FP8, device=meta)
    b = torch.empty((n, k), dtype=FP8, device=meta)
    a_scales = torch.empty((m, cdiv(k, g)), dtype=torch.float32, device=meta)
    b_scales = torch.empty((cdiv(n, g), cdiv(k, g)), dtype=torch.float32, device=meta)
    return prepare(a, a_scales, b, b_scales, cfg, scale_group=g)[1]


def fp8_gemm(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """`prepare`, launched at once: (D bf16 [M, N], the compiled kernel (None in the interpreter))."""
    out, launch = prepare(*args, **kwargs)
    return out, launch()
