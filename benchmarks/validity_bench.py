"""`python -m benchmarks validity`: what the validity checks after timing cost a trial (issue 45; target
under 5% of a trial's wall time).

For one point of each family's shipped CPU spec, the trial runs through the family as the farm runs it
(default measurement policy), with the two checks the harness adds after timing (kernels.validity's
physical limit, kernels.harness.stale_output: one more seed built, the call refilled and checked again)
timed on their own; printed as their share of the trial's wall time. The host ceiling is measured once
per process, before the first trial, and reported apart.
"""

from __future__ import annotations

import os
import time
from typing import Any

from kernels import harness, validity
from kernels.base import TrialRequest
from kernels.measure.policy import MeasurePolicy
from kernels.registry import get_family

POINTS: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    ("gemm", "torch_fp32", {"m": 256, "n": 256, "k": 256}, {}, "float32"),
    ("gemm", "torch_bf16", {"m": 256, "n": 256, "k": 256}, {}, "float32"),
    (
        "fp8_gemm",
        "triton",
        {"m": 64, "n": 64, "k": 128},
        {"block_m": 32, "block_n": 32, "block_k": 64},
        "float8_e4m3fn",
    ),
]


def _timed(fn: Any, spent: list[float]) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - t0)

    return wrapper


def main() -> dict[str, Any]:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # as the farm's CPU workers do
    t0 = time.perf_counter()
    validity.host_ceiling(torch.get_num_threads())
    ceiling_s = time.perf_counter() - t0
    print(f"host ceiling measured once per process: {ceiling_s * 1e3:.1f} ms")
    figures: dict[str, Any] = {"host_ceiling_ms": ceiling_s * 1e3, "points": []}
    real_stale, real_phys = harness.stale_output, harness.physical_violation
    policy = MeasurePolicy()
    print(f"{'point':44} {'trial s':>9} {'checks ms':>10} {'share':>7}")
    for family, backend, shape, config, dtype in POINTS:
        spent: list[float] = []
        harness.stale_output = _timed(real_stale, spent)
        harness.physical_violation = _timed(real_phys, spent)
        try:
            req = TrialRequest(family, backend, shape, config, dtype, policy=policy)
            t1 = time.perf_counter()
            out = get_family(family).run(req)
            wall = time.perf_counter() - t1
        finally:
            harness.stale_output, harness.physical_violation = real_stale, real_phys
        share = sum(spent) / wall
        label = f"{family}/{backend} {shape}"
        print(f"{label:44} {wall:9.2f} {sum(spent) * 1e3:10.1f} {share:7.1%}  ({out.status})")
        figures["points"].append({"point": label, "trial_s": wall, "checks_s": sum(spent), "share": share})
    return figures
