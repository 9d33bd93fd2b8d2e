"""Quantize / dequantize round trips: scale shapes, the e4m3 error bound, tails, all-zero groups."""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_gemm.quant import (
    FP8,
    FP8_MAX,
    dequantize_per_block,
    dequantize_per_token,
    quantize_per_block,
    quantize_per_token,
)

# e4m3: 3 mantissa bits, so rounding a normal value errs by at most 2^-4 of it; below the smallest
# normal (2^-6, in units of the scale) the spacing is 2^-9, so at most 2^-10 x scale.
REL, SUBNORMAL = 2.0**-4, 2.0**-10


def _bound(x: torch.Tensor, scale_full: torch.Tensor) -> torch.Tensor:
    return torch.maximum(REL * x.abs(), SUBNORMAL * scale_full) * (1 + 1e-6) + 1e-12


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("m, k", [(4, 128), (5, 300), (1, 17)])
def test_per_token_round_trip_within_the_e4m3_bound(m, k, group):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m * k)) * 3
    q, s = quantize_per_token(x, group)
    assert (
        q.dtype == FP8 and q.shape == (m, k) and s.shape == (m, -(-k // group)) and s.dtype == torch.float32
    )
    back = dequantize_per_token(q, s, group)
    full = s.repeat_interleave(group, dim=1)[:, :k]
    assert torch.all((back - x).abs() <= _bound(x, full))
    assert float((back - x).norm() / x.norm()) < 0.04
    # each group's largest magnitude lands exactly on +-448: no range is wasted
    for g in range(s.shape[1]):
        cols = slice(g * group, min(k, (g + 1) * group))
        assert torch.allclose(q[:, cols].float().abs().amax(dim=1), torch.full((m,), FP8_MAX))


@pytest.mark.parametrize("group", [64, 128])
@pytest.mark.parametrize("n, k", [(128, 256), (200, 130), (7, 9)])
def test_per_block_round_trip_within_the_e4m3_bound(n, k, group):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k))
    q, s = quantize_per_block(w, group)
    assert q.shape == (n, k) and s.shape == (-(-n // group), -(-k // group))
    back = dequantize_per_block(q, s, group)
    full = s.repeat_interleave(group, dim=0).repeat_interleave(group, dim=1)[:n, :k]
    assert torch.all((back - w).abs() <= _bound(w, full))
    assert float((back - w).norm() / w.norm()) < 0.04


def test_block_scale_covers_only_its_own_block():
    w = torch.ones(256, 256)
    w[:128, :128] *= 100.0  # one loud block must not flatten the others
    q, s = quantize_per_block(w)
    assert s.shape == (2, 2)
    assert torch.allclose(s, torch.tensor([[100.0, 1.0], [1.0, 1.0]]) / FP8_MAX)
    assert torch.equal(dequantize_per_block(q, s), w)


def test_all_zero_groups_stay_finite_and_zero():
    x = torch.zeros(3, 200)
    q, s = quantize_per_token(x)
    assert torch.all(torch.isfinite(s)) and torch.all(s > 0)
    assert torch.equal(dequantize_per_token(q, s), x)
