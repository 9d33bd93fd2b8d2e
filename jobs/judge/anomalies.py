"""Anomalies: what an analysis of a job found, one row per (trial, kind), with the numbers behind it.

Kinds and default severity:
  correctness  error    the output failed its check, or a correctness metric is over the card's limit
  slower       error    slower than the baseline point beyond the card's threshold, significantly
  faster       info     faster beyond the threshold (worth a look: a kernel that skips work is fast too)
  ambiguous    warning  the comparison with the baseline could not decide: noise
  noisy        warning  the samples' dispersion is above the card's max_cv
  timeout      error    the trial ran past its timeout and its worker was killed
  crashed      error    its worker died on every attempt
  error        error    the backend raised (or the config was pruned)
  memory       error    bytes per token or peak memory beyond the card
  hw_fraction  error    on a GPU, below the card's fraction of the hardware limit
  resource     error    register spills, or an occupancy drop against the baseline point
  throttled    warning  samples were taken while the SM clock was throttled
  environment  warning  the job ran in another environment than its baseline (torch, driver, GPU, ...; info
                        when only the host differs): an anomaly of the job, no trial (jobs.judge.acceptance)

The fingerprint hashes the point (family, backend, shape, config without variant keys, dtype) and the
kind: never a job id, a trial id or a time, so the same anomaly in a later job has the same fingerprint.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jobs.judge.baselines import digest, point_ident
from jobs.store import AnomalyRecord, TrialRow
from kernels.base import throttle_count

SEVERITY: dict[str, str] = {
    "correctness": "error",
    "slower": "error",
    "faster": "info",
    "ambiguous": "warning",
    "noisy": "warning",
    "timeout": "error",
    "crashed": "error",
    "error": "error",
    "invalid": "error",  # a measurement the hardware cannot have produced, or a stale output (issue 45)
    "memory": "error",
    "hw_fraction": "error",
    "resource": "error",
    "throttled": "warning",
    "environment": "warning",
}
KINDS = tuple(SEVERITY)


def fingerprint(t: TrialRow, kind: str) -> str:
    return digest([point_ident(t), kind])


@dataclass
class Found:
    """One anomaly before it is stored."""

    kind: str
    trial: TrialRow
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    baseline_trial_id: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in SEVERITY:
            raise ValueError(f"unknown anomaly kind {self.kind!r} (known: {', '.join(KINDS)})")

    @property
    def severity(self) -> str:
        return SEVERITY[self.kind]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.trial, self.kind)

    def record(self) -> AnomalyRecord:
        """The anomaly as the store keeps it."""
        return AnomalyRecord(
            trial_id=self.trial.id, kind=self.kind, severity=self.severity, fingerprint=self.fingerprint,
            message=self.message, evidence=self.evidence, baseline_trial_id=self.baseline_trial_id,
        )  # fmt: skip


def throttled_samples(t: TrialRow) -> int | None:
    """How many of the trial's samples were throttled, where the trial recorded it (a count or a list of
    flags under summary/metrics `throttled`, `n_throttled` or `throttled_samples`); None if unknown."""
    return t.stats.n_throttled or throttle_count(t.metrics or {})


CONTAMINATION = {
    "drift": "its samples drift across the run (last third's median far from the first third's)",
    "contended": "its process got far less CPU time than the wall time of its timing loop",
}


def contamination(trials: list[TrialRow]) -> list[Found]:
    """`noisy` for each ok trial whose measurement flagged it drifting or contended (kernels.measure):
    its median describes the machine's load, not the kernel."""
    out = []
    for t in trials:
        stats = t.stats
        why = [CONTAMINATION[f] for f in stats.flags if f in CONTAMINATION]
        if why:
            ratio = stats.clocks.get("cpu_time_ratio")
            out.append(Found("noisy", t, "timing not trusted: " + "; ".join(why), {"cpu_time_ratio": ratio}))
    return out


def throttling(trials: list[TrialRow]) -> list[Found]:
    out = []
    for t in trials:
        n = throttled_samples(t)
        if n:
            total = t.stats.n
            out.append(
                Found(
                    "throttled", t, f"{n} samples taken while throttled", {"throttled": n, "samples": total}
                )
            )
    return out
