"""The scale group (the scales' K granularity, 64 or 128) through the whole FP8 GEMM family (issue 43):
the kernel's operand checks, quantization, references, inputs, the family's case (validate, execute,
cost, meta_launch), the resource model, the DeepGEMM adapter, the spec and the tuned-config export."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from jobs.spec.sweep import SpecError, load_spec, loads_spec
from kernels.base import TrialRequest, TrialStatus
from kernels.fp8_gemm import case, deep_gemm_adapter, triton_gemm
from kernels.fp8_gemm.cost import gemm_cost
from kernels.fp8_gemm.export import best_configs, port_file_name
from kernels.fp8_gemm.inputs import build_inputs
from kernels.fp8_gemm.quant import cdiv, quantize_per_block, quantize_per_token
from kernels.fp8_gemm.reference import gemm_bf16, gemm_dequant_fp32
from kernels.fp8_gemm.resources import deepgemm_smem, estimate
from kernels.fp8_gemm.tiles import TileConfig
from kernels.measure import MeasurePolicy, check_calc_diff

CPU_SPEC = Path(__file__).resolve().parents[3] / "jobs" / "specs" / "fp8_gemm_cpu.yaml"
POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=2, max_time_s=0.5, min_time_s=0, seeds=1)
CFG64 = {"block_m": 16, "block_n": 32, "block_k": 64, "group_m": 2, "num_warps": 4, "num_stages": 2}


def _within_one_bf16_ulp(out: torch.Tensor, exact: torch.Tensor) -> bool:
    # the interpreter converts fp32 -> bf16 by truncation: one ulp (2^-7 relative) apart at most
    return bool(torch.all((out.float() - exact).abs() <= exact.abs() * 2.0**-7 + 1e-3))


def _request(backend: str, shape: dict, config: dict | None = None) -> TrialRequest:
    return TrialRequest("fp8_gemm", backend, shape, config or {}, "float8_e4m3fn", POLICY)


# ---- the kernel -------------------------------------------------------------------------------------


def test_fp8_gemm_takes_the_64_granular_scales_of_the_projects_own_quantizers():
    # the issue's case: fp8_gemm(..., scale_group=64) refused these scales, checking them against K/128
    m, n, k = 24, 80, 200  # K a multiple of neither 64 nor 128, N odd of a 64 block
    gen = torch.Generator().manual_seed(43)
    a = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, generator=gen).to(torch.bfloat16)
    qa, sa = quantize_per_token(a, group=64)
    qb, sb = quantize_per_block(b, group=64)
    assert sa.shape == (m, 4) and sb.shape == (2, 4)
    out, _ = triton_gemm.fp8_gemm(qa, sa, qb, sb, TileConfig(16, 32, 64, group_m=2), scale_group=64)
    assert check_calc_diff(out, gemm_bf16(a, b)).passed
    assert _within_one_bf16_ulp(out, gemm_dequant_fp32(qa, sa, qb, sb, group=64))


def test_the_kernel_judges_the_scales_by_its_scale_group():
    x = build_inputs(16, 40, 136, seed=0)  # 128-granular scales: [16, 2] and [1, 2]
    cfg = TileConfig(16, 32, 64)
    with pytest.raises(ValueError, match=r"a_scales must be \[M, ceil\(K/64\)\] = \(16, 3\)"):
        triton_gemm.fp8_gemm(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, cfg, scale_group=64)
    with pytest.raises(ValueError, match=r"scale_group must be one of 64, 128 \(got 96\)"):
        triton_gemm.fp8_gemm(x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, TileConfig(16, 32, 32), scale_group=96)


def test_the_kernel_refuses_a_block_k_that_does_not_divide_the_group_naming_both():
    x = build_inputs(16, 40, 136, seed=0, scale_group=64)
    with pytest.raises(ValueError, match="block_k 128 must divide the scale group 64"):
        triton_gemm.fp8_gemm(
            x.a_fp8, x.a_scales, x.b_fp8, x.b_scales, TileConfig(16, 32, 128), scale_group=64
        )


@pytest.mark.parametrize("group", [64, 128])
def test_inputs_carry_their_scale_group(group):
    x = build_inputs(5, 70, 150, seed=1, scale_group=group)
    assert x.scale_group == group
    assert x.a_scales.shape == (5, cdiv(150, group)) and x.b_scales.shape == (
        cdiv(70, group),
        cdiv(150, group),
    )
    assert torch.equal(
        build_inputs(5, 70, 150, seed=1).a_scales, build_inputs(5, 70, 150, 1, scale_group=128).a_scales
    )


# ---- the family ----------------------------------------------------------------------------------------


def test_validate_takes_an_optional_scale_group_of_64_or_128():
    fam = case.FAMILY
    fam.validate({"m": 1, "n": 2, "k": 3, "scale_group": 64}, CFG64, "float8_e4m3fn", "triton")
    fam.validate({"m": 1, "n": 2, "k": 3, "scale_group": 128}, {}, "float8_e4m3fn", "torch_ref")
    for bad in (96, 0, True, "64"):
        with pytest.raises(ValueError, match=r"shape.scale_group must be one of 64, 128"):
            fam.validate({"m": 1, "n": 2, "k": 3, "scale_group": bad}, {}, "float8_e4m3fn", "torch_ref")
    with pytest.raises(ValueError, match="unknown shape keys"):
        fam.validate({"m": 1, "n": 2, "k": 3, "group": 64}, {}, "float8_e4m3fn", "torch_ref")
    assert fam.optional_shape_keys == ("scale_group",)


def test_the_default_group_is_left_out_of_a_shape():
    canon = case.FAMILY.canonical_shape
    assert canon({"m": 1, "n": 2, "k": 3, "scale_group": 128}) == {"m": 1, "n": 2, "k": 3}
    assert canon({"m": 1, "n": 2, "k": 3, "scale_group": 64}) == {"m": 1, "n": 2, "k": 3, "scale_group": 64}


def test_execute_runs_a_point_at_scale_group_64_through_quantization_and_the_kernel(monkeypatch):
    seen = []
    real = triton_gemm.prepare

    def spy(a, a_scales, b, b_scales, cfg, **kwargs):
        seen.append((tuple(a_scales.shape), tuple(b_scales.shape), kwargs.get("scale_group")))
        return real(a, a_scales, b, b_scales, cfg, **kwargs)

    monkeypatch.setattr(triton_gemm, "prepare", spy)
    shape = {"m": 24, "n": 80, "k": 200, "scale_group": 64}
    o = case.FAMILY.execute(_request("triton", shape, CFG64))
    assert o.status == TrialStatus.OK, o.error or o.correctness
    assert 0 < o.metrics["calc_diff"] < 1e-3
    assert seen and set(seen) == {((24, 4), (2, 4), 64)}
    assert o.resources["model"]["scale_group"] == 64
    ref = case.FAMILY.execute(_request("torch_ref", shape))
    assert ref.status == TrialStatus.OK and 0 < ref.metrics["calc_diff"] < 1e-3


def test_the_torch_reference_dequantizes_with_the_trials_group(monkeypatch):
    # a torch_ref that dequantized 64-granular scales as 128-granular ones would be far off: it is not
    groups = []
    real = case.gemm_dequant_fp32

    def spy(*args, **kwargs):
        groups.append(kwargs.get("group"))
        return real(*args, **kwargs)

    monkeypatch.setattr(case, "gemm_dequant_fp32", spy)
    o = case.FAMILY.execute(_request("torch_ref", {"m": 9, "n": 70, "k": 136, "scale_group": 64}))
    assert o.status == TrialStatus.OK and o.metrics["calc_diff"] < 1e-3 and set(groups) == {64}


def test_a_block_k_wider_than_the_group_is_pruned_naming_both():
    o = case.FAMILY.execute(_request("triton", {"m": 24, "n": 80, "k": 200, "scale_group": 64},
                                     {**CFG64, "block_k": 128}))  # fmt: skip
    assert o.status == TrialStatus.PRUNED
    assert o.error.startswith("pruned: ") and "block_k 128 does not divide the scale group 64" in o.error
    assert o.resources["model"]["pruned"] and o.metrics["flops"] == 2 * 24 * 80 * 200


def test_deep_gemm_at_scale_group_64_is_skipped_with_the_reason(monkeypatch):
    assert deep_gemm_adapter.scale_group_reason(128) is None
    reason = deep_gemm_adapter.scale_group_reason(64)
    assert "128" in reason and "64" in reason
    # as on a host with the library: the backend's own skip decides, before the library is touched
    with_library = dataclasses.replace(case.FAMILY.backends["deep_gemm"], requires=lambda: None)
    monkeypatch.setitem(case.FAMILY.backends._by_name, "deep_gemm", with_library)
    assert with_library.unavailable_reason({"m": 16, "n": 32, "k": 128}) is None
    o = case.FAMILY.run(_request("deep_gemm", {"m": 16, "n": 32, "k": 128, "scale_group": 64}))
    assert o.status == TrialStatus.SKIPPED and o.error == reason
    assert o.metrics["flops"] == 2 * 16 * 32 * 128


def test_cost_counts_the_scales_at_the_group():
    assert gemm_cost(64, 256, 512, scale_group=64).bytes_read == 64 * 512 + 256 * 512 + (64 * 8 + 4 * 8) * 4
    assert gemm_cost(64, 256, 512).bytes_read == 64 * 512 + 256 * 512 + (64 * 4 + 2 * 4) * 4
    c64 = case.FAMILY.cost({"m": 64, "n": 256, "k": 512, "scale_group": 64}, "float8_e4m3fn")
    assert c64 == gemm_cost(64, 256, 512, scale_group=64)


def test_meta_launch_lays_out_the_scales_at_the_group(monkeypatch):
    seen = []
    monkeypatch.setattr(
        triton_gemm,
        "prepare",
        lambda a, sa, b, sb, cfg, **kw: seen.append((sa.shape, sb.shape, kw)) or (None, None),
    )
    case.FAMILY.meta_launch({"m": 24, "n": 80, "k": 200, "scale_group": 64}, CFG64, "float8_e4m3fn", "triton")
    assert seen == [((24, 4), (2, 4), {"scale_group": 64})]


def test_resource_model_at_the_group():
    cfg = TileConfig(64, 128, 64, num_stages=3)
    e64, e128 = estimate(cfg, 256, 256, 512, scale_group=64), estimate(cfg, 256, 256, 512)
    assert e64.smem_stage_parts["b_scales"] == 2 * 4 and e128.smem_stage_parts["b_scales"] == 4
    assert e64.scale_group == 64 and not e64.pruned
    wide = estimate(TileConfig(64, 128, 128), 256, 256, 512, scale_group=64)
    assert wide.pruned and "block_k 128 does not divide the scale group 64" in wide.prune_message()
    # DeepGEMM-style: all of B's K scales, ceil(K / group) of them
    assert deepgemm_smem(64, 128, 64, 3, 512, scale_group=64)["b_scales"] == 8 * 4
    assert deepgemm_smem(64, 128, 128, 3, 512)["b_scales"] == 4 * 4


# ---- the spec, the store's identity of a point, the export ------------------------------------------------

SPEC = """
name: fp8-groups
family: fp8_gemm
backends:
  - {{name: torch_ref, baseline: true}}
  - name: triton
    configs:
      grid: {{block_m: [16], block_n: [32], block_k: [64], group_m: [2], num_warps: [4], num_stages: [2]}}
shapes:
  grid: {{m: [16], n: [32], k: [200], scale_group: {groups}}}
  include: {include}
dtypes: [float8_e4m3fn]
"""


def test_a_spec_names_the_group_as_a_shape_key_and_128_is_the_default():
    spec = loads_spec(SPEC.format(groups="[64, 128]", include="[]"))
    shapes = [t.shape for t in spec.trials() if t.backend == "triton"]
    assert shapes == [{"m": 16, "n": 32, "k": 200, "scale_group": 64}, {"m": 16, "n": 32, "k": 200}]
    # a 128 point is the point without the key: the same trial key, so one series in the store
    plain = loads_spec(SPEC.format(groups="[128]", include="[]").replace(", scale_group: [128]", ""))
    keys = {t.key for t in spec.trials()}
    assert {t.key for t in plain.trials()} <= keys


def test_a_spec_with_a_bad_group_or_one_point_twice_fails_at_load():
    with pytest.raises(SpecError, match=r"shape.scale_group must be one of 64, 128 \(got 32\)"):
        loads_spec(SPEC.format(groups="[32]", include="[]"))
    with pytest.raises(SpecError, match="the same point"):
        loads_spec(SPEC.format(groups="[64, 128]", include="[{m: 16, n: 32, k: 200}]"))


def test_the_cpu_spec_runs_a_point_at_scale_group_64():
    spec = load_spec(CPU_SPEC)
    at64 = [t for t in spec.trials() if t.shape.get("scale_group") == 64 and t.backend == "triton"]
    runnable = [t for t in at64 if t.config["block_k"] == 64]
    assert runnable and len(at64) > len(runnable)  # the block_k 128 configs are pruned there
    t = runnable[0]
    o = case.FAMILY.execute(TrialRequest(t.family, t.backend, t.shape, t.config, t.dtype, POLICY))
    assert o.status == TrialStatus.OK and o.correctness["passed"], o.error or o.correctness


def test_the_export_keeps_the_groups_apart():
    cfg = {**CFG64, "block_k": 64}

    def trial(shape, ns):
        return SimpleNamespace(
            backend="triton", shape=shape, config=cfg, status="ok", correct=True, median_ns=ns
        )

    table, missing = best_configs(
        [
            trial({"m": 16, "n": 32, "k": 256}, 10.0),
            trial({"m": 16, "n": 32, "k": 256, "scale_group": 64}, 5.0),
        ]
    )
    assert set(table) == {"N=32,K=256", "N=32,K=256,block_shape=[64,64]"} and not missing
    assert (
        port_file_name("N=32,K=256", "H200")
        == "N=32,K=256,device_name=H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    )
    assert (
        port_file_name("N=32,K=256,block_shape=[64,64]", "H200")
        == "N=32,K=256,device_name=H200,dtype=fp8_w8a8,block_shape=[64,64].json"
    )
