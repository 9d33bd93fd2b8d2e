"""The two references of the FP8 GEMM (both run anywhere, CPU included).

gemm_dequant_fp32  dequantize A and B with their scales (of the scale group the operands were quantized
                   with), multiply in fp32: what an exact FP8 kernel computes, before the bf16 rounding
                   of its output
gemm_bf16          the unquantized bf16 matmul A @ B^T: calc_diff is judged against this one
"""

from __future__ import annotations

import torch

from kernels.fp8_gemm.quant import GROUP, dequantize_per_block, dequantize_per_token


def gemm_dequant_fp32(
    a_fp8: torch.Tensor,
    a_scales: torch.Tensor,
    b_fp8: torch.Tensor,
    b_scales: torch.Tensor,
    *,
    group: int = GROUP,
) -> torch.Tensor:
    """fp32 [M, N] = dequant(A) @ dequant(B)^T, A's scales 1 x group, B's group x group."""
    return dequantize_per_token(a_fp8, a_scales, group) @ dequantize_per_block(b_fp8, b_scales, group).T


def gemm_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """bf16 [M, N] = A @ B^T with A [M, K], B [N, K] in bf16 (fp32 accumulation inside matmul)."""
    return a.to(torch.bfloat16) @ b.to(torch.bfloat16).T
