"""The stopping rule, as a pure state machine over a stream of samples (nothing here reads a clock).

Feed samples one at a time with `StoppingRule.add`; it returns the reason to stop, or None to go on:
  "converged"      at least min_samples kept, at least min_time_s of measured time (sum of kept samples),
                   and the relative standard deviation (stdev/mean) at or below target_rel_stdev;
  "noise_plateau"  the same minimums, and the relative stdev has stopped improving: a least-squares line
                   through its last noise_window values falls by less than noise_min_improvement of their
                   mean over the window;
  "max_samples"    max_samples raw samples taken (kept or not);
  "max_time"       the wall-clock time the caller reports reached max_time_s.
Samples the caller marks as not kept (taken while throttled) count towards the caps only.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from kernels.measure.policy import MeasurePolicy

STOP_REASONS = ("converged", "noise_plateau", "max_samples", "max_time")


class StoppingRule:
    def __init__(self, policy: MeasurePolicy) -> None:
        self.policy = policy
        self.n_raw = 0
        self.n_kept = 0
        self._mean = 0.0
        self._m2 = 0.0  # Welford's running sum of squared deviations
        self.measured_ns = 0.0  # sum of kept samples
        self.raw_ns = 0.0  # sum of all samples
        self._noise: deque[float] = deque(maxlen=policy.noise_window)
        self.reason: str | None = None

    @property
    def cv(self) -> float:
        """Relative standard deviation of the kept samples so far (inf before two samples)."""
        if self.n_kept < 2 or self._mean <= 0:
            return math.inf
        return math.sqrt(self._m2 / (self.n_kept - 1)) / self._mean

    def add(self, sample_ns: float, *, wall_s: float | None = None, keep: bool = True) -> str | None:
        """Take one sample; `wall_s` is the wall-clock time spent measuring so far (default: the sum of
        all raw samples, which is what a synthetic stream means)."""
        if self.reason is not None:
            return self.reason
        self.n_raw += 1
        self.raw_ns += float(sample_ns)
        if keep:
            self.n_kept += 1
            delta = float(sample_ns) - self._mean
            self._mean += delta / self.n_kept
            self._m2 += delta * (float(sample_ns) - self._mean)
            self.measured_ns += float(sample_ns)
            if self.n_kept >= self.policy.min_samples:
                self._noise.append(self.cv)
        self.reason = self._decide(self.raw_ns / 1e9 if wall_s is None else wall_s)
        return self.reason

    def _decide(self, wall_s: float) -> str | None:
        p = self.policy
        if self.n_kept >= p.min_samples and self.measured_ns / 1e9 >= p.min_time_s:
            if self.cv <= p.target_rel_stdev:
                return "converged"
            if p.noise_stop and self._plateaued():
                return "noise_plateau"
        if self.n_raw >= p.max_samples:
            return "max_samples"
        if wall_s >= p.max_time_s:
            return "max_time"
        return None

    def _plateaued(self) -> bool:
        if len(self._noise) < self._noise.maxlen:  # type: ignore[operator]
            return False
        y = np.fromiter(self._noise, dtype=np.float64)
        if not np.all(np.isfinite(y)):
            return False
        x = np.arange(y.size, dtype=np.float64)
        slope = np.polyfit(x, y, 1)[0]
        drop = -slope * (y.size - 1)  # how much the fitted noise fell across the window
        return drop < self.policy.noise_min_improvement * float(y.mean())


@dataclass(frozen=True)
class StreamResult:
    stop_reason: str  # one of STOP_REASONS, or "exhausted" if the stream ended first
    n_used: int  # raw samples consumed
    n_kept: int
    cv: float


def run_stream(
    samples: Iterable[float], policy: MeasurePolicy, *, keep: Sequence[bool] | None = None
) -> StreamResult:
    """Run the stopping rule over a finished or synthetic stream; wall time is the sum of the samples."""
    rule = StoppingRule(policy)
    for i, s in enumerate(samples):
        if rule.add(s, keep=True if keep is None else bool(keep[i])):
            break
    return StreamResult(rule.reason or "exhausted", rule.n_raw, rule.n_kept, rule.cv)
