"""measure() on the CPU for real; memory of a 64 MB allocation; the GPU-only paths are skipped on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from kernels.measure import MeasurePolicy, measure
from kernels.measure.memory import peak_memory

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (GPU-only timer path)")

FAST = MeasurePolicy(warmup_ms=5, min_samples=10, max_samples=200, max_time_s=2.0, min_time_s=0.001)


def test_cpu_measure_of_a_small_torch_op() -> None:
    a = torch.randn(64, 64)
    m = measure(lambda: a @ a, FAST)
    assert m.timer == "cpu_perf_counter" and m.device == "cpu"
    assert FAST.min_samples <= len(m.samples_ns) <= FAST.max_samples
    assert all(isinstance(s, int) and s > 0 for s in m.samples_ns)
    s = m.summary
    assert s.n == len(m.samples_ns)
    assert s.min <= s.p10 <= s.median <= s.p90 <= s.max
    assert s.min == min(m.samples_ns) and s.max == max(m.samples_ns)
    assert s.iqr >= 0 and s.mad >= 0 and s.cv >= 0
    assert m.stop_reason in {"converged", "noise_plateau", "max_samples", "max_time"}
    assert m.throttled == [False] * len(m.samples_ns)
    assert m.clocks["available"] is False and "CPU" in m.clocks["reason"]
    assert m.warmup_iters >= 1
    d = json.loads(json.dumps(m.to_dict()))
    assert d["samples_ns"] == m.samples_ns and d["timer"] == "cpu_perf_counter"


def test_cpu_measure_respects_the_sample_cap() -> None:
    policy = MeasurePolicy(warmup_ms=0, min_samples=3, max_samples=5, target_rel_stdev=1e-9, noise_stop=False)
    m = measure(lambda: None, policy)
    assert (m.stop_reason, len(m.samples_ns)) == ("max_samples", 5)


def test_measure_rejects_other_devices() -> None:
    with pytest.raises(ValueError, match="cpu"):
        measure(lambda: None, FAST, device="meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_measure_without_a_gpu_says_so() -> None:
    with pytest.raises(RuntimeError, match="GPU"):
        measure(lambda: None, FAST, device="cuda")


def test_cpu_peak_memory_sees_a_64mb_allocation() -> None:
    def alloc() -> torch.Tensor:
        t = torch.empty(16 * 1024 * 1024, dtype=torch.float32)  # 64 MB, pages never touched
        return t.sum() * 0

    r = peak_memory(alloc)
    assert r.method == "torch_profiler_cpu"
    assert 64 * 2**20 <= r.peak_bytes < 80 * 2**20
    assert r.retained_bytes < 2**20  # only the scalar result outlives the call
    json.dumps(r.to_dict())


@needs_gpu
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["cuda_event", "cuda_graph"])
def test_gpu_event_and_graph_timers(mode: str) -> None:
    # events around each call for a call of >= 100 us (a 4096^2 fp32 matmul takes milliseconds)
    n = 4096 if mode == "cuda_event" else 1024
    a = torch.randn(n, n, device="cuda")
    policy = FAST.model_copy(update={"cuda_graph": mode == "cuda_graph"})
    m = measure(lambda: a @ a, policy, device="cuda")
    assert m.timer == mode and len(m.samples_ns) >= policy.min_samples
    props = torch.cuda.get_device_properties(0)
    assert m.l2_flush_bytes is not None and m.l2_flush_bytes >= 2 * props.L2_cache_size
    assert len(m.throttled) == len(m.samples_ns)
    assert "available" in m.clocks


@needs_gpu
@pytest.mark.gpu
def test_gpu_kernel_only_timer() -> None:
    a = torch.randn(1024, 1024, device="cuda")
    policy = MeasurePolicy(warmup_ms=5, max_samples=40, max_time_s=10, min_time_s=0.0, kernel_only=True)
    m = measure(lambda: a @ a, policy, device="cuda", kernel_name="gemm")
    assert m.timer == "cupti" and m.kernel_name == "gemm" and len(m.samples_ns) >= 10


@needs_gpu
@pytest.mark.gpu
def test_gpu_peak_memory() -> None:
    r = peak_memory(lambda: torch.empty(16 * 1024 * 1024, device="cuda"), "cuda")
    assert r.peak_bytes >= 64 * 2**20
