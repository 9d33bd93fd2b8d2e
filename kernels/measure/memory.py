"""Peak memory of running a callable once.

On a GPU: torch.cuda.max_memory_allocated after resetting the peak (the caching allocator's view of
tensor memory). On a CPU, tensor allocations do not go through tracemalloc, and RSS only grows when pages
are touched (torch.empty of 64 MB leaves RSS unchanged), so the primary figure comes from the torch
profiler's allocator events (profile_memory=True): the running sum of CPU allocations and frees gives
the peak of tensor bytes. The process's peak-RSS growth (VmHWM, reset through /proc/self/clear_refs where
Linux allows it) is reported alongside as a secondary figure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class MemoryReport:
    peak_bytes: int  # peak of tensor memory allocated while fn ran, above what was allocated before
    retained_bytes: int  # still allocated when fn returned (its outputs), above the level before
    method: str  # "cuda_max_memory_allocated" | "torch_profiler_cpu"
    device: str
    rss_peak_delta_bytes: int | None = None  # CPU only: growth of the process's peak RSS
    working_set_bytes: float | None = None  # from the family's cost model, for comparison

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_memory(
    fn: Callable[[], object], device: str | torch.device = "cpu", *, working_set_bytes: float | None = None
) -> MemoryReport:
    dev = torch.device(device)
    if dev.type == "cuda":
        return _peak_cuda(fn, dev, working_set_bytes)
    if dev.type != "cpu":
        raise ValueError(f"peak_memory() measures 'cpu' or 'cuda', not {dev.type!r}")
    return _peak_cpu(fn, working_set_bytes)


def _peak_cuda(fn: Callable[[], object], dev: torch.device, working_set_bytes: float | None) -> MemoryReport:
    if not torch.cuda.is_available():
        raise RuntimeError("peak_memory(device='cuda') needs a CUDA GPU; none is available here")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    torch.cuda.synchronize(index)
    before = torch.cuda.memory_allocated(index)
    torch.cuda.reset_peak_memory_stats(index)
    result = fn()
    torch.cuda.synchronize(index)
    peak = torch.cuda.max_memory_allocated(index)
    retained = torch.cuda.memory_allocated(index)
    del result
    return MemoryReport(
        peak_bytes=int(peak - before),
        retained_bytes=int(max(0, retained - before)),
        method="cuda_max_memory_allocated",
        device=f"cuda:{index}",
        working_set_bytes=working_set_bytes,
    )


def _peak_cpu(fn: Callable[[], object], working_set_bytes: float | None) -> MemoryReport:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        hwm_reset = _reset_peak_rss()  # after the profiler started: its own start-up is not counted
        rss_before = _status_kb("VmRSS")
        result = fn()
        hwm_after = _status_kb("VmHWM")
    del result  # after the profiler stopped: what fn returned counts as retained
    events = sorted(
        (e.start_ns(), int(e.nbytes()))
        for e in prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    level = peak = 0
    for _, nbytes in events:
        level += nbytes
        peak = max(peak, level)
    rss_delta = None
    if hwm_reset and rss_before is not None and hwm_after is not None:
        rss_delta = max(0, (hwm_after - rss_before) * 1024)
    return MemoryReport(
        peak_bytes=int(peak),
        retained_bytes=int(max(0, level)),
        method="torch_profiler_cpu",
        device="cpu",
        rss_peak_delta_bytes=rss_delta,
        working_set_bytes=working_set_bytes,
    )


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to /proc/self/clear_refs); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
