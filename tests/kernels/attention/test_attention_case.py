"""The attention family as the farm calls it: shape validation, cost, run() metrics, the decode step,
and the specs."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from pathlib import Path

import pytest
import torch

from jobs.spec.sweep import load_spec
from kernels.attention.case import FAMILY
from kernels.attention.cost import visible_pairs
from kernels.attention.decode_step import DecodeStepper, reference_attend, triton_attend
from kernels.base import TrialRequest
from kernels.common.mla.check import check_decode
from kernels.measure.policy import MeasurePolicy
from kernels.registry import get_family
from testkit.kernels.broken import off_by_one_causal

SPECS = Path(__file__).resolve().parents[3] / "jobs" / "specs"
FAST = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=2, max_time_s=30, min_time_s=0, seeds=1)
TILE = {"block_m": 16, "block_n": 16}


def _req(backend: str, shape: dict, config: dict | None = None, dtype: str = "bfloat16") -> TrialRequest:
    return TrialRequest("attention", backend, shape, config or {}, dtype, policy=FAST)


def test_registry_serves_the_family():
    assert get_family("attention") is FAMILY
    assert set(FAMILY.backends) == {"sdpa", "torch_ref", "triton"}


@pytest.mark.parametrize(
    "shape,config,backend,needle",
    [
        ({"mode": "prefill", "batch": 1, "s_q": 4, "h_q": 2}, {}, "triton", "s_k"),
        ({"mode": "bogus", "batch": 1, "s_q": 4, "s_k": 4, "h_q": 2}, {}, "triton", "shape.mode"),
        ({"mode": "decode", "batch": 0, "s_q": 1, "s_k": 4, "h_q": 2}, {}, "triton", "shape.batch"),
        ({"mode": "decode", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 6, "h_kv": 4}, {}, "triton", "multiple"),
        ({"mode": "decode", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 2, "topk": 4}, {}, "triton", "topk"),
        ({"mode": "sparse_decode", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 2}, {}, "triton", "topk"),
        ({"mode": "mla_decode", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 2, "d": 128}, {}, "triton", "MLA"),
        ({"mode": "decode_step", "batch": 1, "s_q": 2, "s_k": 4, "h_q": 2}, {}, "triton", "s_q"),
        ({"mode": "prefill", "batch": 1, "s_q": 4, "s_k": 4, "h_q": 2, "x": 1}, {}, "triton", "unknown"),
        (
            {"mode": "prefill", "batch": 1, "s_q": 4, "s_k": 4, "h_q": 2},
            {"num_splits": 2},
            "triton",
            "num_splits",
        ),
        (
            {"mode": "prefill", "batch": 1, "s_q": 4, "s_k": 4, "h_q": 2},
            {"block_m": 24},
            "triton",
            "power of two",
        ),
        (
            {"mode": "prefill", "batch": 1, "s_q": 4, "s_k": 4, "h_q": 2},
            {"block_m": 16},
            "torch_ref",
            "block_m",
        ),
        (  # the paged cache takes pages of 1 to 1024 tokens, as paged_mla's shapes (issue 43)
            {"mode": "decode_step", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 2, "page_size": 2048},
            {},
            "torch_ref",
            "page_size must be at most 1024",
        ),
    ],
)
def test_validate_names_the_bad_field(shape, config, backend, needle):
    with pytest.raises(ValueError, match=needle):
        FAMILY.validate(shape, config, "bfloat16", backend)


def test_validate_refuses_fp32_for_the_paged_step_and_fp8_everywhere():
    step = {"mode": "decode_step", "batch": 1, "s_q": 1, "s_k": 4, "h_q": 2}
    with pytest.raises(ValueError, match="decode_step"):
        FAMILY.validate(step, {}, "float32", "triton")
    with pytest.raises(ValueError, match="dtype"):
        FAMILY.validate({**step, "mode": "decode"}, {}, "float8_e4m3fn", "triton")


def test_cost_counts_causal_pairs_and_shared_latent_kv_once():
    assert visible_pairs(5, 5) == 15 and visible_pairs(1, 9) == 9 and visible_pairs(4, 2) == 3
    prefill = FAMILY.cost({"mode": "prefill", "batch": 1, "s_q": 8, "s_k": 8, "h_q": 2, "d": 16}, "bfloat16")
    assert prefill.flops == 2 * 2 * (16 + 16) * 36
    mla = FAMILY.cost({"mode": "mla_decode", "batch": 2, "s_q": 1, "s_k": 10, "h_q": 4}, "bfloat16")
    kv = 2 * 10 * 576 * 2  # V inside K: not counted twice
    assert mla.bytes == kv + 2 * 4 * (576 * 2 + 512 * 2 + 4)
    assert mla.flops == 2 * 4 * (576 + 512) * 20


@pytest.mark.parametrize(
    "backend,shape,config",
    [
        ("triton", {"mode": "prefill", "batch": 1, "s_q": 20, "s_k": 20, "h_q": 2, "h_kv": 1, "d": 32}, TILE),
        ("triton", {"mode": "decode", "batch": 2, "s_q": 1, "s_k": 30, "h_q": 4, "h_kv": 2, "d": 32,
                    "seqlens": "uniform"}, {**TILE, "num_splits": 2}),
        ("triton", {"mode": "sparse_decode", "batch": 2, "s_q": 1, "s_k": 30, "h_q": 4, "h_kv": 1, "d": 32,
                    "topk": 8}, TILE),
        ("torch_ref", {"mode": "mla_decode", "batch": 2, "s_q": 1, "s_k": 12, "h_q": 4}, {}),
    ],
)  # fmt: skip
def test_run_returns_correct_metrics(backend, shape, config):
    out = FAMILY.run(_req(backend, shape, config))
    assert out.status == "ok", out.correctness["message"]
    m, c = out.metrics, out.correctness
    assert c["passed"] and c["method"] == "flashmla" and c["lse"]["passed"]
    assert m["mode"] == shape["mode"]
    for key in ("latency_us", "tflops", "gbps", "max_abs_err", "max_rel_err", "cos_diff", "lse_max_abs_err"):
        assert isinstance(m[key], float) and m[key] >= 0, key
    assert m["latency_us"] == pytest.approx(out.summary.median / 1e3)
    assert m["timing"].startswith("cpu")
    assert out.timer == "cpu_perf_counter" and len(out.samples_ns) == 2
    assert not out.resources["collected"]
    if shape["mode"] != "prefill":
        assert m["tokens"] == shape["batch"] * shape["s_q"]
        assert m["latency_per_token_us"] == pytest.approx(m["latency_us"] / m["tokens"])
    else:
        assert "latency_per_token_us" not in m


def test_decode_step_appends_rewinds_and_matches_the_paged_reference():
    stepper = DecodeStepper(2, 62, 4, page_size=16, window=3, seed=1)
    ref = reference_attend(stepper.softmax_scale)
    tri = triton_attend(stepper.softmax_scale, block_n=16)
    lens = []
    for _ in range(4):
        out, lse = stepper.step(tri)
        lens.append(stepper.seqlens)
    assert lens == [[63, 63], [64, 64], [65, 65], [63, 63]]  # the 4th step rewound to the prompt first
    assert stepper.rewinds == 1
    assert stepper.cache.stats().hits == 2 * 3  # the prompt's 3 full pages per sequence came back as hits
    want = ref(stepper.last.q, stepper.last.tensors)
    assert check_decode(out, lse, *want).passed


def test_decode_step_trial_reports_one_number_for_append_plus_attention():
    shape = {"mode": "decode_step", "batch": 2, "s_q": 1, "s_k": 20, "h_q": 4, "page_size": 16}
    out = FAMILY.run(_req("triton", shape, {"block_n": 16}))
    assert out.status == "ok", out.correctness["message"]
    assert out.metrics["tokens"] == 2 and out.metrics["window"] == 64
    assert out.metrics["latency_per_token_us"] == pytest.approx(out.metrics["latency_us"] / 2)


def test_broken_kernel_makes_the_trial_incorrect(monkeypatch):
    from kernels.attention import triton_prefill

    real = triton_prefill.flash_attention_triton
    monkeypatch.setattr(triton_prefill, "flash_attention_triton", off_by_one_causal(real))
    shape = {"mode": "prefill", "batch": 1, "s_q": 20, "s_k": 20, "h_q": 2, "d": 16}
    out = FAMILY.run(_req("triton", shape, TILE))
    assert out.status == "incorrect" and not out.correctness["passed"]
    assert out.correctness["mismatches"] > 0


def test_specs_validate():
    cpu = load_spec(SPECS / "attention_cpu.yaml")
    assert cpu.family == "attention" and cpu.baseline == "torch_ref"
    assert {t.shape["mode"] for t in cpu.trials()} >= {"prefill", "decode", "sparse_decode", "mla_decode"}
    gpu = load_spec(SPECS / "attention.yaml")
    modes = {t.shape["mode"] for t in gpu.trials()}
    assert modes == {"prefill", "decode", "mla_decode", "sparse_prefill", "sparse_decode", "decode_step"}
    for mode in ("decode", "mla_decode", "decode_step"):
        batches = {t.shape["batch"] for t in gpu.trials() if t.shape["mode"] == mode and t.shape["s_q"] == 1}
        assert {1, 256} <= batches and len(batches) >= 8, mode


def test_tensor_inputs_stay_on_the_requested_device():
    from kernels.attention.case import prepare
    from kernels.attention.shapes import parse_shape

    s = parse_shape({"mode": "decode", "batch": 1, "s_q": 1, "s_k": 8, "h_q": 2, "d": 16})
    p = prepare(s, "torch_ref", {}, torch.float32, 0, torch.device("cpu"))
    out, lse = p.run(None)
    assert out.device.type == "cpu" and lse.dtype == torch.float32
