"""Measure a zero-argument callable on the device where it runs: raw samples, summary, stop reason.

Timers (the `timer` label of a Measurement: the method actually used, per trial; `timer_reason` says
why it was chosen):
  cpu_perf_counter  time.perf_counter_ns around each call (CPU timings, labelled so);
  cuda_event        CUDA events around each call, L2 flushed before each sample (flush, start event,
                    call, end event): for calls of ~100 us and more, whose host launch time the flush and
                    the kernel itself cover;
  cuda_graph        CUDA events around a replay of a CUDA graph captured from the callable, the flush
                    launched before the start event: one launch, so the call's host overhead (Python,
                    argument handling) is not timed. The GPU default for calls under ~100 us;
  cuda_event_back_to_back  for calls under ~100 us that cannot be captured in a graph (host work,
                    synchronisation): `reps` calls launched back to back, each after its own flush and
                    between its own events (flush, start, call, end: every call reads a cold L2), with no
                    synchronisation until the batch ends; the sample is the mean per call;
  cupti             kernel-only time from the torch profiler (CUPTI), summed over the kernels whose name
                    contains the filter, per call. The filter must not match the L2 flush (a memset /
                    fill of a byte buffer) nor memcpy/memset records.
A measurement whose samples drift (`drift`: the last third's median far from the first third's, or a
short run that rises or falls all the way) or, on the CPU, whose process got far less CPU time than
the wall time of its timed loop (`contended`: another process had the cores) is also flagged `noisy`:
its median describes the machine's load, not the kernel.
Every CUDA call goes through kernels.measure.cuda_layer (torch's, or the recording fake of
testkit.kernels.fake_cuda), so the order of each method is checked on a CPU.
Warm-up is by time (`warmup_ms`, after one first call that absorbs JIT compilation). The stopping rule
(kernels.measure.stopping) decides when to stop. On a GPU, the SM clock is read when measuring starts and
after each batch of samples (kernels.measure.clocks); a batch whose clock fell more than 5% below the
starting one is flagged throttled (and left out of the summary if the policy says so). After each batch,
kernels.measure.outside audits what the calls did outside the events (work on other streams, a persisting
L2 window); kernels.validity judges it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels.measure.clean_call import transfers
from kernels.measure.cpu_share import RunQueue, Usage
from kernels.measure.cuda_layer import CudaLayer, TorchCuda, flush_bytes
from kernels.measure.outside import OutsideAudit
from kernels.measure.policy import MeasurePolicy
from kernels.measure.stats import detect_step, drift_of
from kernels.measure.stopping import StoppingRule
from kernels.measure.summary import SampleStats, summarize

CUPTI_MIN_BATCH = 50  # calls per profiler session: starting one costs far more than a kernel
SHORT_CALL_NS = 100_000  # under this, host launch overhead is a visible part of an event-timed call
PROBE_CALLS = 5
DRIFT_LIMIT = 0.10  # last third's median vs the first third's (relative): beyond it, the samples drift
SHORT_RUN_DRIFT = 0.20  # fewer than 6 samples, all rising or all falling, by more than this end to end
# process CPU time over the wall time it could run (less run-queue waits, where known) of a CPU timing loop:
# below it, the calls waited rather than computed (or, where the waits are not known, the cores were shared)
MIN_CPU_RATIO = 0.5


def choose_gpu_timer(requested: str, probe_ns: float | None, graph_error: str | None) -> tuple[str, str]:
    """The GPU timing method and why: the policy's explicit choice (cuda_graph, cupti) stands; the
    default (cuda_event) becomes a graph replay for calls under SHORT_CALL_NS, or back-to-back launches
    when the call cannot be captured (`graph_error`)."""
    if requested != "cuda_event":
        return requested, "set by the measure policy"
    if probe_ns is None or probe_ns >= SHORT_CALL_NS:
        return "cuda_event", "call of >= 100 us: events around each call"
    short = f"call of {probe_ns / 1e3:.1f} us < 100 us"
    if graph_error is None:
        return "cuda_graph", f"{short}: CUDA-graph replay keeps host overhead out"
    return "cuda_event_back_to_back", f"{short}, not capturable ({graph_error}): back-to-back launches"


def back_to_back_reps(probe_ns: float) -> int:
    """Calls per back-to-back sample: enough to cover ~100 us of GPU time."""
    return max(1, min(1000, int(SHORT_CALL_NS // max(probe_ns, 1.0))))


@dataclass
class Measurement:
    samples_ns: list[int]
    summary: SampleStats  # over the kept samples (throttled ones left out when the policy discards them)
    stop_reason: str
    timer: str
    device: str
    timer_reason: str | None = None
    throttled: list[bool] = field(default_factory=list)
    kept: list[bool] = field(default_factory=list)  # False where a throttled sample was discarded
    clocks: dict[str, Any] = field(default_factory=dict)
    warmup_iters: int = 0
    warmup_ms: float = 0.0
    flags: list[str] = field(default_factory=list)  # "noisy", "throttled", "step", "few_samples"
    step: dict[str, Any] | None = None
    l2_flush_bytes: int | None = None
    kernel_name: str | None = None
    wall_s: float = 0.0

    @property
    def kept_samples_ns(self) -> list[int]:
        """The samples the summary is over (all of them unless throttled ones were discarded)."""
        if len(self.kept) != len(self.samples_ns) or not any(self.kept):
            return list(self.samples_ns)
        return [s for s, k in zip(self.samples_ns, self.kept, strict=True) if k]

    def to_dict(self) -> dict[str, Any]:
        return {
            "samples_ns": [int(s) for s in self.samples_ns],
            "summary": self.summary.to_dict(),
            "stop_reason": self.stop_reason,
            "timer": self.timer,
            "timer_reason": self.timer_reason,
            "device": self.device,
            "throttled": [bool(t) for t in self.throttled],
            "kept": [bool(k) for k in self.kept],
            "clocks": self.clocks,
            "warmup_iters": self.warmup_iters,
            "warmup_ms": self.warmup_ms,
            "flags": list(self.flags),
            "step": self.step,
            "l2_flush_bytes": self.l2_flush_bytes,
            "kernel_name": self.kernel_name,
            "wall_s": self.wall_s,
        }


def measure(
    fn: Callable[[], object],
    policy: MeasurePolicy | None = None,
    *,
    device: str | torch.device = "cpu",
    kernel_name: str | None = None,
    cuda: CudaLayer | None = None,
) -> Measurement:
    """Time `fn` under `policy`. `kernel_name` (or policy.kernel_name) filters kernel-only timing.
    `cuda`: the CUDA layer to time through (default: torch's; tests pass testkit.kernels.fake_cuda's)."""
    policy = policy or MeasurePolicy()
    dev = torch.device(device)
    if dev.type == "cpu":
        return _measure_cpu(fn, policy)
    if dev.type != "cuda":
        raise ValueError(f"measure() times on 'cpu' or 'cuda', not {dev.type!r}")
    if cuda is None:
        if not torch.cuda.is_available():
            raise RuntimeError("measure(device='cuda') needs a CUDA GPU; none is available here")
        cuda = TorchCuda()
    index = (
        dev.index
        if dev.index is not None
        else (torch.cuda.current_device() if isinstance(cuda, TorchCuda) else 0)
    )
    with cuda.device(index):
        return _measure_cuda(fn, policy, index, kernel_name or policy.kernel_name, cuda)


# -- CPU ---------------------------------------------------------------------------------------------------


def _warm_up(fn: Callable[[], object], warmup_ms: float, sync: Callable[[], None]) -> tuple[int, float]:
    """One call (absorbs JIT compilation), then calls until warmup_ms has passed since that call ended."""
    fn()
    sync()
    iters = 1
    start = time.perf_counter()
    while (time.perf_counter() - start) * 1e3 < warmup_ms:
        fn()
        sync()
        iters += 1
    return iters, (time.perf_counter() - start) * 1e3


def _measure_cpu(fn: Callable[[], object], policy: MeasurePolicy) -> Measurement:
    """Wall time per call, less the time the thread waited in the run queue for a core where Linux says
    (kernels.measure.cpu_share): the level a loaded runner cannot move. The clocks record which level
    was used, the thread's share of a core, and the CPU time of the process's other threads."""
    warmup_iters, warmup_ms = _warm_up(fn, policy.warmup_ms, lambda: None)
    rule = StoppingRule(policy)
    queue = RunQueue.open()
    samples: list[int] = []
    walls: list[int] = []
    start = Usage.now()
    try:
        while True:
            w0 = queue.wait_ns() if queue else 0
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            waited = queue.wait_ns() - w0 if queue else 0
            walls.append(t1 - t0)
            samples.append(max(1, t1 - t0 - waited))
            if rule.add(samples[-1], wall_s=time.perf_counter() - start.wall_s):
                break
    finally:
        if queue:
            queue.close()
    used = Usage.now().since(start)
    wall_sum = sum(walls)
    runnable = sum(samples) / wall_sum if wall_sum else 1.0  # of the calls' wall time, not queued
    clocks = {
        "available": False,
        "reason": "CPU timing: no SM clock",
        "level": "wall_less_run_queue" if queue else "wall",
        "cpu_time_ratio": round(used.process_cpu_s / used.wall_s, 3) if used.wall_s > 0 else 1.0,
        # CPU time over the time the process could run: low for a call that blocks (sleeps, waits)
        "busy_ratio": round(used.process_cpu_s / (used.wall_s * runnable), 3) if used.wall_s > 0 else 1.0,
        "loop_wall_s": round(used.wall_s, 6),
        "thread_cpu_s": round(used.thread_cpu_s, 6),
        "other_threads_cpu_s": round(used.other_threads_cpu_s, 6),
        "torch_threads": torch.get_num_threads(),
    }
    if queue:
        clocks.update(core_share=round(runnable, 3), wall_median_ns=int(statistics.median(walls)))
    return _finish(
        samples,
        [False] * len(samples),
        rule,
        policy,
        timer="cpu_perf_counter",
        device="cpu",
        clocks=clocks,
        warmup=(warmup_iters, warmup_ms),
        wall_s=used.wall_s,
    )


def _finish(
    samples: list[int],
    throttled: list[bool],
    rule: StoppingRule,
    policy: MeasurePolicy,
    *,
    timer: str,
    device: str,
    clocks: dict[str, Any],
    warmup: tuple[int, float],
    wall_s: float,
    l2_flush_bytes: int | None = None,
    kernel_name: str | None = None,
    timer_reason: str | None = None,
) -> Measurement:
    keep = [not (t and policy.discard_throttled) for t in throttled]
    kept = [s for s, k in zip(samples, keep, strict=True) if k] or samples
    summary = summarize(kept)
    flags: list[str] = []
    if summary.n >= 2 and summary.cv > policy.max_cv:
        flags.append("noisy")
    if any(throttled):
        flags.append("throttled")
    step = detect_step(kept)
    if step is not None:
        flags.append("step")
    if summary.n < policy.min_samples:
        flags.append("few_samples")
    if drifts(kept):
        flags.append("drift")
    ratio = clocks.get("busy_ratio", clocks.get("cpu_time_ratio"))
    if ratio is not None and ratio < MIN_CPU_RATIO:
        flags.append("contended")
    if {"drift", "contended"} & set(flags) and "noisy" not in flags:
        flags.insert(0, "noisy")
    return Measurement(
        samples_ns=samples,
        summary=summary,
        stop_reason=rule.reason or "max_samples",
        timer=timer,
        device=device,
        timer_reason=timer_reason,
        throttled=throttled,
        kept=keep,
        clocks=clocks,
        warmup_iters=warmup[0],
        warmup_ms=warmup[1],
        flags=flags,
        step=step.to_dict() if step is not None else None,
        l2_flush_bytes=l2_flush_bytes,
        kernel_name=kernel_name,
        wall_s=wall_s,
    )


def drifts(samples: list[int]) -> bool:
    """Whether the samples move across the run rather than scatter around one value: from 6 samples on,
    the median of the last third differs from the first third's by more than DRIFT_LIMIT; below that,
    every sample is above (or below) the one before and the run moves more than SHORT_RUN_DRIFT."""
    n = len(samples)
    if n < 3 or min(samples) <= 0:
        return False
    if n < 6:
        pairs = list(zip(samples, samples[1:], strict=False))
        monotone = all(b > a for a, b in pairs) or all(b < a for a, b in pairs)
        return monotone and drift_of(samples) > math.log1p(SHORT_RUN_DRIFT)
    return drift_of(samples) > math.log1p(DRIFT_LIMIT)


# -- CUDA --------------------------------------------------------------------------------------------------


def l2_flush_bytes(device_index: int) -> int:
    """Twice the device's L2 size (the flush buffer must be at least that), 256 MB if it reports none."""
    return flush_bytes(TorchCuda(), device_index)


def _measure_cuda(
    fn: Callable[[], object], policy: MeasurePolicy, index: int, kernel_name: str | None, cuda: CudaLayer
) -> Measurement:
    timer = policy.timer_name(on_gpu=True)
    if timer == "cupti" and not kernel_name:
        raise ValueError("kernel-only timing needs a kernel name filter (kernel_name)")
    stream = cuda.stream(index)
    audit = OutsideAudit.start(cuda, index)  # persisting L2 off before the first call
    moved = transfers(fn)  # also the first call, which absorbs compilation
    if moved:
        raise ValueError(
            f"the timed call moves data between host and device ({'; '.join(moved)}): it would stall every "
            "sample; do that once when the inputs are built"
        )
    flushed = flush_bytes(cuda, index) if policy.flush_l2 else None
    flush = cuda.flusher(index, flushed)

    warmup = _warm_up(fn, policy.warmup_ms, stream.synchronize)
    probe_ns: float | None = None
    graph = None
    graph_error = None
    if timer == "cuda_event":
        probe = sorted(_event_times(cuda, fn, flush, PROBE_CALLS, stream))
        probe_ns = float(probe[len(probe) // 2])
    if timer == "cuda_graph" or (probe_ns is not None and probe_ns < SHORT_CALL_NS):
        try:
            graph = cuda.capture(fn, stream)
        except Exception as exc:  # host work or a sync inside the call: it cannot be captured
            if timer == "cuda_graph":
                raise
            graph_error = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
    timer, timer_reason = choose_gpu_timer(timer, probe_ns, graph_error)
    call = graph if timer == "cuda_graph" and graph is not None else fn  # the replay is what is timed
    reps = back_to_back_reps(probe_ns or SHORT_CALL_NS)

    clock = cuda.clock(index, policy.throttle_max_drop)
    rule = StoppingRule(policy)
    samples: list[int] = []
    throttled: list[bool] = []
    start = time.perf_counter()
    while rule.reason is None:
        per_sync = max(policy.gpu_batch, CUPTI_MIN_BATCH) if timer == "cupti" else policy.gpu_batch
        batch = min(per_sync, policy.max_samples - rule.n_raw)
        if timer == "cupti":
            times = _kernel_times(cuda, call, flush, batch, kernel_name or "", stream)
        elif timer == "cuda_event_back_to_back":
            times = _event_times(cuda, call, flush, batch, stream, reps=reps)
        else:
            times = _event_times(cuda, call, flush, batch, stream)
        audit.after_batch(times, reps if timer == "cuda_event_back_to_back" else 1)
        hot = clock.sample()
        for t in times:
            samples.append(t)
            throttled.append(hot)
            if rule.add(t, wall_s=time.perf_counter() - start, keep=not (hot and policy.discard_throttled)):
                break
    return _finish(
        samples,
        throttled,
        rule,
        policy,
        timer=timer,
        device=f"cuda:{index} ({cuda.device_name(index)})",
        clocks={**clock.to_dict(), **audit.to_clocks()},
        warmup=warmup,
        wall_s=time.perf_counter() - start,
        l2_flush_bytes=flushed,
        kernel_name=kernel_name if timer == "cupti" else None,
        timer_reason=timer_reason,
    )


def _event_times(
    cuda: CudaLayer,
    call: Callable[[], object],
    flush: Callable[[], None],
    batch: int,
    stream: Any,
    reps: int = 1,
) -> list[int]:
    """Enqueue `batch` samples of `reps` calls, each call after its own L2 flush and between its own
    events (flush, start, call, end: the flush is never timed and no call finds a warm L2), and
    synchronise once; a sample is the mean time of its calls."""
    events = [[(cuda.event(), cuda.event()) for _ in range(reps)] for _ in range(batch)]
    for sample in events:
        for begin, end in sample:
            flush()
            begin.record(stream)
            call()
            end.record(stream)
    stream.synchronize()
    return [int(round(sum(b.elapsed_time(e) for b, e in sample) * 1e6 / reps)) for sample in events]


def _kernel_times(
    cuda: CudaLayer,
    call: Callable[[], object],
    flush: Callable[[], None],
    batch: int,
    name_filter: str,
    stream: Any,
) -> list[int]:
    """Kernel-only time per call: the durations of the GPU kernels whose name contains `name_filter`,
    from one profiler session over `batch` calls, each after its flush, grouped per call (each call must
    launch the same number of matching kernels)."""
    # The L2 flush launches kernels of its own (a fill, a memset): learn their names from a flush
    # alone, so a broad filter such as "kernel" can never add the flush to the kernel's time.
    flush_names = {name for _, _, name in cuda.kernel_records(flush, stream)}

    def run() -> None:
        for _ in range(batch):
            flush()
            call()

    kernels = sorted(
        (start, duration)
        for start, duration, name in cuda.kernel_records(run, stream)
        if name_filter in name and name not in flush_names
    )
    if not kernels or len(kernels) % batch:
        raise RuntimeError(
            f"kernel-only timing: {len(kernels)} kernels matching {name_filter!r} over {batch} calls; "
            "the filter must match the same (non-zero) number of kernels in every call"
        )
    per_call = len(kernels) // batch
    durations = [d for _, d in kernels]
    return [int(sum(durations[i * per_call : (i + 1) * per_call])) for i in range(batch)]
