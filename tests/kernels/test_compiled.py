"""Compiled evidence (kernels.compiled): every Triton config of the shipped GPU specs compiles for sm_90a
on this CPU-only machine, specialised as the JIT would at launch, and what the compiler reports keeps
the hand-written models honest. The compiles run in one subprocess (the test session sets
TRITON_INTERPRET, which replaces @triton.jit with the interpreter), as many at once as there are cores
(kernels.compiled.evidence_of_each); Triton's on-disk cache makes reruns fast."""

from __future__ import annotations

import pytest

from kernels.fp8_gemm.tiles import TileConfig

GPU_SPECS = ["jobs/specs/fp8_gemm.yaml", "jobs/specs/paged_mla.yaml", "jobs/specs/attention.yaml"]

SCRIPT = """
import json, sys
from jobs.spec.sweep import load_spec
from kernels.compiled import evidence_of_each, trial_check
from kernels.registry import get_family

def launch(t):
    return get_family(t.family).meta_launch(dict(t.shape), dict(t.config), t.dtype, t.backend)

points, calls = [], []  # (target, spec, trial) and its compile, all compiled at once below
for path in sys.argv[1:]:
    launched = [(t, launch(t)) for t in load_spec(path).trials()]
    launched = [(t, call) for t, call in launched if call is not None]
    for t, call in launched:
        points.append(("sm_90a", path, t))
        calls.append((call, "sm_90a"))
    # sm_100a: one representative launch per spec (the first triton trial), compiled as the JIT would
    points.append(("sm_100a", path, launched[0][0]))
    calls.append((launched[0][1], "sm_100a"))
rows, sm100 = [], []
for (target, path, t), found in zip(points, evidence_of_each(calls)):
    error = found if isinstance(found, str) else None  # reported, the test fails on it
    row = {"spec": path, "shape": t.shape, "config": t.config, "evidence": [] if error else found,
           "error": error}
    (rows if target == "sm_90a" else sm100).append(row)
spilling = {"block_m": 128, "block_n": 128, "block_k": 128, "group_m": 8, "num_warps": 4, "num_stages": 3}
shape = {"m": 4096, "n": 7168, "k": 2048}
check = trial_check(get_family("fp8_gemm"), shape, spilling, "float8_e4m3fn", "triton")
print(json.dumps({"rows": rows, "check": check, "sm100": sm100}))
"""


@pytest.fixture(scope="module")
def compiled(run_compiled):
    # TRITON_INTERPRET set, so kernels.common.mla.triton_decode leaves it alone
    return run_compiled(SCRIPT, *GPU_SPECS, interpret="0")


@pytest.mark.slow
def test_every_config_of_the_shipped_gpu_specs_compiles_for_sm90(compiled):
    rows = compiled["rows"]
    assert {r["spec"] for r in rows} == set(GPU_SPECS)
    failed = [(r["shape"], r["config"], r["error"]) for r in rows if r["error"]]
    assert not failed, failed[:5]
    assert all(r["evidence"] for r in rows)


@pytest.mark.slow
def test_a_representative_launch_of_each_shipped_gpu_spec_compiles_for_sm100(compiled):
    rows = compiled["sm100"]
    assert {r["spec"] for r in rows} == set(GPU_SPECS)
    failed = [(r["spec"], r["error"]) for r in rows if r["error"]]
    assert not failed, failed
    found = [e for r in rows for e in r["evidence"]]
    assert found and all(e["target"] == "sm_100a" and e["regs"] > 0 for e in found)
    assert not any(e["wgmma"] for e in found)  # wgmma is SM90-only; SM100's MMAs are tcgen05
    gemm = next(r for r in rows if r["spec"].endswith("fp8_gemm.yaml"))
    assert gemm["evidence"][0]["tcgen05"], gemm["evidence"][0]


@pytest.mark.slow
def test_launch_specialisation_matches_the_jit(compiled):
    gemm = next(r for r in compiled["rows"] if r["spec"].endswith("fp8_gemm.yaml"))
    ev = gemm["evidence"][0]
    # unit strides become constants, sizes and leading strides divisible by 16 are marked so
    assert ev["specialised"]["stride_ak"] == "1" and ev["specialised"]["stride_am"] == "D"
    assert ev["specialised"]["a_ptr"] == "D"


@pytest.mark.slow
def test_fp8_gemm_hand_model_within_ten_percent_of_the_compiler(compiled):
    from kernels.fp8_gemm.resources import estimate

    off = []
    for r in compiled["rows"]:
        if not r["spec"].endswith("fp8_gemm.yaml"):
            continue
        cfg = TileConfig.from_dict(r["config"])
        est = estimate(cfg, r["shape"]["m"], r["shape"]["n"], r["shape"]["k"])
        ev = r["evidence"][0]
        assert ev["wgmma"] == (cfg.block_m >= 64), cfg.label()  # SM90 tensor cores where the tile allows
        if abs(est.smem_total - ev["shared"]) > 0.1 * ev["shared"]:
            off.append(("smem", cfg.label(), est.smem_total, ev["shared"]))
        # every config the model says would spill does spill, and every spilling one is pruned
        assert est.spill_risk == ev["spills"], (cfg.label(), est.regs_estimate, ev["regs"], ev["stack"])
        assert not ev["spills"] or est.pruned
        # registers: the model is fitted to the wgmma tiles; the mma.sync tiles (block_m < 64) hold
        # their operands in registers and are left to the compiled check
        if cfg.block_m >= 64 and not ev["spills"] and abs(est.regs_estimate - ev["regs"]) > 0.1 * ev["regs"]:
            off.append(("regs", cfg.label(), est.regs_estimate, ev["regs"]))
    assert not off, off


@pytest.mark.slow
def test_compiled_check_finds_the_spilling_fp8_config(compiled):
    check = compiled["check"]
    assert check["checked"] and check["target"] == "sm_90a"
    assert check["problems"] and "spills" in check["problems"][0] and "num_warps=4" in check["problems"][0]


@pytest.mark.slow
def test_paged_mla_bf16_default_compiles_without_spills(compiled):
    rows = [r for r in compiled["rows"] if r["spec"].endswith("paged_mla.yaml")]
    bf16 = [e for r in rows if r["shape"]["kv_dtype"] == "bf16" for e in r["evidence"]]
    assert bf16 and not [e for e in bf16 if e["spills"]]
    assert all(e["shared"] <= e["smem_limit"] for e in bf16)
    split = [e for e in bf16 if e["kernel"] == "_split_kernel"]
    assert all(e["num_warps"] == 8 and e["num_stages"] in (2, 3) for e in split)  # 3: the 64 x 64 tile
    assert all(e["regs"] <= 240 for e in split), [e["regs"] for e in split]  # the kernel's register caps
    # every cache of the spec, FlashMLA's fp8 layout included, compiles clean at its default
    every = [e for r in rows for e in r["evidence"]]
    assert {r["shape"]["kv_dtype"] for r in rows} == {"bf16", "fp8", "fp8_flashmla"}
    assert not [e for e in every if e["spills"]]


def test_fp8_gemm_block_k_below_32_is_a_named_validation_error():
    with pytest.raises(ValueError, match=r"config.block_k must be >= 32.*got 16"):
        TileConfig.from_dict({"block_m": 64, "block_n": 64, "block_k": 16})


def test_compiling_under_the_interpreter_is_refused_with_the_reason():
    from kernels.compiled import capturing, interpreter_reason

    assert "TRITON_INTERPRET" in (interpreter_reason() or "")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"), capturing():
        pass


@pytest.mark.slow
def test_attention_kernels_of_the_shipped_spec_compile_clean_for_sm90(compiled):
    rows = [r for r in compiled["rows"] if r["spec"].endswith("attention.yaml")]
    kernels = {e["kernel"] for r in rows for e in r["evidence"]}
    # every Triton kernel the spec runs: prefill, split-KV decode + combine, sparse, paged decode step
    want = {"_flash_fwd_kernel", "_decode_split_kernel", "_decode_combine_kernel", "_sparse_kernel"}
    assert want <= kernels
    found = [e for r in rows for e in r["evidence"]]
    assert not [e for e in found if e["spills"]], [e for e in found if e["spills"]][:3]
    assert all(e["shared"] <= e["smem_limit"] for e in found)
    prefill = [e for e in found if e["kernel"] == "_flash_fwd_kernel"]
    assert prefill and all(e["wgmma"] for e in prefill)  # 64-row tiles reach the SM90 tensor cores
