"""The harness's recheck after timing (kernels.harness.stale_output, issue 45) in the FP8 GEMM family: every
backend declares the tensors its call reads, so the recheck runs (it is not skipped), an honest backend
stays `ok` and a call that returns its first output forever is `invalid`."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from types import SimpleNamespace

import pytest
import torch

from kernels.base import TrialRequest, TrialStatus
from kernels.fp8_gemm import case, deep_gemm_adapter
from kernels.fp8_gemm.inputs import build_inputs
from kernels.fp8_gemm.reference import gemm_dequant_fp32
from kernels.measure.policy import MeasurePolicy
from testkit.kernels.stale import watch

POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=5, min_time_s=0, seeds=2)
SHAPE = {"m": 16, "n": 32, "k": 128}
TILE = {"block_m": 16, "block_n": 32, "block_k": 64, "group_m": 1, "num_warps": 4, "num_stages": 1}


def _run(backend: str, shape: dict = SHAPE, config: dict | None = None):
    req = TrialRequest("fp8_gemm", backend, shape, config or {}, "float8_e4m3fn", policy=POLICY)
    return case.FAMILY.run(req)


@pytest.mark.parametrize(
    ("backend", "shape", "config"),
    [
        ("torch_ref", SHAPE, {}),
        ("torch_bf16", SHAPE, {}),
        ("triton", SHAPE, TILE),
        ("triton", {"m": 8, "n": 40, "k": 96, "scale_group": 64}, TILE),
    ],
)
def test_honest_backends_are_rechecked_and_stay_ok(monkeypatch, backend, shape, config):
    seen = watch(monkeypatch, case)
    out = _run(backend, shape, config)
    assert out.status == TrialStatus.OK, out.error or out.correctness.get("message")
    assert seen.rechecked(2), seen.checked  # seed 2's check ran: the recheck was not skipped
    assert seen.inputs[2] == seen.inputs[1] and seen.inputs[1]


@pytest.mark.parametrize(("backend", "config"), [("torch_ref", {}), ("triton", TILE)])
def test_a_call_returning_its_first_output_forever_is_stale(monkeypatch, backend, config):
    seen = watch(monkeypatch, case, cached=True)
    out = _run(backend, SHAPE, config)
    assert out.status == TrialStatus.INVALID and "stale output" in out.error, out.error
    assert out.correctness["passed"] and seen.rechecked(2)


def test_deep_gemm_declares_the_scales_it_laid_out(monkeypatch):
    # DeepGEMM needs a Hopper GPU: a stand-in of its entry point computes from what it is handed
    def fp8_gemm_nt(a_pair, b_pair, out):
        out.copy_(gemm_dequant_fp32(*a_pair, *b_pair))

    monkeypatch.setattr(deep_gemm_adapter, "load", lambda: SimpleNamespace(fp8_gemm_nt=fp8_gemm_nt))
    build = case.BACKENDS.impl("deep_gemm")
    x, fresh = (build_inputs(8, 16, 256, seed=s) for s in (0, 1))
    call, _, reads = build(x, None)
    _, _, fresh_reads = build(fresh, None)
    assert reads[1] is not x.a_scales and reads[1].stride() != x.a_scales.stride()  # laid out for TMA
    for dst, src in zip(reads, fresh_reads, strict=True):
        dst.copy_(src)
    want = gemm_dequant_fp32(fresh.a_fp8, fresh.a_scales, fresh.b_fp8, fresh.b_scales).to(torch.bfloat16)
    assert torch.equal(call(), want)
