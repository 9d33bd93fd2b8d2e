"""`python -m benchmarks validity`: what the validity checks after timing cost a trial (issue 45; target
under 5% of a trial's wall time).

For one point of each family's shipped CPU spec, the trial runs through the family as the farm runs it
(default measurement policy), with the two checks the harness adds after timing (kernels.validity's
physical limit, kernels.harness.stale_output: one more seed built, the call refilled and checked again)
timed on their own; printed as their share of the trial's wall time. The host ceiling is measured once
per process, before the first trial, and reported apart. The points: gemm (both backends), and for each
family whose calls declare their inputs since (fp8_gemm, paged_mla, attention) a torch backend and the
Triton one (in the interpreter on a CPU), at a shape of the family's CPU spec (jobs/specs/*_cpu.yaml).
"""

from __future__ import annotations

import os
import time
from typing import Any

from kernels import harness, validity
from kernels.base import TrialRequest
from kernels.measure.policy import MeasurePolicy
from kernels.registry import get_family

# paged_mla_cpu.yaml's first decode point; attention_cpu.yaml's decode at batch 2
MLA = {"batch": 5, "seqlen": 80, "dist": "boundary", "h_q": 2, "s_q": 1, "page_size": 16, "kv_dtype": "bf16"}
ATTENTION = {"mode": "decode", "batch": 2, "s_q": 1, "s_k": 40, "h_q": 4, "h_kv": 2, "d": 32}
POINTS: list[tuple[str, str, dict[str, Any], dict[str, Any], str]] = [
    ("gemm", "torch_fp32", {"m": 256, "n": 256, "k": 256}, {}, "float32"),
    ("gemm", "torch_bf16", {"m": 256, "n": 256, "k": 256}, {}, "float32"),
    ("fp8_gemm", "torch_ref", {"m": 64, "n": 64, "k": 128}, {}, "float8_e4m3fn"),
    (
        "fp8_gemm",
        "triton",
        {"m": 64, "n": 64, "k": 128},
        {"block_m": 32, "block_n": 32, "block_k": 64},
        "float8_e4m3fn",
    ),
    ("paged_mla", "torch_ref", MLA, {}, "bfloat16"),
    ("paged_mla", "triton", MLA, {"num_splits": "auto"}, "bfloat16"),
    ("attention", "torch_ref", ATTENTION, {}, "bfloat16"),
    ("attention", "triton", ATTENTION, {"block_m": 16, "block_n": 16}, "bfloat16"),
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
    print(f"{'point':20} {'trial s':>8} {'limit ms':>9} {'recheck ms':>11} {'share':>7}  status, shape")
    for family, backend, shape, config, dtype in POINTS:
        phys: list[float] = []
        stale: list[float] = []
        harness.stale_output = _timed(real_stale, stale)
        harness.physical_violation = _timed(real_phys, phys)
        try:
            req = TrialRequest(family, backend, shape, config, dtype, policy=policy)
            t1 = time.perf_counter()
            out = get_family(family).run(req)
            wall = time.perf_counter() - t1
        finally:
            harness.stale_output, harness.physical_violation = real_stale, real_phys
        spent = sum(phys) + sum(stale)
        share = spent / wall
        label = f"{family}/{backend}"
        print(
            f"{label:20} {wall:8.2f} {sum(phys) * 1e3:9.2f} {sum(stale) * 1e3:11.1f} {share:7.1%}"
            f"  {out.status}, {len(out.samples_ns)} samples, {shape}"
        )
        figures["points"].append(
            {
                "point": f"{label} {shape}",
                "status": str(out.status),
                "samples": len(out.samples_ns),
                "trial_s": wall,
                "limit_s": sum(phys),
                "recheck_s": sum(stale),
                "checks_s": spent,
                "share": share,
            }
        )
    return figures
