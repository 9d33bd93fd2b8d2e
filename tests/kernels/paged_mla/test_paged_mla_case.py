"""The family the farm runs: run() on tiny trial requests, validate(), cost(), the specs."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import math
from pathlib import Path

import pytest
import torch

from jobs.spec.sweep import load_spec
from kernels.base import TrialRequest
from kernels.common.mla.cost import mla_decode_cost
from kernels.measure.policy import MeasurePolicy
from kernels.paged_mla.case import FAMILY, shape_seqlens
from kernels.paged_mla.inputs import sample_seqlens
from kernels.registry import get_family

get_family("paged_mla")  # FARM_PLUGINS: testkit.kernels.faults wraps its backends when it is handed out

SPECS = Path(__file__).resolve().parents[3] / "jobs" / "specs"
POLICY = MeasurePolicy(warmup_ms=0, min_samples=1, max_samples=2, max_time_s=0.2, min_time_s=0)
# The overread of the broken variant stays inside each sequence's last page (20 of 32 slots), where the
# slots are NaN: past a page boundary it would dereference INVALID_BLOCK_ID and crash the process.
SHAPE = {"batch": 2, "seqlen": 20, "dist": "fixed", "h_q": 2, "s_q": 2, "page_size": 16, "kv_dtype": "bf16"}
TRACE_CONFIG = {"context": 512, "concurrency": 4, "conversations": 12, "turns": 3, "pool": 0.5}


def run(backend, shape=SHAPE, config=None, policy=POLICY):
    config = config or {}
    FAMILY.validate(shape, config, "bfloat16", backend)
    return FAMILY.run(TrialRequest("paged_mla", backend, shape, config, "bfloat16", policy=policy))


def test_registered():
    assert get_family("paged_mla") is FAMILY
    assert set(FAMILY.backends) == {"torch_ref", "triton", "flash_mla", "cache_trace"}


@pytest.mark.parametrize(
    ("backend", "config", "shape"),
    [
        ("torch_ref", {}, SHAPE),
        ("triton", {"num_splits": 2}, SHAPE),
        ("triton", {"num_splits": "auto"}, {**SHAPE, "kv_dtype": "fp8", "s_q": 1, "shared_prefix": 16}),
    ],
)
def test_decode_trial_metrics(backend, config, shape):
    o = run(backend, shape, config)
    assert o.status == "ok", o.correctness.get("message") or o.error
    c = o.correctness
    assert c["passed"] and c["lse"]["passed"] and c["poisoned"]
    assert [s["seed"] for s in c["per_seed"]] == [0, 1] and c["method"] == "flashmla"
    assert o.samples_ns and o.summary.median > 0 and o.timer == "cpu_perf_counter"
    m = o.metrics
    cost = mla_decode_cost(
        shape_seqlens(shape), h_q=shape["h_q"], s_q=shape["s_q"], kv_dtype=shape["kv_dtype"]
    )
    assert m["bytes"] == cost.bytes and m["flops"] == cost.flops
    assert m["gbps"] == pytest.approx(cost.bytes / (o.summary.median / 1e9) / 1e9)
    assert m["tflops"] > 0 and m["total_tokens"] == 40
    assert m["evictions"] == 0 and m["pages_in_use"] >= 2
    assert m["fragmentation_slots"] == 2 * (32 - 20)  # a shared prefix page is full: no waste there
    assert 0 < m["bytes_per_token"] and m["bytes_per_token_raw"] == 576 * (
        1 if shape["kv_dtype"] == "fp8" else 2
    ) + (4 if shape["kv_dtype"] == "fp8" else 0)
    if shape.get("shared_prefix"):  # the second sequence's first page is the first one's
        assert (m["page_hits"], m["page_misses"], m["page_hit_rate"]) == (1, 1, 0.5)
        assert m["bytes_per_token"] < m["bytes_per_token_raw"] * 32 / 20
    else:
        assert m["page_hit_rate"] == 0.0
    if backend == "triton":
        if config["num_splits"] == 2:
            assert m["num_splits"] == 2 and m["split_plan"] == "uniform"
        else:  # auto: the balanced plan, its work per unit within one block
            assert m["split_plan"] == "balanced" and m["num_splits"] >= 1
            assert m["plan_max_unit_blocks"] - m["plan_min_unit_blocks"] <= 1
        # the compiled check ran and said why it could not compile here (the interpreter)
        check = o.resources["compiled_check"]
        assert check["checked"] is False and "TRITON_INTERPRET" in check["reason"]
    else:
        assert "compiled_check" not in o.resources
    assert o.memory["method"] == "torch_profiler_cpu" and o.memory["peak_bytes"] > 0
    assert o.memory["working_set_bytes"] == cost.bytes


def test_fragmentation_metric_is_slots_left_in_last_pages():
    o = run("torch_ref", {**SHAPE, "seqlen": 20})
    assert o.metrics["fragmentation_slots"] == 2 * (32 - 20)
    assert o.metrics["fragmentation_pct"] == pytest.approx(100 * 24 / 64)


def test_broken_kernel_is_incorrect():
    o = run("triton", config={"num_splits": 1, "_overread": 1})
    assert o.status == "incorrect" and not o.correctness["passed"]
    assert o.correctness["nonfinite_mismatches"] > 0 and "failed on seeds [0, 1]" in o.correctness["message"]
    assert o.samples_ns  # still timed: an incorrect trial keeps its numbers


def test_poisoning_off_still_passes():
    policy = POLICY.model_copy(update={"poison_unused": False, "seeds": 1})
    o = run("triton", config={"num_splits": 2}, policy=policy)
    assert o.status == "ok" and o.correctness["poisoned"] is False


def test_cache_trace_trial():
    shape = {**SHAPE, "page_size": 16}
    o = run("cache_trace", shape, TRACE_CONFIG)
    assert o.status == "ok" and o.correctness == {
        "passed": True,
        "method": "cache_invariants",
        "message": "ok",
    }
    assert not o.samples_ns  # nothing is timed: the report shows no time or speedup for it
    m = o.metrics
    assert m["requests"] == 36 and m["pool_pages"] == math.ceil(0.5 * 4 * 512 / 16)
    assert 0 < m["page_hit_rate"] < 1 and 0 < m["reused_prompt_fraction"] < 1 and m["evictions"] > 0
    assert 0 < m["peak_bytes_resident"] <= m["pool_bytes"] and not o.memory
    ts = m["timeseries"]
    assert set(ts) == {"xlabel", "x", "series", "title"} and isinstance(ts["xlabel"], str)
    assert "page 16" in ts["title"] and 10 < len(ts["x"]) <= 200 and ts["x"] == sorted(ts["x"])
    assert m["rejected"] + m["preempted"] > 0  # the half-size pool turns requests away ...
    assert ts["x"][-1] == m["events"]  # ... and still every event has its point; the last one is kept
    assert set(ts["series"]) >= {"hit rate %", "pool in use %", "allocations that evicted %"}
    for ys in ts["series"].values():
        assert len(ys) == len(ts["x"]) and all(isinstance(y, float) and 0 <= y <= 100 for y in ys)
    assert ts["series"]["pool in use %"][-1] == 0.0  # every request finished


def test_cache_trace_page_size_changes_the_answer():
    small = run("cache_trace", {**SHAPE, "page_size": 16}, TRACE_CONFIG).metrics
    big = run("cache_trace", {**SHAPE, "page_size": 128}, TRACE_CONFIG).metrics
    assert small["pool_bytes"] == big["pool_bytes"]  # the same tokens' worth of memory
    assert small["reused_prompt_fraction"] > big["reused_prompt_fraction"]  # finer pages share more
    assert small["mean_fragmentation_pct"] < big["mean_fragmentation_pct"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_flash_mla_without_gpu_is_skipped_with_the_reason():
    outcome = run("flash_mla", {**SHAPE, "page_size": 64})
    assert outcome.status == "skipped" and "needs a CUDA GPU" in outcome.error


def test_cost_uses_the_shape_seqlens():
    shape = {**SHAPE, "dist": "uniform", "seqlen": 300, "batch": 7}
    lens = sample_seqlens("uniform", 7, 300, 16, seed=0)
    c = FAMILY.cost(shape, "bfloat16")
    assert (
        c.bytes == mla_decode_cost(lens, h_q=2, s_q=2).bytes
        and c.flops == mla_decode_cost(lens, h_q=2, s_q=2).flops
    )


@pytest.mark.parametrize(
    ("backend", "shape", "config", "dtype", "match"),
    [
        ("torch_ref", {k: v for k, v in SHAPE.items() if k != "h_q"}, {}, "bfloat16", "missing h_q"),
        ("torch_ref", {**SHAPE, "heads": 4}, {}, "bfloat16", r"shape\.heads is not"),
        ("torch_ref", {**SHAPE, "batch": 0}, {}, "bfloat16", r"shape\.batch"),
        ("torch_ref", {**SHAPE, "seqlen": "long"}, {}, "bfloat16", r"shape\.seqlen"),
        ("torch_ref", {**SHAPE, "s_q": 17}, {}, "bfloat16", r"shape\.s_q"),
        ("torch_ref", {**SHAPE, "page_size": 0}, {}, "bfloat16", r"shape\.page_size"),
        ("torch_ref", {**SHAPE, "page_size": 1025}, {}, "bfloat16", r"shape\.page_size"),
        ("torch_ref", {**SHAPE, "kv_dtype": "int8"}, {}, "bfloat16", r"shape\.kv_dtype"),
        ("torch_ref", {**SHAPE, "dist": "zipf"}, {}, "bfloat16", r"shape\.dist"),
        (
            "torch_ref",
            {**SHAPE, "dist": "boundary", "seqlen": 16},
            {},
            "bfloat16",
            r"shape\.seqlen.*boundary",
        ),
        ("torch_ref", {**SHAPE, "shared_prefix": 21}, {}, "bfloat16", r"shape\.shared_prefix"),
        ("torch_ref", SHAPE, {}, "float32", "dtype must be bfloat16"),
        ("torch_ref", SHAPE, {"num_splits": 2}, "bfloat16", r"config\.num_splits does not apply.*no config"),
        ("triton", SHAPE, {"num_splits": 0}, "bfloat16", r"config\.num_splits must be"),
        ("triton", SHAPE, {"num_splits": "many"}, "bfloat16", r"config\.num_splits must be"),
        ("triton", SHAPE, {"_overread": -1}, "bfloat16", r"config\._overread"),
        ("triton", SHAPE, {"block_k": 32}, "bfloat16", r"config\.block_k does not apply"),
        ("flash_mla", SHAPE, {}, "bfloat16", r"shape\.page_size must be 64 for flash_mla"),
        (
            "flash_mla",
            {**SHAPE, "page_size": 64, "kv_dtype": "fp8"},
            {},
            "bfloat16",
            r"shape\.kv_dtype must be bf16",
        ),
        (
            "cache_trace",
            SHAPE,
            {"num_splits": 2},
            "bfloat16",
            r"config\.num_splits does not apply to cache_trace",
        ),
        ("cache_trace", SHAPE, {"pool": 0}, "bfloat16", r"config\.pool"),
        ("cache_trace", SHAPE, {"turns": 1.5}, "bfloat16", r"config\.turns"),
        ("cache_trace", SHAPE, {"seed": -1}, "bfloat16", r"config\.seed"),
        ("sglang", SHAPE, {}, "bfloat16", "unknown paged_mla backend"),
    ],
)
def test_validate_names_the_bad_field(backend, shape, config, dtype, match):
    with pytest.raises(ValueError, match=match):
        FAMILY.validate(shape, config, dtype, backend)


def test_cpu_spec_validates():
    spec = load_spec(SPECS / "paged_mla_cpu.yaml")
    trials = spec.trials()
    assert spec.family == "paged_mla" and spec.baseline == "torch_ref"
    assert {t.backend for t in trials} == {"torch_ref", "triton", "cache_trace"}
    assert {t.shape["page_size"] for t in trials} == {16, 64} and {t.shape["kv_dtype"] for t in trials} == {
        "bf16",
        "fp8",
    }
    assert {t.shape["s_q"] for t in trials} == {1, 2} and len(trials) <= 20


def test_gpu_spec_validates_at_flashmla_shapes():
    spec = load_spec(SPECS / "paged_mla.yaml")
    trials = spec.trials()
    shapes = [t.shape for t in trials]
    assert {s["batch"] for s in shapes} == {64, 128} and {s["seqlen"] for s in shapes} == {4096, 8192, 16384}
    assert {s["page_size"] for s in shapes} == {16, 32, 64, 128} and {s["h_q"] for s in shapes} >= {16, 128}
    assert {s["s_q"] for s in shapes} == {1, 2}
    assert {s["kv_dtype"] for s in shapes} == {"bf16", "fp8", "fp8_flashmla"}
    assert {t.config.get("num_splits") for t in trials if t.backend == "triton"} >= {"auto", 1}
    assert any(t.backend == "cache_trace" for t in trials)


def test_roofline_bytes_are_the_distinct_bytes_hbm_moves():
    """Issue 30: a shared prefix was counted once per sequence, so hbm_fraction could exceed what HBM
    delivered, and the fp32 split partials were not counted. GB/s keeps FlashMLA's convention (every
    sequence's KV); the roofline and the HBM fraction use the distinct bytes (the prefix once, the
    partials added per trial); both figures are reported where they differ."""
    from kernels.base import Cost, derive_rates
    from kernels.common.mla.cost import partial_bytes
    from kernels.common.mla.layout import kv_bytes_per_token
    from kernels.hardware import DeviceLimits

    lens = [1000, 1000, 600, 100]
    plain = mla_decode_cost(lens, h_q=16)
    shared = mla_decode_cost(lens, h_q=16, shared_prefix=512, page_size=64)
    assert shared.bytes == plain.bytes and plain.hbm_bytes == plain.bytes  # FlashMLA's GB/s unchanged
    # the prefix's 8 full pages are stored once: the 2nd and 3rd sequences re-read them; the 4th (100
    # tokens) holds one full prefix page, re-read too; its 36 tokens past it are its own
    assert plain.bytes - shared.hbm_bytes == (512 + 512 + 64) * kv_bytes_per_token("bf16", 576)
    limits = DeviceLimits("x", 1000.0, {"bf16": 1000.0}, sms=1, smem_per_sm_kb=1, smem_per_block_kb=1,
                          l2_mb=1)  # fmt: skip
    rates = derive_rates(shared, 1e6, limits)
    assert rates.gbps == pytest.approx(shared.bytes / 1e-3 / 1e9)
    assert rates.hbm_gbps == pytest.approx(shared.hbm_bytes / 1e-3 / 1e9)
    assert rates.bandwidth_fraction == pytest.approx(rates.hbm_gbps / 1000.0)  # never above what HBM moved
    assert derive_rates(plain, 1e6, limits).hbm_gbps is None  # the same figure: reported once
    assert partial_bytes(chunks=10, rows=16, d_v=512) == 2 * 10 * 16 * 513 * 4
    undefined = derive_rates(Cost(1.0, 1.0, 1.0), 0.0)
    assert (undefined.seconds, undefined.tflops, undefined.gbps) == (None, None, None)  # never NaN
