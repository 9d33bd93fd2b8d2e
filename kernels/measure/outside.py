"""What a GPU call does outside its timed region (issue 45), audited batch by batch beside the events.

- Work on another stream: the events bound the timing stream only, so a call that launches its work on a
  side stream and returns looks as fast as its launch. After each batch the timing stream is synchronised
  (the events are read), then the whole device: the time that second wait takes is work the calls left
  behind their end events (`drain`). With nothing left it is the host call itself, a few microseconds.
  Side work short enough to finish under the next samples' L2 flushes is not seen here, but then the
  events time almost nothing and the call is faster than the hardware allows (kernels.validity).
- A persisting L2 window: an access-policy window with a persisting hit property keeps a call's inputs in
  L2 across the flush (the trick that read 3,530 GB/s on an 864 GB/s GPU, karpathy/llm.c PR 851). Before
  timing, the L2 set aside for persisting accesses is set to 0 and every persisting line reset; after each
  batch it is read again: a call that set it aside itself is counted, and it is reset before the next.

The CUDA calls go through kernels.measure.cuda_layer, so the fake layer exercises all of this on a CPU.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from kernels.measure.cuda_layer import CudaLayer


@dataclass
class OutsideAudit:
    cuda: CudaLayer
    index: int
    persisting_before: int | None  # set aside before the harness reset it (by the call's setup), bytes
    reset_allowed: bool
    spans_ns: list[int] = field(default_factory=list)  # per batch: the events' time of its calls
    drains_ns: list[int] = field(default_factory=list)  # per batch: the device-wide wait after the stream's
    persisting_set: list[int] = field(default_factory=list)  # bytes set aside by the calls, per batch seen

    @classmethod
    def start(cls, cuda: CudaLayer, index: int) -> OutsideAudit:
        before = cuda.persisting_l2_bytes(index)
        return cls(cuda, index, before, cuda.reset_persisting_l2(index))

    def after_batch(self, times_ns: list[int], reps: int = 1) -> None:
        """Called once the batch's events are read (its stream synchronised)."""
        self.drains_ns.append(int(self.cuda.drain_ns(self.index)))
        self.spans_ns.append(int(sum(times_ns) * reps))
        now = self.cuda.persisting_l2_bytes(self.index)
        if now:
            self.persisting_set.append(now)
            self.cuda.reset_persisting_l2(self.index)

    def to_clocks(self) -> dict[str, Any]:
        return {
            "drain_ns": list(self.drains_ns),
            "batch_span_ns": list(self.spans_ns),
            "drain_median_ns": int(statistics.median(self.drains_ns)) if self.drains_ns else None,
            "persisting_l2_before_bytes": self.persisting_before,
            "persisting_l2_reset": self.reset_allowed,
            "persisting_l2_set_bytes": max(self.persisting_set, default=0),
            "persisting_l2_set_batches": len(self.persisting_set),
        }
