"""What a GPU call does outside its timed region (kernels.measure.outside, issue 45), on the recording fake
of the CUDA layer: work left on another stream after the end events, and L2 set aside for persisting
accesses. An honest kernel leaves nothing behind; each trick is counted and kernels.validity names it."""

from __future__ import annotations

from kernels.measure.policy import MeasurePolicy
from kernels.measure.timing import measure
from kernels.validity import DRAIN_FLOOR_NS, outside_timed_region
from testkit.kernels.fake_cuda import FakeCuda

LONG_NS = 200_000


def policy() -> MeasurePolicy:
    return MeasurePolicy(warmup_ms=0, min_samples=12, max_samples=12, max_time_s=5, min_time_s=0)


def test_an_honest_kernel_leaves_nothing_outside_its_events():
    gpu = FakeCuda()
    m = measure(gpu.kernel("k", LONG_NS), policy(), device="cuda:0", cuda=gpu)
    assert m.clocks["drain_ns"] and set(m.clocks["drain_ns"]) == {0}
    assert m.clocks["persisting_l2_set_batches"] == 0 and m.clocks["persisting_l2_reset"] is True
    assert outside_timed_region(m.clocks) is None


def test_work_on_a_side_stream_outlives_the_end_events():
    gpu = FakeCuda()
    m = measure(gpu.on_side_stream("k", LONG_NS), policy(), device="cuda:0", cuda=gpu)
    assert max(m.samples_ns) == 0  # its events bound nothing: the launch returns at once
    assert all(d > DRAIN_FLOOR_NS for d in m.clocks["drain_ns"])
    why = outside_timed_region(m.clocks)
    assert why is not None and why.startswith("work outside the timed region: in ")
    assert "after the timing stream's last end event" in why
    # the device-wide wait comes after each batch's stream synchronise, never inside a timed region
    syncs = [i for i, e in enumerate(gpu.log) if e[0] == "device_sync"]
    assert syncs and all(gpu.log[i - 1][0] == "sync" for i in syncs)


def test_a_persisting_l2_window_set_by_the_call_is_counted_and_reset_each_batch():
    gpu = FakeCuda()
    m = measure(gpu.sets_persisting_l2("k", LONG_NS, 30 * 2**20), policy(), device="cuda:0", cuda=gpu)
    assert m.clocks["persisting_l2_set_batches"] >= 1 and m.clocks["persisting_l2_set_bytes"] == 30 * 2**20
    assert "persisting L2 window: the call set 30 MiB of L2 aside" in outside_timed_region(m.clocks)
    assert gpu.persisting_l2 == 0  # left reset for whatever runs next


def test_l2_set_aside_before_timing_is_reset_before_the_first_call_and_recorded():
    gpu = FakeCuda()
    gpu.persisting_l2 = 8 * 2**20  # set when the trial was built, outside the call
    m = measure(gpu.kernel("k", LONG_NS), policy(), device="cuda:0", cuda=gpu)
    first_launch = next(i for i, e in enumerate(gpu.log) if e[0] == "launch")
    assert ("reset_persisting_l2",) in gpu.log[:first_launch]
    assert m.clocks["persisting_l2_before_bytes"] == 8 * 2**20
    assert outside_timed_region(m.clocks) is None  # neutralised before timing: the time is honest


def test_a_wait_now_and_then_or_under_the_floor_judges_nothing():
    spans = [1_000_000] * 4
    assert outside_timed_region({"drain_ns": [DRAIN_FLOOR_NS - 1] * 4, "batch_span_ns": [0] * 4}) is None
    sporadic = {"drain_ns": [500_000, 0, 0, 500_000], "batch_span_ns": spans}  # a preempted host, twice
    assert outside_timed_region(sporadic) is None
    most = {"drain_ns": [500_000, 500_000, 0, 500_000], "batch_span_ns": spans}
    assert "in 3 of 4 batches" in outside_timed_region(most)
    # small against the batch's own time: a long kernel's tail, not work handed off
    assert outside_timed_region({"drain_ns": [40_000_000] * 4, "batch_span_ns": [10**9] * 4}) is None
    assert outside_timed_region({}) is None  # a CPU measurement has none of it
