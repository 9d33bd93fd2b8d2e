"""The order of every GPU timing method, on a CPU: kernels.measure.timing runs against the recording fake of
the CUDA layer (testkit.kernels.fake_cuda), whose log holds every flush, event record, launch, capture,
replay and synchronisation, and whose virtual clock advances only with GPU work.

Each method must time exactly the call (or its graph replay), with an L2 flush before every call and
never between the events: a flush moved inside the timed region, a graph captured but the Python callable
timed instead of the replay, or one flush for several back-to-back calls each fail here (issue 30)."""

from __future__ import annotations

import pytest

from kernels.measure.cuda_layer import flush_bytes
from kernels.measure.policy import MeasurePolicy
from kernels.measure.timing import measure
from testkit.kernels.fake_cuda import FakeCuda

LONG_NS, SHORT_NS = 200_000, 20_000  # either side of the 100 us line between events and graph replays


def policy(**kw) -> MeasurePolicy:
    base = {"warmup_ms": 0, "min_samples": 12, "max_samples": 12, "max_time_s": 5, "min_time_s": 0}
    return MeasurePolicy(**(base | kw))


def timed_regions(gpu: FakeCuda, since: int) -> list[list[tuple]]:
    """What was enqueued between each pair of event records after ``since`` (start, ..., end)."""
    regions, current = [], None
    for entry in gpu.log[since:]:
        if entry[0] == "record":
            if current is None:
                current = []
            else:
                regions.append(current)
                current = None
        elif current is not None:
            current.append(entry)
    return regions


def flushed_before_each_region(gpu: FakeCuda, since: int) -> bool:
    """Every start record comes right after a flush."""
    log = gpu.log[since:]
    starts = [i for i, e in enumerate(log) if e[0] == "record"][::2]
    return all(i > 0 and log[i - 1][0] == "flush" for i in starts)


def measured_part(gpu: FakeCuda) -> int:
    """Where the probe's samples start: after the warm-up's synchronisation (or a capture)."""
    marks = [i for i, e in enumerate(gpu.log) if e[0] in ("capture", "sync")]
    return marks[0] + 1 if marks else 0


def test_a_long_call_is_timed_between_events_after_its_own_flush():
    gpu = FakeCuda()
    m = measure(gpu.kernel("k", LONG_NS), policy(), device="cuda:0", cuda=gpu)
    assert m.timer == "cuda_event" and m.device == "cuda:0 (Fake H200)"
    assert m.samples_ns == [LONG_NS] * 12  # the flush (40 us) is not in any sample
    since = measured_part(gpu)
    assert all(region == [("launch", "k")] for region in timed_regions(gpu, since))
    assert flushed_before_each_region(gpu, since)
    assert m.l2_flush_bytes == flush_bytes(gpu, 0) == 2 * gpu.l2


def test_a_short_call_is_timed_as_its_graph_replay():
    gpu = FakeCuda()
    m = measure(gpu.kernel("k", SHORT_NS), policy(), device="cuda:0", cuda=gpu)
    assert m.timer == "cuda_graph" and m.samples_ns == [SHORT_NS] * 12
    since = gpu.log.index(("capture",)) + 2
    regions = timed_regions(gpu, since)
    assert len(regions) == 12 and all(region == [("replay", 1)] for region in regions)  # never the callable
    assert flushed_before_each_region(gpu, since)


def test_a_short_call_that_cannot_be_captured_gets_a_flush_before_every_back_to_back_call():
    gpu = FakeCuda()
    m = measure(gpu.uncapturable("k", SHORT_NS), policy(), device="cuda:0", cuda=gpu)
    assert m.timer == "cuda_event_back_to_back" and "not capturable" in (m.timer_reason or "")
    assert m.samples_ns == [SHORT_NS] * 12  # the mean per call, no flush in it
    since = gpu.log.index(("capture",))
    regions = timed_regions(gpu, since)
    reps = 100_000 // SHORT_NS
    assert len(regions) == 12 * reps and all(region == [("launch", "k")] for region in regions)
    assert flushed_before_each_region(gpu, since)  # every call reads a cold L2, not one call per sample
    between = gpu.ops(since)
    assert between.count("sync") == 12 // policy().gpu_batch + (12 % policy().gpu_batch > 0)


def test_kernel_only_timing_sums_the_kernels_and_never_the_flush():
    gpu = FakeCuda()

    def two_kernels() -> None:
        gpu.kernel("gemm_kernel", 30_000)()
        gpu.kernel("gemm_kernel_epilogue", 5_000)()

    # "k" matches the flush's own kernel name too: the flush's kernels are learnt and left out
    m = measure(two_kernels, policy(kernel_only=True, kernel_name="k"), device="cuda:0", cuda=gpu)
    assert m.timer == "cupti" and m.samples_ns == [35_000] * 12
    profiled = gpu.log[gpu.log.index(("profile",), gpu.log.index(("profile",)) + 1) :]
    assert [e[0] for e in profiled[1:4]] == ["flush", "launch", "launch"]  # a flush before each call


def test_without_flushing_nothing_is_flushed():
    gpu = FakeCuda()
    m = measure(gpu.kernel("k", LONG_NS), policy(flush_l2=False), device="cuda:0", cuda=gpu)
    assert "flush" not in gpu.ops() and m.l2_flush_bytes is None and m.samples_ns == [LONG_NS] * 12


def test_an_event_read_before_a_synchronize_is_an_error_of_the_fake():
    """The fake holds the timing code to CUDA's rule: an event's time exists once the stream synced."""
    gpu = FakeCuda()
    begin, end = gpu.event(), gpu.event()
    begin.record(None)
    gpu.kernel("k", 10)()
    end.record(None)
    with pytest.raises(RuntimeError, match="no synchronize"):
        begin.elapsed_time(end)
    gpu.stream(0).synchronize()
    assert begin.elapsed_time(end) == 10 / 1e6


def test_a_call_that_moves_data_between_host_and_device_is_refused_before_timing():
    """kernels.measure.clean_call: a copy or a wait inside the timed call would stall every sample (on a
    CPU the fake device's tensors live on the host, so the copy shown here is one to another device)."""
    import torch

    gpu = FakeCuda()
    x = torch.ones(4)
    launch = gpu.kernel("k", LONG_NS)

    def copies() -> None:
        x.to("meta")
        launch()

    with pytest.raises(ValueError, match=r"moves data between host and device \(Tensor.to\(meta\)"):
        measure(copies, policy(), device="cuda:0", cuda=gpu)
    assert "record" not in gpu.ops()  # refused before anything was timed
