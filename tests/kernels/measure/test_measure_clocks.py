"""SM clock bookkeeping and the GPU timing method, on the CPU with a scripted clock source; the NVML and
CUDA paths themselves run only where there is a GPU (skipped here with the reason)."""

from __future__ import annotations

import pytest
import torch

from kernels.measure import MeasurePolicy, measure
from kernels.measure.clocks import ClockSampler, ClockSource, is_throttled, nvml_source
from kernels.measure.timing import SHORT_CALL_NS, back_to_back_reps, choose_gpu_timer

needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (NVML and CUDA timers)"
)


def _scripted(mhz: list[float], reasons: int = 0) -> ClockSource:
    readings = iter(mhz)
    return ClockSource(sm_mhz=lambda: next(readings), reasons=lambda: reasons, default_mhz=1980.0)


def test_throttle_is_a_drop_of_more_than_five_percent_from_the_starting_clock():
    # the usual sustained-load drop, 1980 -> ~1600 MHz, is above 0.75 x 1980 = 1485: the old rule missed it
    assert is_throttled(1600, 1980)
    assert not is_throttled(1900, 1980)  # -4%
    assert is_throttled(1880, 1980)  # -5.05%
    assert not is_throttled(1600, None)  # no baseline, no verdict


def test_sampler_records_one_clock_per_batch_and_flags_the_throttled_batches():
    clock = ClockSampler.start(_scripted([1980, 1980, 1900, 1600, 1700], reasons=0x1 | 0x4))
    assert clock.start_mhz == 1980
    assert [clock.sample() for _ in range(4)] == [False, False, True, True]
    d = clock.to_dict()
    assert d["sm_mhz"] == [1980, 1900, 1600, 1700] and d["start_mhz"] == 1980
    assert (d["min_mhz"], d["max_mhz"], d["throttled_batches"]) == (1600, 1980, 2)
    assert d["throttle_max_drop"] == 0.05 and d["default_mhz"] == 1980.0
    assert d["throttle_reasons"] == ["sw_power_cap"]  # gpu_idle is not a throttle


def test_policy_drop_threshold_is_used():
    clock = ClockSampler.start(
        _scripted([2000, 1900]), max_drop=MeasurePolicy(throttle_max_drop=0.02).throttle_max_drop
    )
    assert clock.sample()  # -5% is more than the 2% allowed


def test_unreadable_clocks_say_why_and_flag_nothing():
    def broken() -> float:
        raise OSError("driver gone")

    clock = ClockSampler.start(ClockSource(sm_mhz=broken))
    assert not clock.available and "driver gone" in (clock.reason or "")
    assert clock.sample() is False
    assert clock.to_dict() == {"available": False, "reason": clock.reason}

    readings = iter([1980.0])

    def fails_later() -> float:
        return next(readings)

    clock = ClockSampler.start(ClockSource(sm_mhz=fails_later))
    assert clock.sample() is False and "clock read failed" in (clock.reason or "")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without a GPU")
def test_nvml_source_without_a_gpu_gives_the_reason():
    pytest.importorskip("pynvml", reason="nvidia-ml-py is a dependency: `pip install -e .`")
    found = nvml_source(0)
    assert isinstance(found, str) and found


def test_gpu_timer_choice_is_recorded_with_its_reason():
    assert choose_gpu_timer("cuda_event", 250_000.0, None)[0] == "cuda_event"
    timer, why = choose_gpu_timer("cuda_event", 20_000.0, None)
    assert timer == "cuda_graph" and "20.0 us < 100 us" in why
    timer, why = choose_gpu_timer("cuda_event", 20_000.0, "operation not permitted when stream is capturing")
    assert timer == "cuda_event_back_to_back" and "not capturable" in why
    assert choose_gpu_timer("cupti", 5_000.0, None) == ("cupti", "set by the measure policy")
    assert choose_gpu_timer("cuda_graph", 500_000.0, None)[0] == "cuda_graph"
    assert back_to_back_reps(20_000.0) == 5 and back_to_back_reps(SHORT_CALL_NS * 3) == 1


def test_cpu_measurement_records_its_timer_in_the_dict():
    m = measure(lambda: None, MeasurePolicy(warmup_ms=0, min_samples=2, max_samples=2, min_time_s=0))
    assert m.to_dict()["timer"] == "cpu_perf_counter"


@needs_gpu
def test_short_gpu_call_is_timed_by_graph_replay_with_clocks_per_batch():
    x = torch.randn(256, 256, device="cuda")
    policy = MeasurePolicy(warmup_ms=5, min_samples=20, max_samples=40, min_time_s=0, gpu_batch=10)
    m = measure(lambda: x @ x, policy, device="cuda")
    assert m.timer == "cuda_graph" and "< 100 us" in (m.timer_reason or "")
    if m.clocks.get("available"):
        assert m.clocks["start_mhz"] > 0 and len(m.clocks["sm_mhz"]) == -(-len(m.samples_ns) // 10)


@needs_gpu
def test_short_uncapturable_gpu_call_is_timed_back_to_back():
    x = torch.randn(64, device="cuda")

    def with_sync() -> None:
        (x * 2).sum().item()  # a host sync: not capturable

    m = measure(
        with_sync, MeasurePolicy(warmup_ms=0, min_samples=5, max_samples=10, min_time_s=0), device="cuda"
    )
    assert m.timer == "cuda_event_back_to_back", m.timer_reason
