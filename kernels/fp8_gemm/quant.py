"""FP8 e4m3 quantizers with fine-grained scales, as DeepGEMM's inputs are laid out.

The scale group g (SCALE_GROUPS: 128, DeepGEMM's SM90 granularity and the default, or 64) is the scales'
granularity along K, and along N for the weights. Activations (A, [M, K]): one fp32 scale per row per g
columns ("1 x g", per token), shape [M, ceil(K/g)]. Weights (B, [N, K]): one fp32 scale per g x g block,
shape [ceil(N/g), ceil(K/g)]. Each group is scaled so its largest magnitude (amax, floored at AMAX_FLOOR
so an all-zero group stays finite) maps to the e4m3 maximum 448: s = amax / 448, q = fp8(x * (1/s)),
x ~ q * s. The multiplication by the reciprocal (not a division) is what DeepGEMM's casts do: the two
round differently in about one element in 2200 of bf16 data, and with it the scales and the fp8 bytes are
bit-exact with DeepGEMM's casts at g = 64 and 128 (tests/kernels/peers/test_deepgemm.py).
A K (or N) that is not a multiple of g gets a last, narrower group: the scale covers only real columns.
"""

from __future__ import annotations

import torch

GROUP = 128  # the default scale granularity along K (both operands) and along N (weights)
SCALE_GROUPS = (64, 128)  # the granularities the kernel and the family take
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
AMAX_FLOOR = 1e-4


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_scale_group(group: object) -> int:
    """The scale group when it is one of SCALE_GROUPS; ValueError naming the allowed values otherwise."""
    if not isinstance(group, int) or isinstance(group, bool) or group not in SCALE_GROUPS:
        allowed = ", ".join(map(str, SCALE_GROUPS))
        raise ValueError(f"scale_group must be one of {allowed} (got {group!r})")
    return group


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
    q = (xp * (1.0 / scales).unsqueeze(2)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
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
    q = (wp * (1.0 / scales)[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
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
