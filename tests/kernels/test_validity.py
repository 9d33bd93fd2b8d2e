"""A measurement the world does not allow is `invalid` (kernels.validity, issue 45): faster than the device
can run the call's cost, or an output that does not follow its inputs. Shown with the adversarial family
the tests register (testkit.kernels.adversarial) beside honest trials, which stay `ok`."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.base import Cost, TrialRequest, TrialStatus
from kernels.hardware import H100
from kernels.measure.policy import MeasurePolicy
from kernels.registry import get_family
from kernels.validity import CPU_MARGIN, GPU_MARGIN, Ceiling, ceiling_for, host_ceiling, physical_violation

POLICY = MeasurePolicy(warmup_ms=0, min_samples=5, max_samples=9, max_time_s=2, seeds=2)
H100_CEILING = Ceiling(H100.name, H100.hbm_gbps, dict(H100.dense_tflops), GPU_MARGIN, "datasheet")


def _run(backend: str, m: int, n: int, k: int, family: str = "adversarial"):
    req = TrialRequest(family, backend, {"m": m, "n": n, "k": k}, {}, "float32", policy=POLICY)
    return get_family(family).run(req)


def test_a_time_below_the_h100_roofline_is_refused_with_its_numbers():
    # 1 GB read takes at least 1e9 / 3.35e12 s = 298.5 us on an H100, whatever the kernel
    cost = Cost(flops=0.0, bytes_read=1e9, bytes_written=0.0)
    least_ns = 1e9 / 3.35e12 * 1e9
    assert physical_violation(cost, 300e3, H100_CEILING, "bf16") is None
    assert physical_violation(cost, least_ns / (1 + GPU_MARGIN) + 1, H100_CEILING, "bf16") is None
    assert physical_violation(cost, least_ns / (1 + GPU_MARGIN) - 1, H100_CEILING, "bf16") is not None
    why = physical_violation(cost, 200e3, H100_CEILING, "bf16")
    assert why.startswith("faster than the hardware allows: median 200 us for 1000 MB read")
    assert "H100" in why and "3350 GB/s" in why and "298.5 us" in why
    # compute side: 989 TFLOPS bf16, 1979 fp8
    flops = Cost(flops=989e12 * 1e-3, bytes_read=0.0, bytes_written=0.0)  # 1 ms at the bf16 peak
    assert physical_violation(flops, 0.95e6, H100_CEILING, "bf16") is None
    assert "989 TFLOPS bf16" in physical_violation(flops, 0.5e6, H100_CEILING, "bf16")
    assert physical_violation(flops, 0.6e6, H100_CEILING, "fp8") is None


def test_writes_may_drain_from_l2_after_the_timed_region_and_do_not_count():
    written = Cost(flops=0.0, bytes_read=0.0, bytes_written=1e9)
    assert physical_violation(written, 1e3, H100_CEILING, "bf16") is None
    # the read side is capped by the bytes HBM moves, where a family declares them
    shared = Cost(flops=0.0, bytes_read=1e9, bytes_written=0.0, hbm_bytes_moved=1e6)
    assert physical_violation(shared, 1e3, H100_CEILING, "bf16") is None


def test_no_ceiling_or_no_median_judges_nothing():
    cost = Cost(flops=1e15, bytes_read=1e12, bytes_written=0.0)
    assert physical_violation(cost, 1.0, None, "bf16") is None
    assert physical_violation(cost, None, H100_CEILING, "bf16") is None
    assert physical_violation(cost, 0.0, H100_CEILING, "bf16") is None


def test_the_host_ceiling_is_measured_once_and_is_a_plausible_cpu():
    threads = torch.get_num_threads()
    c = ceiling_for(torch.device("cpu"))
    assert c is host_ceiling(threads) and c.source == "measured" and c.margin == CPU_MARGIN
    assert torch.get_num_threads() == threads  # measured on one thread, the setting put back
    assert 1.0 < c.read_gbps < 10_000 and 1e-4 < c.peak_tflops("fp32") < 1_000
    assert math.isfinite(c.least_time_s(Cost(1e9, 1e9, 0.0), "bf16"))


def test_honest_trials_stay_ok():
    for backend, family in (("honest", "adversarial"), ("torch_fp32", "gemm"), ("torch_bf16", "gemm")):
        out = _run(backend, 64, 64, 64, family)
        assert out.status == TrialStatus.OK, (backend, out.error)
        assert out.error is None


@pytest.mark.parametrize("backend", ["cached", "replay"])
def test_a_result_cached_or_replayed_is_a_stale_output(backend):
    out = _run(backend, 8, 16, 8)  # small: too slow to break the host's ceiling, caught by the recheck
    assert out.status == TrialStatus.INVALID
    assert out.error.startswith("stale output: with its inputs refilled in place from seed 2"), out.error
    assert out.correctness["passed"] is True  # every seed checked before timing passed
    assert not out.status.measured and out.status.failed


@pytest.fixture
def one_thread():
    """torch on one thread, as the farm's CPU workers run it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_work_handed_to_another_thread_is_outside_the_timed_thread(one_thread):
    out = _run("threaded", 256, 256, 256)
    assert out.status == TrialStatus.INVALID and out.correctness["passed"] is True
    # (on a loaded host the level can also fall below the host's ceiling: the waits for the helper are
    # spent off the core; either way the trial is invalid and this reason is given)
    assert "work outside the timed thread: other threads of the process spent" in out.error, out.error
    clocks = out.summary.clocks
    assert clocks["other_threads_cpu_s"] > 0.1 * clocks["loop_wall_s"] and clocks["torch_threads"] == 1
    honest = _run("honest", 256, 256, 256)
    assert honest.status == TrialStatus.OK, honest.error
    assert honest.summary.clocks["other_threads_cpu_s"] < 0.25 * honest.summary.clocks["loop_wall_s"]


def test_with_several_torch_threads_other_threads_judge_nothing():
    from kernels.validity import handed_off

    clocks = {"other_threads_cpu_s": 1.0, "thread_cpu_s": 0.1, "loop_wall_s": 1.1, "torch_threads": 2}
    one = {**clocks, "torch_threads": 1}
    assert handed_off(clocks) is None
    assert handed_off(one) is not None
    assert handed_off({**one, "other_threads_cpu_s": 0.0015}) is None  # below the floor
    # a call that sleeps: a runtime's threads busy now and then beside it is not work handed off
    assert handed_off({**one, "other_threads_cpu_s": 0.05, "thread_cpu_s": 0.001}) is None


def test_less_work_once_the_checks_are_past_is_seen_after_timing():
    out = _run("lazy", 16, 16, 16)
    assert out.status == TrialStatus.INVALID and out.correctness["passed"] is True
    assert out.error.startswith("stale output"), out.error


def test_work_done_before_the_timed_call_is_faster_than_the_host():
    # 2 x 512^3 FLOP returned in well under a microsecond: far past the measured matmul ceiling
    out = _run("cached", 512, 512, 512)
    assert out.status == TrialStatus.INVALID
    assert "faster than the hardware allows" in out.error and "stale output" in out.error
    assert "this host's CPU" in out.error


def test_an_incorrect_trial_stays_incorrect():
    req = TrialRequest(
        "gemm", "torch_fp32", {"m": 8, "n": 8, "k": 8}, {"_perturb": 1.0}, "float32", policy=POLICY
    )
    assert get_family("gemm").run(req).status == TrialStatus.INCORRECT


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("backend", ["side_stream", "persisting_l2"])
def test_the_gpu_only_tricks_are_skipped_on_a_cpu_with_the_reason(backend):
    out = _run(backend, 8, 8, 8)
    assert out.status == TrialStatus.SKIPPED and "needs a CUDA GPU" in out.error
