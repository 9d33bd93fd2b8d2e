"""Whether a measured trial can be true: a time the hardware cannot reach is a measurement error, never a
result (issue 45). The harness (kernels.harness) asks after timing, and a trial that fails is stored
`invalid` with the reason, never compared or used as a baseline.

The ceiling of a device is what one call can at most do per second:
- on a GPU of known limits (kernels.hardware), the datasheet: HBM bandwidth and dense peak FLOPS. Only the
  bytes a call *reads* must come from HBM in the timed region (the harness flushes L2 before every sample;
  writes may sit in L2 and drain after the end event), so the least time of a call is
  max(bytes read / bandwidth, FLOPs / peak), the read side capped by the bytes HBM moves (Cost.hbm_bytes).
  Margin 10%: the datasheet peaks are at the boost clock, which a run never exceeds; the margin covers
  the event timer's resolution (~0.5 us) on the calls of a few microseconds it matters for;
- on a CPU, the host measured once per process (a worker lives for many trials): one thread's fastest
  read rate over copies and reductions that fit in the caches, and its fastest matmul, times the torch
  threads the trials run with. Margin 2x: these are measured, not datasheet, ceilings (turbo moves them, a
  hand-written loop may beat torch's copy by a little), and nothing honest the farm runs on a CPU comes
  near them (Triton kernels run in the interpreter, ~200x slower than torch).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kernels.base import Cost
from kernels.hardware import device_limits

GPU_MARGIN = 0.10
CPU_MARGIN = 1.0  # 2x the measured host ceiling


@dataclass(frozen=True)
class Ceiling:
    """What one call on a device can at most do per second, and by how much a time may beat it."""

    name: str
    read_gbps: float
    tflops: dict[str, float]  # per precision key (kernels.hardware.PRECISIONS); "any" where measured
    margin: float
    source: str  # "datasheet" or "measured"

    def peak_tflops(self, precision: str) -> float:
        return self.tflops.get(precision, self.tflops.get("any", max(self.tflops.values())))

    def least_time_s(self, cost: Cost, precision: str) -> float:
        read = min(cost.bytes_read, cost.hbm_bytes)
        return max(read / (self.read_gbps * 1e9), cost.flops / (self.peak_tflops(precision) * 1e12))

    def describe(self, precision: str) -> str:
        return (
            f"{self.name} ({self.source}: {self.read_gbps:.4g} GB/s read, "
            f"{self.peak_tflops(precision):.4g} TFLOPS {precision})"
        )


def ceiling_for(device: torch.device) -> Ceiling | None:
    """The device's ceiling: the datasheet of a known GPU, the measured host for a CPU, None otherwise."""
    if device.type == "cpu":
        return host_ceiling(torch.get_num_threads())
    limits = device_limits(device)
    if limits is None:
        return None
    return Ceiling(limits.name, limits.hbm_gbps, dict(limits.dense_tflops), GPU_MARGIN, "datasheet")


def physical_violation(
    cost: Cost, median_ns: float | None, ceiling: Ceiling | None, precision: str
) -> str | None:
    """Why a call of `cost` timed at `median_ns` cannot be true on `ceiling`'s device, or None."""
    if ceiling is None or not median_ns or median_ns <= 0:
        return None
    least = ceiling.least_time_s(cost, precision)
    seconds = median_ns / 1e9
    if seconds * (1.0 + ceiling.margin) >= least:
        return None
    return (
        f"faster than the hardware allows: median {seconds * 1e6:.4g} us for {cost.bytes_read / 1e6:.4g} MB "
        f"read and {cost.flops / 1e9:.4g} GFLOP, where {ceiling.describe(precision)} needs at least "
        f"{least * 1e6:.4g} us ({least / seconds:.3g}x the median; margin {ceiling.margin:.0%})"
    )


HANDOFF_SHARE = 0.5  # other threads' CPU over the timing thread's, above which work was handed off,
HANDOFF_WALL_SHARE = 0.1  # when it is also this much of the loop's wall time (not a runtime's chatter
HANDOFF_FLOOR_S = 0.002  # beside a call that blocks) and at least this much CPU time


def handed_off(clocks: dict) -> str | None:
    """Why a CPU measurement's calls did work outside the timing thread, or None: with torch on one
    thread (as workers run it), CPU time the process's other threads spent during the timed loop
    (kernels.measure.cpu_share) is work the call gave away, which the timed thread's clock does not own:
    more of it than half the timing thread's own CPU time, and a tenth of the loop's wall time (so a call
    that blocks, a sleep, is not judged by what a runtime's threads do meanwhile). With more torch
    threads, torch itself works on several and nothing is judged."""
    other, own, wall = (clocks.get(k) for k in ("other_threads_cpu_s", "thread_cpu_s", "loop_wall_s"))
    if other is None or own is None or not wall or clocks.get("torch_threads") != 1:
        return None
    if other < HANDOFF_FLOOR_S or other <= HANDOFF_SHARE * own or other <= HANDOFF_WALL_SHARE * wall:
        return None
    return (
        f"work outside the timed thread: other threads of the process spent {other * 1e3:.4g} ms of CPU "
        f"during {wall * 1e3:.4g} ms of timed calls, the timing thread {own * 1e3:.4g} ms (torch runs on "
        "one thread here)"
    )


DRAIN_SHARE = 0.05  # a batch whose device-wide wait, after its stream's, is over this share of its events'
DRAIN_FLOOR_NS = 50_000  # time and this floor (a synchronise's host call and a preempted host thread stay
# under it) outlived its end events; more than half the batches so: the calls leave work behind


def outside_timed_region(clocks: dict) -> str | None:
    """Why a GPU measurement's calls did work its events did not bound (kernels.measure.outside), or None:
    L2 set aside for persisting accesses by the call while it was timed, or work on other streams still
    running after the timing stream finished, in most batches."""
    if clocks.get("persisting_l2_set_batches"):
        return (
            f"persisting L2 window: the call set {clocks['persisting_l2_set_bytes'] / 2**20:.4g} MiB of L2 "
            f"aside for persisting accesses during timing ({clocks['persisting_l2_set_batches']} batch(es)), "
            "which keeps its inputs in L2 across the flush"
        )
    drains, spans = clocks.get("drain_ns") or [], clocks.get("batch_span_ns") or []
    outlived = [
        (d, s) for d, s in zip(drains, spans, strict=False) if d > max(DRAIN_SHARE * s, DRAIN_FLOOR_NS)
    ]
    if not drains or 2 * len(outlived) <= len(drains):
        return None
    left, timed = sum(d for d, _ in outlived), sum(s for _, s in outlived)
    return (
        f"work outside the timed region: in {len(outlived)} of {len(drains)} batches the device was still "
        f"busy after the timing stream's last end event ({left / 1e3:.4g} us after {timed / 1e3:.4g} us of "
        "timed calls): the call launches work on another stream"
    )


# ---- the host, measured ----------------------------------------------------------------------------------


def _best_rate(fn: Callable[[], object], work: float, repeats: int = 15) -> float:
    """work per second of fn's fastest run (after one warm-up call)."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        best = min(best, time.perf_counter_ns() - t0)
    return work / (max(best, 1) / 1e9)


@functools.cache
def host_ceiling(threads: int) -> Ceiling:
    """This CPU's read and matmul ceilings for `threads` torch threads, measured once per process (~20 ms):
    one thread's fastest rates (read: a cache-resident copy's bytes read and a reduction; matmul: fp32 and
    bf16) times `threads`, an upper bound that a busy machine cannot lower the way it slows a measurement
    of several threads (the fastest of many short runs of one thread finds a quiet moment)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        read_rates = []
        for numel in (16 * 1024, 256 * 1024):  # 64 KB and 1 MB of fp32: L1/L2-resident
            src = torch.rand(numel)
            dst = torch.empty_like(src)
            read_rates.append(_best_rate(lambda s=src, d=dst: d.copy_(s), src.nbytes))
            read_rates.append(_best_rate(lambda s=src: s.sum(), src.nbytes))
        flop_rates = []
        for dtype in (torch.float32, torch.bfloat16):
            a = torch.rand(256, 256, dtype=dtype)
            flop_rates.append(_best_rate(lambda a=a: a @ a, 2 * 256**3))
    finally:
        torch.set_num_threads(before)
    scale = max(threads, 1)
    return Ceiling(
        f"this host's CPU at {threads} thread(s)",
        read_gbps=scale * max(read_rates) / 1e9,
        tflops={"any": scale * max(flop_rates) / 1e12},
        margin=CPU_MARGIN,
        source="measured",
    )
