"""The harness's recheck after timing (kernels.harness.stale_output, issue 45) in the attention family: q,
k, v and the top-k indices (with SDPA's mask built from them) are refilled in place from a fresh seed; a
decode step's q and new-token rows, checked against the exact attention over what the step read. The
recheck runs in every mode for every backend, an honest one stays `ok` and a call that returns its first
output forever is `invalid`."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest

from kernels import harness
from kernels.attention.case import FAMILY
from kernels.base import TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from testkit.kernels.stale import watch

POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=5, min_time_s=0, seeds=2)
TILE = {"block_m": 16, "block_n": 16}
SHAPES = {
    mode: {"mode": mode, "batch": batch, "s_q": s_q, "s_k": s_k, "h_q": 2, **more}
    for mode, batch, s_q, s_k, more in [
        ("prefill", 1, 16, 16, {"h_kv": 1, "d": 16}),
        ("decode", 2, 1, 24, {"d": 16, "seqlens": "uniform"}),
        ("mla_decode", 2, 1, 12, {}),
        ("sparse_prefill", 1, 8, 16, {"d": 16, "topk": 8}),
        ("sparse_decode", 2, 1, 20, {"d": 16, "topk": 4}),
        ("decode_step", 2, 1, 20, {"page_size": 16}),
    ]
}


def _run(backend: str, mode: str):
    config = TILE if backend == "triton" else {}
    return FAMILY.run(TrialRequest("attention", backend, SHAPES[mode], config, "bfloat16", policy=POLICY))


@pytest.mark.parametrize("mode", sorted(SHAPES))
@pytest.mark.parametrize("backend", ["torch_ref", "sdpa", "triton"])
def test_honest_backends_are_rechecked_and_stay_ok(monkeypatch, backend, mode):
    seen = watch(monkeypatch, harness)
    out = _run(backend, mode)
    assert out.status == TrialStatus.OK, out.error or out.correctness.get("message")
    assert seen.rechecked(2), seen.checked  # seed 2's check ran: the recheck was not skipped
    assert seen.inputs[2] == seen.inputs[1] and seen.inputs[1]


@pytest.mark.parametrize(
    ("backend", "mode"), [("triton", "prefill"), ("sdpa", "sparse_decode"), ("triton", "decode_step")]
)
def test_a_call_returning_its_first_output_forever_is_stale(monkeypatch, backend, mode):
    seen = watch(monkeypatch, harness, cached=True)
    out = _run(backend, mode)
    assert out.status == TrialStatus.INVALID and "stale output" in out.error, out.error
    assert out.correctness["passed"] and seen.rechecked(2)
