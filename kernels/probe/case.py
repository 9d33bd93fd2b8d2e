"""The probe family: trials that exercise the farm itself, not a kernel.

`farm sweep run jobs/specs/probe.yaml` checks that a cluster dispatches, times out, retries and
stores correctly before real kernels are trusted to it. Backends:
  noop   returns at once (the dispatch-overhead benchmark uses it)
  spin   busy-loops on the CPU for `config.ms` milliseconds (scaling benchmark)
  sleep  sleeps `config.s` seconds (a hung trial when s exceeds the spec's timeout_s)
  crash  kills its own worker process (exit code 1), as a segfault or OOM kill would
Every outcome reports the device the worker was pinned to (CUDA_VISIBLE_DEVICES).
"""

from __future__ import annotations

import os
import time
from typing import Any

from kernels.base import Cost, TrialOutcome, TrialRequest
from kernels.measure.timing import measure

_CONFIG_KEYS = {"noop": set(), "spin": {"ms"}, "sleep": {"s"}, "crash": set()}


class ProbeFamily:
    name = "probe"
    backends = {
        "noop": "returns at once",
        "spin": "busy-loops on the CPU for config.ms milliseconds",
        "sleep": "sleeps config.s seconds",
        "crash": "kills its own worker process",
    }
    shape_keys = ("n",)

    def validate(self, shape: dict[str, Any], config: dict[str, Any], dtype: str, backend: str) -> None:
        if set(shape) != {"n"} or not isinstance(shape["n"], int):
            raise ValueError(f"shape must be {{n: int}} (got {shape})")
        allowed = _CONFIG_KEYS[backend]
        if not set(config) <= allowed:
            raise ValueError(
                f"config keys {sorted(set(config) - allowed)} do not apply to probe backend {backend}"
            )

    def cost(self, shape: dict[str, Any], dtype: str) -> Cost:
        return Cost(flops=0.0, bytes=0.0)

    def run(self, req: TrialRequest) -> TrialOutcome:
        if req.backend == "crash":
            os._exit(1)
        if req.backend == "sleep":
            time.sleep(float(req.config.get("s", 1.0)))
        fn = _spin(float(req.config.get("ms", 1.0))) if req.backend == "spin" else _noop
        m = measure(fn, req.policy, device="cpu")
        return TrialOutcome.measured(
            "ok",
            m,
            correctness={"passed": True, "method": "none"},
            metrics={"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "")},
        )


def _noop() -> None:
    return None


def _spin(ms: float):
    def spin() -> None:
        end = time.perf_counter_ns() + int(ms * 1e6)
        x = 0
        while time.perf_counter_ns() < end:
            x += 1

    return spin


FAMILY = ProbeFamily()
