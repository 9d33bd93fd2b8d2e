"""Descriptive statistics of a set of timing samples (all in ns; cv as a fraction)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class SampleStats:
    n: int
    median: float
    mean: float
    min: float
    max: float
    p10: float
    p90: float
    iqr: float
    mad: float  # median absolute deviation from the median (unscaled)
    stdev: float  # sample standard deviation (ddof=1; 0 for one sample)
    cv: float  # stdev / mean

    def to_dict(self) -> dict[str, float | int]:
        return {
            k: (v if not (isinstance(v, float) and not math.isfinite(v)) else None)
            for k, v in asdict(self).items()
        }


def summarize(samples: Sequence[float] | np.ndarray) -> SampleStats:
    """Summary of the samples; an empty sequence gives n=0 and NaN everywhere else."""
    x = np.asarray(samples, dtype=np.float64)
    if x.size == 0:
        nan = float("nan")
        return SampleStats(0, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan)
    median = float(np.median(x))
    mean = float(x.mean())
    p10, p25, p75, p90 = (float(v) for v in np.percentile(x, [10, 25, 75, 90]))
    stdev = float(x.std(ddof=1)) if x.size > 1 else 0.0
    return SampleStats(
        n=int(x.size),
        median=median,
        mean=mean,
        min=float(x.min()),
        max=float(x.max()),
        p10=p10,
        p90=p90,
        iqr=p75 - p25,
        mad=float(np.median(np.abs(x - median))),
        stdev=stdev,
        cv=stdev / mean if mean > 0 else float("inf"),
    )
