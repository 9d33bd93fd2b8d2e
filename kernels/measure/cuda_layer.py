"""The CUDA calls GPU timing makes, behind one small interface, so the order of a measurement can be
checked on a machine without a GPU (testkit.kernels.fake_cuda records it).

``TorchCuda`` is the real one: torch's streams, events, CUDA graphs, the L2 flush buffer, the device's
name and L2 size, the SM clock (NVML) and kernel records from the torch profiler (CUPTI). The timing
methods themselves (what is flushed, recorded, called and synchronised, in which order) are written once,
in kernels.measure.timing, against this interface."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import torch

from kernels.measure.clocks import ClockSampler

DEFAULT_FLUSH_BYTES = 256 * 1024 * 1024  # when the device does not report its L2 size


class Event(Protocol):
    def record(self, stream: Any) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...  # milliseconds, as torch.cuda.Event


class CudaLayer(Protocol):
    def device(self, index: int) -> contextlib.AbstractContextManager[Any]: ...

    def stream(self, index: int) -> Any: ...  # .synchronize()

    def event(self) -> Event: ...

    def flusher(self, index: int, nbytes: int | None) -> Callable[[], None]: ...

    def capture(self, fn: Callable[[], object], stream: Any) -> Callable[[], object]: ...

    def l2_bytes(self, index: int) -> int: ...

    def device_name(self, index: int) -> str: ...

    def clock(self, index: int, max_drop: float) -> ClockSampler: ...

    def kernel_records(self, run: Callable[[], None], stream: Any) -> list[tuple[int, int, str]]: ...

    def drain_ns(self, index: int) -> int: ...  # device-wide synchronise, after the timing stream's

    def persisting_l2_bytes(self, index: int) -> int | None: ...  # None: the runtime does not say

    def reset_persisting_l2(self, index: int) -> bool: ...  # False: the runtime does not allow it


CUDA_LIMIT_PERSISTING_L2 = 0x06  # cudaLimitPersistingL2CacheSize (cuda_runtime_api.h, CUDA 11+)


@functools.cache
def cudart() -> ctypes.CDLL | None:
    """The CUDA runtime torch loaded (found in this process's maps, whatever its version), or None."""
    try:
        words = Path("/proc/self/maps").read_text().split()
    except OSError:
        return None
    paths = sorted({w for w in words if "/libcudart.so" in w})
    return ctypes.CDLL(paths[0]) if paths else None


class TorchCuda:
    """The CUDA layer of a real GPU, through torch."""

    def device(self, index: int) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.device(index)

    def stream(self, index: int) -> torch.cuda.Stream:
        return torch.cuda.current_stream(index)

    def event(self) -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    def flusher(self, index: int, nbytes: int | None) -> Callable[[], None]:
        """A call that evicts L2 by writing ``nbytes`` (None: a call that does nothing)."""
        if not nbytes:
            return lambda: None
        buf = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{index}")
        return buf.zero_

    def capture(self, fn: Callable[[], object], stream: torch.cuda.Stream) -> Callable[[], object]:
        """A CUDA graph of one call of ``fn``; its replay. Raises when the call cannot be captured (host
        work or a synchronisation inside it)."""
        side = torch.cuda.Stream(device=stream.device)
        side.wait_stream(stream)
        with torch.cuda.stream(side):  # allocations settle outside capture, as torch asks
            fn()
        stream.wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        stream.synchronize()
        return graph.replay  # the bound method keeps the graph alive

    def l2_bytes(self, index: int) -> int:
        return int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0)

    def device_name(self, index: int) -> str:
        return torch.cuda.get_device_name(index)

    def clock(self, index: int, max_drop: float) -> ClockSampler:
        return ClockSampler.open(index, max_drop)

    def kernel_records(
        self, run: Callable[[], None], stream: torch.cuda.Stream
    ) -> list[tuple[int, int, str]]:
        """(start ns, duration ns, name) of every GPU kernel ``run`` launched, from one profiler session."""
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            stream.synchronize()
        return [
            (e.start_ns(), e.duration_ns(), e.name())
            for e in prof.profiler.kineto_results.events()
            if e.device_type() == torch.autograd.DeviceType.CUDA
        ]

    def drain_ns(self, index: int) -> int:
        """How long a device-wide synchronise waits once the timing stream is done: work the call left
        on other streams, which outlives its end event (a few microseconds of host call otherwise)."""
        t0 = time.perf_counter_ns()
        torch.cuda.synchronize(index)
        return time.perf_counter_ns() - t0

    def persisting_l2_bytes(self, index: int) -> int | None:
        """The L2 set aside for persisting accesses (cudaDeviceGetLimit), None where not readable."""
        rt = cudart()
        value = ctypes.c_size_t(0)
        if rt is None or rt.cudaDeviceGetLimit(ctypes.byref(value), CUDA_LIMIT_PERSISTING_L2) != 0:
            return None
        return int(value.value)

    def reset_persisting_l2(self, index: int) -> bool:
        """No L2 set aside for persisting accesses (so no access-policy window can keep lines) and every
        persisting line back to normal (cudaDeviceSetLimit 0, cudaCtxResetPersistingL2Cache); both take
        effect when they return, so the timing calls this between batches, never inside one."""
        rt = cudart()
        if rt is None:
            return False
        return rt.cudaDeviceSetLimit(CUDA_LIMIT_PERSISTING_L2, ctypes.c_size_t(0)) == 0 and (
            rt.cudaCtxResetPersistingL2Cache() == 0
        )


def flush_bytes(cuda: CudaLayer, index: int) -> int:
    """Twice the device's L2 size (the flush buffer must be at least that), 256 MB if it reports none."""
    l2 = cuda.l2_bytes(index)
    return 2 * l2 if l2 > 0 else DEFAULT_FLUSH_BYTES
