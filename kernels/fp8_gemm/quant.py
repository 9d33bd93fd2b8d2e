"""FP8 e4m3 quantizers with fine-grained scales, as DeepGEMM's inputs are laid out.

Activations (A, [M, K]): one fp32 scale per row per 128 columns ("1x128", per token), shape
[M, ceil(K/128)]. Weights (B, [N, K]): one fp32 scale per 128x128 block, shape [ceil(N/128),
ceil(K/128)]. Each group is scaled so its largest magnitude (amax, floored at AMAX_FLOOR so an all-zero
group stays finite) maps to the e4m3 maximum 448: q = fp8(x / s), s = amax / 448, x ~ q * s.
A K (or N) that is not a multiple of 128 gets a last, narrower group: the scale covers only real columns.
"""

from __future__ import annotations

import torch

GROUP = 128  # scale granularity along K (both operands) and along N (weights)
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
AMAX_FLOOR = 1e-4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    r, c = x.shape
    if (r, c) == (rows, cols):
        return x
    return torch.nn.functional.pad(x, (0, cols - c, 0, rows - r))


def quantize_per_token(x: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], fp32 scales [M, ceil(K/group)])."""
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D activation [M, K], got shape {tuple(x.shape)}")
    m, k = x.shape
    kg = cdiv(k, group)
    xp = _pad_to(x.float(), m, kg * group).view(m, kg, group)
    amax = xp.abs().amax(dim=2).clamp(min=AMAX_FLOOR)  # [M, kg]
    scales = amax / FP8_MAX
    q = (xp / scales.unsqueeze(2)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(m, kg * group)[:, :k].contiguous(), scales.contiguous()


def quantize_per_block(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (fp8 [N, K], fp32 scales [ceil(N/group), ceil(K/group)])."""
    if w.dim() != 2:
        raise ValueError(f"expected a 2-D weight [N, K], got shape {tuple(w.shape)}")
    n, k = w.shape
    ng, kg = cdiv(n, group), cdiv(k, group)
    wp = _pad_to(w.float(), ng * group, kg * group).view(ng, group, kg, group)
    amax = wp.abs().amax(dim=(1, 3)).clamp(min=AMAX_FLOOR)  # [ng, kg]
    scales = amax / FP8_MAX
    q = (wp / scales[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.view(ng * group, kg * group)[:n, :k].contiguous(), scales.contiguous()


def dequantize_per_token(q: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """fp8 [M, K] with scales [M, ceil(K/group)] -> fp32 [M, K]."""
    k = q.shape[1]
    return q.float() * scales.repeat_interleave(group, dim=1)[:, :k]


def dequantize_per_block(q: torch.Tensor, scales: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """fp8 [N, K] with scales [ceil(N/group), ceil(K/group)] -> fp32 [N, K]."""
    n, k = q.shape
    full = scales.repeat_interleave(group, dim=0).repeat_interleave(group, dim=1)
    return q.float() * full[:n, :k]
