"""Seeded inputs of one FP8 GEMM: bf16 originals (for the bf16 reference) and their quantized forms."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kernels.fp8_gemm.quant import GROUP, check_scale_group, quantize_per_block, quantize_per_token


@dataclass
class GemmInputs:
    a: torch.Tensor  # bf16 [M, K]
    b: torch.Tensor  # bf16 [N, K]
    a_fp8: torch.Tensor
    a_scales: torch.Tensor  # fp32 [M, ceil(K/g)]
    b_fp8: torch.Tensor
    b_scales: torch.Tensor  # fp32 [ceil(N/g), ceil(K/g)]
    scale_group: int = GROUP  # g, the scales' granularity


def build_inputs(
    m: int, n: int, k: int, seed: int, device: str | torch.device = "cpu", *, scale_group: int = GROUP
) -> GemmInputs:
    """Standard-normal A and B (drawn on the CPU, so a seed gives the same data on any device and scale
    group), rounded to bf16, then quantized on `device` with 1 x g and g x g scales, g = scale_group."""
    check_scale_group(scale_group)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)
    b = torch.randn(n, k, generator=gen).to(torch.bfloat16).to(device)
    a_fp8, a_scales = quantize_per_token(a, scale_group)
    b_fp8, b_scales = quantize_per_block(b, scale_group)
    return GemmInputs(a, b, a_fp8, a_scales, b_fp8, b_scales, scale_group)
