"""What the attention family counts and compares against: the timed call does only the kernel's work,
sparse flops count every valid index slot and sparse bytes the distinct KV rows, the roofline peak is the
trial dtype's, the dense baseline is torch SDPA (with repeated sparse indices counted per slot too), and
every backend (torch_ref included) is checked against an fp64 reference."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kernels.attention import reference as ref
from kernels.attention.case import FAMILY, prepare
from kernels.attention.cost import distinct_positions, sparse_cost, valid_slots
from kernels.attention.inputs import build_dense
from kernels.attention.sdpa import Sdpa
from kernels.attention.shapes import parse_shape
from kernels.base import Cost, TrialRequest, derive_rates
from kernels.hardware import H200, precision_of
from kernels.measure.policy import MeasurePolicy

FAST = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=2, max_time_s=30, min_time_s=0, seeds=1)
SPARSE = {"mode": "sparse_decode", "batch": 2, "s_q": 1, "s_k": 30, "h_q": 4, "h_kv": 1, "d": 32, "topk": 8}
# the shipped spec's sparse prefill point (jobs/specs/attention.yaml)
SPARSE_PREFILL = {"mode": "sparse_prefill", "batch": 1, "s_q": 2048, "s_k": 8192, "h_q": 16, "h_kv": 1,
                  "d": 576, "d_v": 512, "shared_kv": True, "topk": 2048}  # fmt: skip


class _Calls(TorchFunctionMode):
    """Records the name of every torch function called inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


def _req(backend: str, shape: dict, config: dict | None = None, dtype: str = "bfloat16") -> TrialRequest:
    return TrialRequest("attention", backend, shape, config or {}, dtype, policy=FAST)


def test_the_timed_sparse_call_does_not_deduplicate_indices():
    prep = prepare(parse_shape(SPARSE), "triton", {"block_m": 16, "block_n": 16}, torch.bfloat16, 0,
                   torch.device("cpu"))  # fmt: skip
    with _Calls() as calls:
        prep.run(None)
    assert calls.names, "the mode saw no torch call at all: it cannot tell a sort from none"
    assert "sort" not in calls.names, calls.names


def test_sparse_bytes_count_each_distinct_kv_row_once():
    indices = torch.tensor([[[3, 5, -1], [5, 3, 7]]], dtype=torch.int32)  # 2 tokens, rows 3, 5, 7
    assert distinct_positions(indices) == 3
    c = sparse_cost(5, distinct=3, batch=1, s_q=2, topk=3, h_q=2, h_kv=1, d=16, d_v=16, elem=2)
    assert c.kv_bytes == 3 * (16 + 16) * 2
    with pytest.raises(ValueError, match="distinct positions"):
        sparse_cost(2, distinct=3, batch=1, s_q=2, topk=3, h_q=2, h_kv=1, d=16, d_v=16, elem=2)


def test_a_repeated_index_costs_flops_per_slot_but_no_bytes():
    indices = torch.tensor([[[3, 3, -1, 12], [3, 5, 5, 5]]], dtype=torch.int32)  # s_k 10: 12 is padding
    assert valid_slots(indices, 10) == 6  # each slot's score is computed, repeats included
    assert distinct_positions(indices, 10) == 2  # rows 3 and 5: a repeat doubles a weight, reads nothing
    c = sparse_cost(6, distinct=2, batch=1, s_q=2, topk=4, h_q=2, h_kv=1, d=16, d_v=16, elem=2)
    assert c.flops == 2 * 2 * 32 * 6 and c.kv_bytes == 2 * 32 * 2


def test_spec_sparse_prefill_bytes_are_bounded_by_the_cache_and_stay_under_the_roofline():
    c = FAMILY.cost(SPARSE_PREFILL, "bfloat16")
    assert c.kv_bytes == 8192 * 576 * 2  # at most every row of the 8k cache once (9.4 MB, not 4.8 GB)
    # a kernel that ran at exactly HBM speed on those bytes and at peak on the flops sits at 100%
    fastest = max(c.bytes / (H200.hbm_gbps * 1e9), c.flops / (H200.dense_tflops["bf16"] * 1e12))
    assert derive_rates(c, fastest * 1e9, H200, "bf16").roofline_fraction == pytest.approx(1.0)


def test_prepared_sparse_cost_counts_the_rows_the_inputs_name():
    prep = prepare(parse_shape(SPARSE), "triton", {}, torch.bfloat16, 0, torch.device("cpu"))
    from kernels.attention.inputs import sparse_indices

    idx = sparse_indices(2, 1, 30, 8, seed=0)
    assert prep.cost.kv_bytes == distinct_positions(idx) * 32 * 2 * 2


def test_float32_trials_use_the_fp32_peak_not_bf16():
    assert precision_of("float32") == "fp32" and precision_of("bfloat16") == "bf16"
    with pytest.raises(ValueError, match="no peak TFLOPS entry for dtype 'int8'"):
        precision_of("int8")
    flop_bound = Cost(flops=67e12, bytes_read=1.0, bytes_written=0.0)  # one second at the fp32 peak
    assert derive_rates(flop_bound, 1e9, H200, precision_of("float32")).roofline_fraction == pytest.approx(
        1.0
    )
    assert H200.dense_tflops["fp32"] < H200.dense_tflops["bf16"] / 10


def test_torch_ref_is_checked_against_fp64_not_against_itself():
    out = FAMILY.run(_req("torch_ref", {"mode": "mla_decode", "batch": 1, "s_q": 1, "s_k": 12, "h_q": 4}))
    assert out.status == "ok", out.correctness["message"]
    # the fp32 answer differs from the fp64 one in its last bits: a self-comparison gives exactly 0
    assert 0 < out.correctness["max_abs_err"] < 1e-5


@pytest.mark.parametrize(
    "shape",
    [
        {"mode": "prefill", "batch": 1, "s_q": 12, "s_k": 12, "h_q": 4, "h_kv": 2, "d": 32},
        {"mode": "prefill", "batch": 1, "s_q": 5, "s_k": 12, "h_q": 2, "d": 32},  # lower-right causal
        {
            "mode": "decode",
            "batch": 2,
            "s_q": 1,
            "s_k": 20,
            "h_q": 4,
            "h_kv": 2,
            "d": 32,
            "seqlens": "uniform",
        },
        {"mode": "mla_decode", "batch": 1, "s_q": 2, "s_k": 12, "h_q": 4},
        SPARSE,
        {"mode": "decode_step", "batch": 2, "s_q": 1, "s_k": 20, "h_q": 4, "page_size": 16},
    ],
)
def test_sdpa_baseline_is_correct_on_every_mode(shape):
    out = FAMILY.run(_req("sdpa", shape))
    assert out.status == "ok", out.correctness["message"]
    assert out.correctness["passed"] and out.correctness["lse"]["method"] == "none"
    assert out.metrics["sdpa_backends"] == "math"  # on a CPU
    assert out.timer == "cpu_perf_counter"


def test_sdpa_lower_right_causal_matches_the_reference():
    x = build_dense(1, 3, 7, 2, 1, 16, 16, dtype=torch.float32, seed=2)
    got, lse = Sdpa.dense(x.q, x.k, x.v, x.softmax_scale, None)()
    want, _ = ref.attention_reference(x.q, x.k, x.v, softmax_scale=x.softmax_scale)
    assert lse is None
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)])  # bf16: ~2 ulps
def test_sdpa_sparse_baseline_counts_a_repeated_index_per_slot(dtype, atol):
    x = build_dense(1, 2, 10, 2, 1, 16, 16, dtype=dtype, seed=3, poison=False)
    repeated = torch.tensor([[[7, 1, 4, 4, 1, -1, 7], [2, 2, 0, -1, 2, 0, 12]]])
    distinct = torch.tensor([[[7, 1, 4, -1], [2, 0, -1, 12]]])
    for idx in (repeated, distinct):
        call = Sdpa.sparse(x.q, x.k, x.v, x.softmax_scale, idx)
        assert (call.mask.dtype == torch.bool) == (idx is distinct)  # an additive log-count mask if repeats
        got, _ = call()
        want, _ = ref.sparse_attention_reference(x.q, x.k, x.v, idx, softmax_scale=x.softmax_scale)
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=atol)


def test_reference_is_fp64_and_torch_ref_path_is_fp32():
    x = build_dense(1, 2, 5, 2, 1, 16, 16, dtype=torch.bfloat16)
    out, lse = ref.attention_reference(x.q, x.k, x.v)
    assert out.dtype == lse.dtype == torch.float64
    out32, _ = ref.attention_reference(x.q, x.k, x.v, dtype=torch.float32)
    assert out32.dtype == torch.float32
