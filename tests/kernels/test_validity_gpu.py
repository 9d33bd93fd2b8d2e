"""The GPU half of the adversarial family (issue 45; `make gpu-check` runs it): a call that leaves its work
on a second stream, and one that sets a persisting L2 window over its inputs, each end `invalid` with its
reason, while the honest matmul on the same GPU stays `ok`. On a CPU they are skipped with the reason and
their CPU half is tests/kernels/measure/test_measure_outside.py (the same audit on the fake CUDA layer)."""

from __future__ import annotations

import pytest
import torch

from kernels.base import TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from kernels.registry import get_family

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (streams, L2)")

POLICY = MeasurePolicy(warmup_ms=5, min_samples=10, max_samples=30, max_time_s=5, seeds=2)
SHAPE = {"m": 2048, "n": 2048, "k": 2048}  # ~17 GFLOP in fp32: hundreds of microseconds on an H100


def _run(backend: str):
    req = TrialRequest("adversarial", backend, SHAPE, {}, "float32", device="cuda:0", policy=POLICY)
    return get_family("adversarial").run(req)


def test_the_honest_matmul_stays_ok_and_leaves_nothing_behind():
    out = _run("honest")
    assert out.status == TrialStatus.OK, out.error
    assert out.summary.clocks["persisting_l2_set_batches"] == 0


def test_work_left_on_a_side_stream_is_invalid():
    out = _run("side_stream")
    assert out.correctness["passed"] is True  # right answers, read once the device is done
    assert out.status == TrialStatus.INVALID
    assert "work outside the timed region" in out.error or "faster than the hardware" in out.error, out.error


def test_a_persisting_l2_window_set_by_the_call_is_invalid():
    out = _run("persisting_l2")
    assert out.status == TrialStatus.INVALID and out.correctness["passed"] is True
    assert "persisting L2 window" in out.error, out.error
