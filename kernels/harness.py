"""The one measuring harness: every kernel trial goes through `run_trial`, in one order.

A family declares, for one seed, a `Prepared` trial: the call to time, built on the trial's device from
seeded inputs; the check of that call's output against the family's reference; the cost of one call
(kernels.base.Cost); and, optionally, figures the family reads once the trial is built (the split plan
it chose, its cache's statistics). `run_trial` does everything else, the same way for every family:

  1. each seed's inputs are built (the previous seed's are dropped first), the call runs once and is
     checked; with `memory=True` the last seed's checked call is also the peak-memory figure;
  2. the seeds' checks are combined (kernels.measure.correctness.combine_seeds: the worst seed leads);
  3. the last seed's call is timed by kernels.measure.timing.measure, which refuses a call that copies
     between host and device before timing, flushes L2 before every sample and times CUDA-graph replays
     where they apply;
  4. every rate comes from the cost and the median in kernels.base.derive_rates, and is written under
     the same metric names for every family (`rate_metrics`), with the spread of the samples
     (`spread_cv`, `spread_iqr`: the interquartile range over the median);
  5. the measurement is held against the world (kernels.validity): a median faster than the device can
     run the call's cost, or a call whose output does not follow its inputs once they are refilled in
     place from a fresh seed (a cached or replayed result), or, on a CPU, a call whose work ran on other
     threads of the process (CPU time beside the timing thread's), or, on a GPU, work left running on
     other streams after the end events or a persisting L2 window set by the call (kernels.measure.outside)
     makes the trial `invalid`, with the reason.

What a family's outcome adds on top (a resource model's verdict, a compiled-kernel check, Nsight Compute
figures) it passes in as `resources`; a trial that must not run at all (pruned) never reaches here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from kernels.base import Cost, Rates, TrialOutcome, TrialRequest, TrialStatus, derive_rates
from kernels.hardware import device_limits
from kernels.measure.correctness import CorrectnessReport, combine_seeds, seed_list
from kernels.measure.memory import peak_memory
from kernels.measure.timing import measure
from kernels.validity import ceiling_for, handed_off, outside_timed_region, physical_violation


@dataclass
class Checked:
    """One seed's check: the headline report, the family's other checked outputs by name (paged MLA's
    and attention's lse), and scalar figures of which the worst (largest) over the seeds is kept as a
    metric (FP8 GEMM's worst tile error)."""

    out: CorrectnessReport
    also: dict[str, CorrectnessReport] = field(default_factory=dict)
    worst: dict[str, float] = field(default_factory=dict)


@dataclass
class Prepared:
    """One seed's trial as the family builds it on the device."""

    call: Callable[[], Any]  # the timed call (its output is what `check` reads)
    check: Callable[[Any], Checked]
    cost: Cost
    figures: Callable[[], Mapping[str, Any]] = dict  # family metrics read after timing
    resources: Callable[[], Mapping[str, Any]] = dict  # what the compiler made of it (read after timing)
    # the tensors the call reads: after timing they are refilled in place from a fresh seed's (same
    # shapes), and the same call's output must follow them; () leaves this check out
    inputs: tuple[torch.Tensor, ...] = ()


def rate_metrics(cost: Cost, rates: Rates) -> dict[str, Any]:
    """The rate metrics of every trial, under one set of names: flops and bytes of one call; tflops and
    gbps (None when no median); hbm_bytes and hbm_gbps where the bytes HBM moves differ from the
    family's convention; on a GPU of known limits the roofline time and fractions."""
    out: dict[str, Any] = {
        "flops": cost.flops,
        "bytes": cost.bytes,
        "time_ns": rates.seconds * 1e9 if rates.seconds is not None else None,
        "tflops": rates.tflops,
        "gbps": rates.gbps,
    }
    if cost.hbm_bytes != cost.bytes:
        out.update(hbm_bytes=cost.hbm_bytes, hbm_gbps=rates.hbm_gbps)
    if rates.roofline_fraction is not None and rates.roofline_s is not None:
        out.update(
            roofline_us=rates.roofline_s * 1e6,
            roofline_fraction=rates.roofline_fraction,
            hbm_fraction=rates.bandwidth_fraction,
        )
    return out


def combined_correctness(checks: list[Checked], seeds: list[int]) -> dict[str, Any]:
    """The seeds' checks as one correctness record: the headline report's fields, `passed` only when
    every checked output passed on every seed, each other output's combined report under its name."""
    head = combine_seeds([c.out for c in checks], seeds)
    others = {name: combine_seeds([c.also[name] for c in checks], seeds) for name in checks[0].also}
    record = {**head.to_dict(), "passed": head.passed and all(r.passed for r in others.values())}
    for name, report in others.items():
        record[name] = report.to_dict()
    failing = [f"{name}: {r.message}" for name, r in others.items() if not r.passed]
    if failing:
        record["message"] = "; ".join([f"out: {head.message}", *failing])
    return record


def _passed(checked: Checked) -> bool:
    return checked.out.passed and all(r.passed for r in checked.also.values())


def stale_output(
    prep: Prepared, prepare: Callable[[int, torch.device], Prepared], seed: int, device: torch.device
) -> str | None:
    """Why `prep`'s call does not follow its inputs, or None: its input tensors are refilled in place from
    seed `seed`'s, the same call object runs again, and its output is checked against that seed's
    reference. A call that returns a result cached (or replayed) from before fails here."""
    if not prep.inputs:
        return None
    fresh = prepare(seed, device)
    pairs = list(zip(prep.inputs, fresh.inputs, strict=False))
    if len(fresh.inputs) != len(prep.inputs) or any(
        a.shape != b.shape or a.dtype != b.dtype for a, b in pairs
    ):
        return None  # this family's seeds differ in shape: nothing to refill in place
    with torch.no_grad():
        for dst, src in pairs:
            dst.copy_(src)
    checked = fresh.check(prep.call())
    if _passed(checked):
        return None
    return (
        f"stale output: with its inputs refilled in place from seed {seed}, the same call's output does "
        f"not match that seed's reference ({checked.out.message})"
    )


def _call_with_memory(prep: Prepared, device: torch.device) -> tuple[Any, dict[str, Any]]:
    """Run the call once under kernels.measure.memory.peak_memory; its output counts as retained."""
    held: list[Any] = []
    report = peak_memory(lambda: held.append(prep.call()), device, working_set_bytes=prep.cost.bytes)
    return held[0], report.to_dict()


def run_trial(
    req: TrialRequest,
    prepare: Callable[[int, torch.device], Prepared],
    *,
    precision: str = "bf16",
    memory: bool = False,
    resources: dict[str, Any] | None = None,
    correctness: Mapping[str, Any] | None = None,
) -> TrialOutcome:
    """Check the trial on every seed of its policy, time the last seed's call, derive its rates.

    `prepare(seed, device)` builds one seed's trial; `precision` picks the peak FLOPS of the roofline
    (kernels.hardware); `memory`: report the peak memory of the last checked call; `correctness`: fields
    the family adds to the correctness record (what was checked, whether unused memory was poisoned)."""
    device = torch.device(req.device)
    seeds = seed_list(req.policy.seeds)
    checks: list[Checked] = []
    memory_report: dict[str, Any] = {}
    prep: Prepared | None = None
    for i, seed in enumerate(seeds):
        prep = None  # the previous seed's tensors go before the next are built
        prep = prepare(seed, device)
        if memory and i == len(seeds) - 1:
            out, memory_report = _call_with_memory(prep, device)
        else:
            out = prep.call()
        checks.append(prep.check(out))
        del out
    assert prep is not None
    record = {**combined_correctness(checks, seeds), **(correctness or {})}

    timed = measure(prep.call, req.policy, device=device)
    invalid = [
        why
        for why in (
            physical_violation(prep.cost, timed.summary.median, ceiling_for(device), precision),
            stale_output(prep, prepare, max(seeds) + 1, device),
            handed_off(timed.clocks) if device.type == "cpu" else outside_timed_region(timed.clocks),
        )
        if why
    ]
    rates = derive_rates(prep.cost, timed.summary.median, device_limits(device), precision)
    metrics = rate_metrics(prep.cost, rates)
    s = timed.summary
    metrics.update(spread_cv=s.cv, spread_iqr=s.iqr / s.median if s.median else None)
    for name in checks[0].worst:
        metrics[name] = max(c.worst[name] for c in checks)
    metrics.update(prep.figures())
    status = TrialStatus.passed(record["passed"])
    if invalid and status is TrialStatus.OK:
        status = TrialStatus.INVALID
    return TrialOutcome.measured(
        status,
        timed,
        error="; ".join(invalid) or None,
        correctness=record,
        metrics=metrics,
        memory=memory_report,
        resources={**(resources or {}), **prep.resources()},
    )
