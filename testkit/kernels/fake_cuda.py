"""A recording fake of the CUDA layer (kernels.measure.cuda_layer), for timing tests on a machine without a
GPU: every flush, event record, kernel launch, graph capture and replay, and synchronisation is appended
to ``log`` in order, and a virtual GPU clock runs on the launches, so a test can assert the sequence of
each timing method and the times it derives from it.

A timed callable launches its kernels through ``kernel(name, ns)``, which returns that callable; a call
that synchronises the host (``host_sync``) cannot be captured in a graph, as on a real GPU. The clock only
advances with work on the GPU: a flush takes ``flush_ns``, a kernel its ``ns``, so an event pair measures
exactly what was enqueued between its two records."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernels.measure.clocks import ClockSampler

FLUSH_KERNEL = "fake_l2_flush_memset"


@dataclass
class FakeEvent:
    gpu: FakeCuda
    ident: int
    at_ns: int | None = None

    def record(self, stream: Any) -> None:
        self.at_ns = self.gpu.now_ns
        self.gpu.recorded = max(self.gpu.recorded, self.ident)
        self.gpu.log.append(("record", self.ident))

    def elapsed_time(self, end: FakeEvent) -> float:
        if self.at_ns is None or end.at_ns is None:
            raise RuntimeError("elapsed_time of an event that was not recorded")
        if not self.gpu.synced_after(max(self.ident, end.ident)):
            raise RuntimeError("elapsed_time before the events completed (no synchronize)")
        return (end.at_ns - self.at_ns) / 1e6


@dataclass
class FakeStream:
    gpu: FakeCuda

    def synchronize(self) -> None:
        self.gpu.sync()


@dataclass
class FakeCuda:
    flush_ns: int = 40_000
    l2: int = 50 * 1024 * 1024
    name: str = "Fake H200"
    log: list[tuple[Any, ...]] = field(default_factory=list)
    now_ns: int = 0
    capturing: list[tuple[str, int]] | None = None
    records: list[tuple[int, int, str]] | None = None  # kernel records of an open profiler session
    recorded: int = -1  # the newest event recorded
    side_until_ns: int = 0  # when the work queued on a side stream ends (it runs beside the timing stream)
    persisting_l2: int = 0  # bytes of L2 set aside for persisting accesses (cudaLimitPersistingL2CacheSize)
    _events: int = 0
    _synced_upto: int = -1

    # -- what a timed callable does -----------------------------------------------------------------
    def kernel(self, name: str, ns: int) -> Callable[[], None]:
        """A callable that launches one kernel of ``ns`` nanoseconds."""

        def launch() -> None:
            self._run(name, ns)

        return launch

    def uncapturable(self, name: str, ns: int) -> Callable[[], None]:
        """A callable that launches one kernel but does host work no graph can hold (it raises when
        captured, as torch does)."""

        def launch() -> None:
            if self.capturing is not None:
                raise RuntimeError("host work inside the call: not capturable")
            self._run(name, ns)

        return launch

    def on_side_stream(self, name: str, ns: int) -> Callable[[], None]:
        """A callable that queues one kernel of ``ns`` on another stream and returns: the timing stream
        (and its events) never wait for it; a device-wide synchronise does. A graph capture of it fails,
        as CUDA's does for a capture that forks a stream and never joins it back."""

        def launch() -> None:
            if self.capturing is not None:
                raise RuntimeError("operation failed due to a previous error during capture (unjoined)")
            self.log.append(("side_launch", name))
            self.side_until_ns = max(self.side_until_ns, self.now_ns) + ns

        return launch

    def sets_persisting_l2(self, name: str, ns: int, nbytes: int) -> Callable[[], None]:
        """A callable that sets ``nbytes`` of L2 aside for persisting accesses, then launches its kernel."""

        def launch() -> None:
            self.persisting_l2 = nbytes
            self._run(name, ns)

        return launch

    def host_sync(self) -> None:
        """A synchronisation inside a callable (a .item(), a host copy): no graph can hold it."""
        if self.capturing is not None:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.sync()

    def _run(self, name: str, ns: int) -> None:
        if self.capturing is not None:
            self.capturing.append((name, ns))
            self.log.append(("captured", name))
            return
        self.log.append(("launch", name))
        if self.records is not None:
            self.records.append((self.now_ns, ns, name))
        self.now_ns += ns

    def sync(self) -> None:
        self._synced_upto = self.recorded
        self.log.append(("sync",))

    def synced_after(self, ident: int) -> bool:
        return ident <= self._synced_upto

    # -- the CudaLayer interface ---------------------------------------------------------------------
    def device(self, index: int) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def stream(self, index: int) -> FakeStream:
        return FakeStream(self)

    def event(self) -> FakeEvent:
        self._events += 1
        return FakeEvent(self, self._events)

    def flusher(self, index: int, nbytes: int | None) -> Callable[[], None]:
        if not nbytes:
            return lambda: None

        def flush() -> None:
            self.log.append(("flush", nbytes))
            if self.records is not None:
                self.records.append((self.now_ns, self.flush_ns, FLUSH_KERNEL))
            self.now_ns += self.flush_ns

        return flush

    def capture(self, fn: Callable[[], object], stream: Any) -> Callable[[], object]:
        fn()  # the warm-up call on a side stream, as the real layer makes
        self.capturing = []
        self.log.append(("capture",))
        try:
            fn()
            launches = self.capturing
        finally:
            self.capturing = None

        def replay() -> None:
            self.log.append(("replay", len(launches)))
            for name, ns in launches:
                if self.records is not None:
                    self.records.append((self.now_ns, ns, name))
                self.now_ns += ns

        return replay

    def l2_bytes(self, index: int) -> int:
        return self.l2

    def device_name(self, index: int) -> str:
        return self.name

    def clock(self, index: int, max_drop: float) -> ClockSampler:
        return ClockSampler.unavailable("a fake GPU has no clock", max_drop)

    def kernel_records(self, run: Callable[[], None], stream: Any) -> list[tuple[int, int, str]]:
        self.records = []
        self.log.append(("profile",))
        try:
            run()
            self.sync()
            return list(self.records)
        finally:
            self.records = None

    def drain_ns(self, index: int) -> int:
        """The device-wide wait: side-stream work still running when the timing stream is done."""
        left = max(0, self.side_until_ns - self.now_ns)
        self.now_ns += left
        self.log.append(("device_sync", left))
        return left

    def persisting_l2_bytes(self, index: int) -> int | None:
        return self.persisting_l2

    def reset_persisting_l2(self, index: int) -> bool:
        self.persisting_l2 = 0
        self.log.append(("reset_persisting_l2",))
        return True

    # -- reading the log ------------------------------------------------------------------------------
    def ops(self, since: int = 0) -> list[str]:
        """The log's operation names from ``since`` on ("flush", "record", "launch", ...)."""
        return [entry[0] for entry in self.log[since:]]
