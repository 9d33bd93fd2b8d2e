"""The Triton kernel (interpreter) against the references: calc_diff below 1e-3 for several tile
configs with masked tails, exactness against the dequantized fp32 product, broken variants caught."""

from __future__ import annotations

import pytest
import torch

from kernels.base import TrialRequest
from kernels.fp8_gemm import case, triton_gemm
from kernels.fp8_gemm.inputs import build_inputs
from kernels.fp8_gemm.reference import gemm_bf16, gemm_dequant_fp32
from kernels.fp8_gemm.tiles import TileConfig
from kernels.measure import MeasurePolicy, calc_diff, check_calc_diff

CASES = [
    # (m, n, k), config: aligned; M, N, K tails; block_n spanning two weight-scale blocks; block_k < 128
    ((64, 128, 256), TileConfig(32, 64, 128, group_m=8)),
    ((37, 200, 300), TileConfig(16, 64, 64, group_m=2)),
    ((70, 300, 200), TileConfig(16, 256, 32, group_m=3)),
    ((129, 130, 131), TileConfig(64, 128, 128, group_m=1, num_warps=8, num_stages=4)),
]


@pytest.mark.parametrize("shape, cfg", CASES, ids=[f"{m}x{n}x{k}-{c.label()}" for (m, n, k), c in CASES])
def test_kernel_matches_the_bf16_reference_and_the_dequantized_product(shape, cfg):
    m, n, k = shape
    x = build_inputs(m, n, k, seed=m + n + k)
    out, compiled = triton_gemm.fp8_gemm(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg)
    assert out.shape == (m, n) and out.dtype == torch.bfloat16 and compiled is None  # interpreter
    report = check_calc_diff(out, gemm_bf16(x.a, x.b))
    assert report.passed and 1e-5 < report.calc_diff < 1e-3, report
    # against what the fp8 operands exactly give: only the bf16 conversion of D and fp32 summation order
    # separate them. One bf16 ulp (2^-7 relative): the interpreter converts fp32 -> bf16 by truncation
    # (a GPU rounds to nearest, half an ulp)
    exact = gemm_dequant_fp32(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales)
    assert torch.all((out.float() - exact).abs() <= exact.abs() * 2.0**-7 + 1e-3)


def test_kernel_writes_nothing_outside_d():
    m, n, k = 20, 40, 144
    x = build_inputs(m, n, k, seed=3)
    big = torch.full((m + 8, n + 8), float("nan"), dtype=torch.bfloat16)
    view = big[:m, :n]  # strided output inside a poisoned buffer
    triton_gemm.fp8_gemm(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, TileConfig(16, 32, 128), out=view)
    assert torch.all(torch.isfinite(view))
    assert torch.all(torch.isnan(big[m:, :])) and torch.all(torch.isnan(big[:, n:]))


def test_wrong_scale_granularity_is_caught_by_calc_diff():
    # 128-granular scales read as 64-granular ones: laid out in the 64 shape (so the operand checks pass)
    # but indexed wrong, group g of 64 reading the scale of 128-group g
    x = build_inputs(48, 96, 256, seed=1)
    ref = gemm_bf16(x.a, x.b)
    a_scales = torch.cat([x.a_scales, x.a_scales], dim=1)  # [48, 4]
    b_scales = torch.cat([x.b_scales, x.b_scales], dim=0).repeat(1, 2)[:2]  # [2, 4]
    broken, _ = triton_gemm.fp8_gemm(
        x.a_fp8, a_scales, x.b_fp8, b_scales, TileConfig(16, 32, 64), scale_group=64
    )
    assert calc_diff(broken, ref) > 1e-2
    assert not check_calc_diff(broken, ref).passed


def test_operand_checks_name_the_bad_operand():
    x = build_inputs(16, 32, 128, seed=0)
    with pytest.raises(ValueError, match="a_scales"):
        triton_gemm.fp8_gemm(x.a_fp8, x.a_scales[:, :0], x.b_fp8, x.b_scales, TileConfig(16, 32, 128))
    with pytest.raises(ValueError, match="float8"):
        triton_gemm.fp8_gemm(x.a, x.a_scales, x.b_fp8, x.b_scales, TileConfig(16, 32, 128))


POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=0.5, min_time_s=0, seeds=2)
CFG = {"block_m": 16, "block_n": 64, "block_k": 128, "group_m": 2, "num_warps": 4, "num_stages": 2}


def _request(backend: str, config: dict, shape=(24, 80, 160)) -> TrialRequest:
    m, n, k = shape
    return TrialRequest("fp8_gemm", backend, {"m": m, "n": n, "k": k}, config, "float8_e4m3fn", POLICY)


def test_case_runs_triton_with_metrics_resources_and_every_seed():
    o = case.FAMILY.run(_request("triton", CFG))
    assert o.status == "ok", o.error
    assert o.correctness["passed"] and len(o.correctness["per_seed"]) == 2
    assert 0 < o.metrics["calc_diff"] < 1e-3
    for key in ("time_ns", "tflops", "gbps", "spread_cv", "flops", "bytes"):
        assert o.metrics[key] is not None and o.metrics[key] > 0, key
    assert o.metrics["flops"] == 2 * 24 * 80 * 160
    assert len(o.samples_ns) >= 2 and o.timer == "cpu_perf_counter"
    assert o.resources["model"]["smem_total"] > 0 and not o.resources["model"]["pruned"]
    assert o.resources["compiled"]["collected"] is False  # no compiled kernel in the interpreter
    assert o.resources["ncu"]["collected"] is False


def test_case_marks_a_broken_kernel_incorrect(monkeypatch):
    real = triton_gemm.prepare

    def wrong_scales(a, a_scales, b, b_scales, cfg, **kwargs):  # the K groups' scales swapped
        return real(a, a_scales.flip(1), b, b_scales.flip(1), cfg, **kwargs)

    monkeypatch.setattr(triton_gemm, "prepare", wrong_scales)
    o = case.FAMILY.run(_request("triton", {**CFG, "block_k": 64}))
    assert o.status == "incorrect"
    # wrong scales may overflow to inf/NaN, which the outcome carries as the string "inf"/"nan" (JSON)
    diff = float(o.correctness["calc_diff"])
    assert not o.correctness["passed"] and not diff <= 1e-3, diff
    assert "calc_diff" in o.correctness["message"]


def test_case_torch_backends_and_missing_deep_gemm():
    ref = case.FAMILY.run(_request("torch_ref", {}))
    assert ref.status == "ok" and 0 < ref.metrics["calc_diff"] < 1e-3
    bf16 = case.FAMILY.run(_request("torch_bf16", {}))
    assert bf16.status == "ok" and bf16.metrics["calc_diff"] == 0.0
    dg = case.FAMILY.run(_request("deep_gemm", {}))
    assert dg.status == "skipped" and "deep_gemm" in dg.error and "GPU" in dg.error
    assert dg.resources["model"]["deepgemm_choice"]["block_k"] == 128


@pytest.mark.parametrize(
    "config, dtype, match",
    [
        ({**CFG, "block_k": 256}, "float8_e4m3fn", "block_k must divide"),
        ({**CFG, "block_n": 48}, "float8_e4m3fn", "power of two"),
        ({**CFG, "bogus": 1}, "float8_e4m3fn", "unknown config keys"),
        ({k: v for k, v in CFG.items() if k != "block_m"}, "float8_e4m3fn", "needs block_m"),
        (CFG, "bfloat16", "float8_e4m3fn"),
    ],
)
def test_validate_names_the_bad_field(config, dtype, match):
    with pytest.raises(ValueError, match=match):
        case.FAMILY.validate({"m": 1, "n": 2, "k": 3}, config, dtype, "triton")
