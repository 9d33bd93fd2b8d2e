"""The probe family: trials that exercise the farm itself, not a kernel.

`farm sweep run jobs/specs/probe.yaml` checks that a cluster dispatches, times out, retries and
stores correctly before real kernels are trusted to it. Backends:
  noop   returns at once (the dispatch-overhead benchmark uses it)
  spin   busy-loops until it has used `config.ms` milliseconds of CPU time (scaling benchmark): a fixed
         amount of work, like a kernel's, so its wall time grows when other processes share its core
  wait   sleeps `config.ms` milliseconds in the timed call: a time that is latency, not work, so other
         processes on its core barely move it (the history test's real sweeps use it)
  sleep  sleeps `config.s` seconds (a hung trial when s exceeds the spec's timeout_s)
  crash  kills its own worker process (exit code 1), as a segfault or OOM kill would
Every outcome reports the device the worker was pinned to (CUDA_VISIBLE_DEVICES).
Each backend's implementation builds the call to time from the trial's config.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from kernels.base import Backends, Cost, KernelFamily, TrialOutcome, TrialRequest, TrialStatus

# Each backend returns the call to time for a trial's config.
BACKENDS = Backends("probe")


@BACKENDS.register("noop", "returns at once", reference=True)
def _noop_call(config: dict[str, Any]) -> Callable[[], None]:
    return _noop


@BACKENDS.register("spin", "busy-loops for config.ms milliseconds of CPU time", config_keys=("ms",))
def _spin_call(config: dict[str, Any]) -> Callable[[], None]:
    return _spin(float(config.get("ms", 1.0)))


@BACKENDS.register("wait", "sleeps config.ms milliseconds in the timed call", config_keys=("ms",))
def _wait_call(config: dict[str, Any]) -> Callable[[], None]:
    seconds = float(config.get("ms", 1.0)) / 1e3
    return lambda: time.sleep(seconds)


@BACKENDS.register("sleep", "sleeps config.s seconds", config_keys=("s",))
def _sleep_call(config: dict[str, Any]) -> Callable[[], None]:
    time.sleep(float(config.get("s", 1.0)))
    return _noop


@BACKENDS.register("crash", "kills its own worker process")
def _crash_call(config: dict[str, Any]) -> Callable[[], None]:
    os._exit(1)


class ProbeFamily(KernelFamily):
    name = "probe"
    backends = BACKENDS
    shape_keys = ("n",)

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        if set(shape) != {"n"} or not isinstance(shape["n"], int):
            raise ValueError(f"shape must be {{n: int}} (got {shape})")
        declared = self.backends[backend]
        allowed = set(declared.config_keys)
        if not set(config) <= allowed:
            raise ValueError(
                f"config keys {sorted(set(config) - allowed)} do not apply to probe backend {backend}"
            )
        if declared.check is not None:
            declared.check(shape, config)

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        return Cost(flops=0.0, bytes_read=0.0, bytes_written=0.0)

    def execute(self, req: TrialRequest) -> TrialOutcome:
        from kernels.measure.timing import measure  # torch: in the worker, not in a driver reading a spec

        fn = self.backends.impl(req.backend)(req.config)
        m = measure(fn, req.policy, device="cpu")
        return TrialOutcome.measured(
            TrialStatus.OK,
            m,
            correctness={"passed": True, "method": "none"},
            metrics={"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")},
        )


def _noop() -> None:
    return None


def _spin(ms: float) -> Callable[[], None]:
    # The thread's CPU time, not the wall clock: a loop on the wall clock ends on time however little of
    # the core it got, so it would hide the contention a real kernel's timing shows (and a slowdown
    # injected through config.ms would shrink or grow with the machine's load).
    def spin() -> None:
        end = time.thread_time_ns() + int(ms * 1e6)
        x = 0
        while time.thread_time_ns() < end:
            x += 1

    return spin


FAMILY = ProbeFamily()
