"""The FP8 GEMM family against DeepGEMM on DeepGEMM's own terms (issue 43), at both scale granularities.

DeepGEMM's test casts and measure are re-implemented here from their definitions (nothing of DeepGEMM is
imported; it needs a GPU):
  per-token cast   pad K with zeros to a multiple of gran_k; per row and gran_k columns, amax in fp32
                   floored at 1e-4; sf = amax / 448; fp8 = (x * (1 / sf)) -> e4m3 (times the reciprocal)
  per-block cast   the same over gran_k x gran_k blocks of [N, K] (N padded too)
  calc_diff        1 - 2 sum(x y) / sum(x^2 + y^2) in float64; a kernel passes below 1e-3
  reference        the dequantized operands (fp8 x its group's scale) multiplied in fp32, out in bf16
The project's quantizers must give the same scales and the same fp8 bytes, its fp32 reference must be
within one bf16 ulp of that reference, and its Triton kernel (in the interpreter) fed DeepGEMM-cast
operands must pass DeepGEMM's calc_diff: with K a multiple of neither 64 nor 128, odd M and N, for
gran_k 64 and 128.
"""

from __future__ import annotations

import pytest
import torch

from kernels.fp8_gemm import triton_gemm
from kernels.fp8_gemm.quant import quantize_per_block, quantize_per_token
from kernels.fp8_gemm.reference import gemm_bf16, gemm_dequant_fp32
from kernels.fp8_gemm.tiles import TileConfig

E4M3 = torch.float8_e4m3fn
GRANS = (64, 128)


def _round_up(x: int, to: int) -> int:
    return -(-x // to) * to


def peer_per_token_cast(x: torch.Tensor, gran_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    padded = torch.zeros(rows, _round_up(cols, gran_k), dtype=x.dtype)
    padded[:, :cols] = x
    groups = padded.view(rows, -1, gran_k)
    sf = groups.abs().float().amax(dim=2).clamp(min=1e-4) / 448.0
    q = (groups * (1.0 / sf[:, :, None])).to(E4M3)
    return q.view(rows, -1)[:, :cols].contiguous(), sf


def peer_per_block_cast(x: torch.Tensor, gran_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, cols = x.shape
    padded = torch.zeros(_round_up(rows, gran_k), _round_up(cols, gran_k), dtype=x.dtype)
    padded[:rows, :cols] = x
    blocks = padded.view(padded.shape[0] // gran_k, gran_k, padded.shape[1] // gran_k, gran_k)
    sf = blocks.abs().float().amax(dim=(1, 3)).clamp(min=1e-4) / 448.0
    q = (blocks * (1.0 / sf[:, None, :, None])).to(E4M3)
    return q.view_as(padded)[:rows, :cols].contiguous(), sf


def peer_calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = (x * x + y * y).sum()
    return 0.0 if denom == 0 else float(1 - 2 * (x * y).sum() / denom)


def peer_reference(
    a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, gran_k: int
) -> torch.Tensor:
    """fp32 [M, N]: each fp8 element times its own group's scale (looked up by index), fp32 matmul (a
    DeepGEMM test rounds it to the bf16 of its output)."""
    k_group = torch.arange(a.shape[1]) // gran_k
    n_group = torch.arange(b.shape[0]) // gran_k
    a_deq = a.float() * sfa[:, k_group]
    b_deq = b.float() * sfb[n_group][:, k_group]
    return a_deq @ b_deq.T


def bf16_ulps(x: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest |x - ref| in units of the bf16 ulp at ref (2^(e - 7) for |ref| in [2^e, 2^(e+1)));
    below 1 the ulp of 1 (2^-7), so results that cancel to near zero are judged absolutely."""
    mag = ref.double().abs().clamp(min=1.0)
    ulp = torch.exp2(torch.floor(torch.log2(mag)) - 7)
    return float(((x.double() - ref.double()).abs() / ulp).max()) if x.numel() else 0.0


def _data(rows: int, cols: int, seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen)
    x *= torch.exp2(torch.randint(-8, 9, (rows, 1), generator=gen).float())  # rows of different ranges
    x[0, : min(cols, 64)] = 0  # an all-zero group (the amax floor)
    return x.to(dtype)


SHAPES = [(1, 17), (7, 100), (33, 200), (129, 300), (200, 1000)]


@pytest.mark.parametrize("gran_k", GRANS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_per_token_quantizer_is_bit_exact(shape, dtype, gran_k):
    x = _data(*shape, seed=sum(shape) + gran_k, dtype=dtype)
    q, s = quantize_per_token(x, group=gran_k)
    q_peer, s_peer = peer_per_token_cast(x, gran_k)
    assert s.shape == s_peer.shape == (shape[0], -(-shape[1] // gran_k))
    assert torch.equal(s.view(torch.int32), s_peer.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), q_peer.view(torch.uint8))


@pytest.mark.parametrize("gran_k", GRANS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
def test_per_block_quantizer_is_bit_exact(shape, dtype, gran_k):
    w = _data(*shape, seed=3 * sum(shape) + gran_k, dtype=dtype)
    q, s = quantize_per_block(w, group=gran_k)
    q_peer, s_peer = peer_per_block_cast(w, gran_k)
    assert s.shape == s_peer.shape == (-(-shape[0] // gran_k), -(-shape[1] // gran_k))
    assert torch.equal(s.view(torch.int32), s_peer.view(torch.int32))
    assert torch.equal(q.view(torch.uint8), q_peer.view(torch.uint8))


@pytest.mark.parametrize("gran_k", GRANS)
@pytest.mark.parametrize(
    "mnk", [(1, 7, 17), (37, 129, 200), (65, 200, 300)], ids=lambda s: "x".join(map(str, s))
)
def test_reference_is_within_one_bf16_ulp_of_the_peer_reference(mnk, gran_k):
    m, n, k = mnk
    a, b = _data(m, k, seed=m + gran_k), _data(n, k, seed=n + k + gran_k)
    (qa, sa), (qb, sb) = peer_per_token_cast(a, gran_k), peer_per_block_cast(b, gran_k)
    ours = gemm_dequant_fp32(qa, sa, qb, sb, group=gran_k)
    peer = peer_reference(qa, sa, qb, sb, gran_k)
    assert ours.dtype == torch.float32 and ours.shape == (m, n)
    assert bf16_ulps(ours, peer.to(torch.bfloat16)) <= 1  # what a DeepGEMM test compares with
    assert bf16_ulps(ours.to(torch.bfloat16), peer.to(torch.bfloat16)) <= 1


# (M, N, K), gran_k, tile config: K a multiple of neither 64 nor 128, M and N odd, block_n spanning two
# weight-scale blocks, block_k below the group
KERNEL_CASES = [
    ((7, 33, 100), 64, TileConfig(16, 32, 64, group_m=2)),
    ((13, 129, 200), 64, TileConfig(16, 128, 32, group_m=1)),
    ((9, 65, 150), 128, TileConfig(16, 64, 128, group_m=2)),
    ((31, 131, 300), 128, TileConfig(32, 256, 64, group_m=3)),
]


@pytest.mark.parametrize(
    "mnk, gran_k, cfg", KERNEL_CASES, ids=[f"{m}x{n}x{k}-g{g}" for (m, n, k), g, _ in KERNEL_CASES]
)
def test_triton_kernel_on_peer_cast_operands(mnk, gran_k, cfg):
    m, n, k = mnk
    gen = torch.Generator().manual_seed(m * n + k + gran_k)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    (qa, sa), (qb, sb) = peer_per_token_cast(a, gran_k), peer_per_block_cast(b, gran_k)
    out, _ = triton_gemm.fp8_gemm(qa, sa, qb, sb, cfg, scale_group=gran_k)
    assert peer_calc_diff(out, gemm_bf16(a, b)) < 1e-3
    # the interpreter truncates fp32 -> bf16 (a GPU rounds): within one bf16 ulp of the exact product
    assert bf16_ulps(out, peer_reference(qa, sa, qb, sb, gran_k)) <= 1


def test_peer_calc_diff_and_ours_agree():
    from kernels.measure import calc_diff

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 48, generator=gen).to(torch.bfloat16)
    y = (x.float() + 0.01 * torch.randn(64, 48, generator=gen)).to(torch.bfloat16)
    assert calc_diff(x, y) == pytest.approx(peer_calc_diff(x, y), rel=1e-12, abs=1e-15)
    assert peer_calc_diff(torch.zeros(3), torch.zeros(3)) == 0.0
