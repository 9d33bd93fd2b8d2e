"""The harness's recheck after timing (kernels.harness.stale_output, issue 45) in the paged MLA family: a
decode call's q, pages (with fp8's scales) and block table are refilled in place from a fresh seed, the
lengths (and so the split plan) being the shape's; the recheck runs for every cache type, an honest
backend stays `ok` and a call that returns its first output forever is `invalid`."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import pytest
import torch

from kernels.base import TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from kernels.paged_mla import case
from kernels.registry import get_family
from testkit.kernels.stale import watch

get_family("paged_mla")  # FARM_PLUGINS: testkit.kernels.faults wraps its backends when it is handed out

POLICY = MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=3, max_time_s=5, min_time_s=0, seeds=2)
SHAPE = {"batch": 2, "seqlen": 20, "dist": "uniform", "h_q": 2, "s_q": 2, "page_size": 16, "kv_dtype": "bf16"}


def _run(backend: str, shape: dict, config: dict):
    req = TrialRequest("paged_mla", backend, shape, config, "bfloat16", policy=POLICY)
    return case.FAMILY.run(req)


@pytest.mark.parametrize(
    ("backend", "shape", "config"),
    [
        ("torch_ref", SHAPE, {}),
        ("torch_ref", {**SHAPE, "kv_dtype": "fp8"}, {}),
        ("triton", SHAPE, {"num_splits": 2}),
        ("triton", {**SHAPE, "kv_dtype": "fp8", "s_q": 1, "shared_prefix": 16}, {"num_splits": "auto"}),
        ("triton", {**SHAPE, "kv_dtype": "fp8_flashmla", "s_q": 1}, {}),
    ],
)
def test_honest_backends_are_rechecked_and_stay_ok(monkeypatch, backend, shape, config):
    seen = watch(monkeypatch, case)
    out = _run(backend, shape, config)
    assert out.status == TrialStatus.OK, out.error or out.correctness.get("message")
    assert seen.rechecked(2), seen.checked  # seed 2's check ran: the recheck was not skipped
    assert seen.inputs[2] == seen.inputs[1]
    declared = 4 if shape["kv_dtype"] == "fp8" else 3  # q, pages, block table (and fp8's scales)
    assert len(seen.inputs[1]) == declared and ((2,), torch.int32) not in seen.inputs[1]  # no lengths


@pytest.mark.parametrize(("backend", "config"), [("torch_ref", {}), ("triton", {"num_splits": 2})])
def test_a_call_returning_its_first_output_forever_is_stale(monkeypatch, backend, config):
    seen = watch(monkeypatch, case, cached=True)
    out = _run(backend, SHAPE, config)
    assert out.status == TrialStatus.INVALID and "stale output" in out.error, out.error
    assert out.correctness["passed"] and seen.rechecked(2)


def test_the_layout_a_call_was_built_for_is_the_same_for_every_seed():
    # what the call is built from beside the declared tensors: the lengths (cache_seqlens, the split plan)
    built = [case._inputs(SHAPE, case.shape_seqlens(SHAPE), seed, "cpu", True) for seed in (0, 1)]
    assert torch.equal(built[0].cache_seqlens, built[1].cache_seqlens)
    assert built[0].seqlens == built[1].seqlens
    assert not torch.equal(built[0].block_table, built[1].block_table)  # the page order follows the seed
