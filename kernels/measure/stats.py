"""Comparison statistics over raw timing samples, and a step (changepoint) detector for a sample stream.

`compare_samples(baseline, candidate)` follows the regression anchors of REFERENCE.md: the ratio of medians
(candidate / baseline; above 1 is slower), a bootstrap confidence interval of that ratio (seeded, so the
same samples always give the same answer), and a two-sided Mann-Whitney U test. Verdict:
  "faster"/"slower"  |ratio - 1| >= min_effect, p < alpha, and the interval excludes 1; when either side's
                     dispersion (robust cv: 1.4826 MAD / median, so one preempted sample does not make a
                     clear shift ambiguous) is above max_cv, the whole interval must also lie further from 1
                     than that dispersion (and than min_effect): clearly outside the noise;
  "same"             neither side noisy and the whole interval lies within 1 +- min_effect;
  "ambiguous"        everything else, in particular any noisy pair whose shift is not clearly outside the
                     noise: high dispersion is never a pass.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

VERDICTS = ("faster", "slower", "same", "ambiguous")


def _cv(x: np.ndarray) -> float | None:
    """The samples' cv; None where it is undefined (fewer than 2 samples, a mean of zero or less)."""
    if x.size < 2 or not np.all(np.isfinite(x)) or x.mean() <= 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def _robust_cv(x: np.ndarray) -> float:
    """1.4826 * MAD / median: the cv of normal noise, but one preempted sample cannot inflate it."""
    if x.size < 2:
        return math.inf
    med = float(np.median(x))
    if med <= 0:
        return math.inf
    return float(1.4826 * np.median(np.abs(x - med)) / med)


def finite_or_none(v: object) -> float | None:
    """A stored number read back: a finite int or float as a float, anything else (None, NaN, inf, a
    string, a bool) as None, the one spelling of "undefined"."""
    ok = isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
    return float(v) if ok else None


@dataclass(frozen=True)
class Comparison:
    """The within-run comparison of two sets of samples. A figure that cannot be computed (a side of
    fewer than 3 samples, a zero median, a cv of one sample) is None, never NaN or inf: `reason` says why.
    `to_dict` is the stored form; `from_stored` reads it back typed."""

    verdict: str
    reason: str
    ratio: float | None  # median(candidate) / median(baseline); > 1 means the candidate is slower
    ci_low: float | None
    ci_high: float | None
    confidence: float
    p_value: float | None
    cv_baseline: float | None
    cv_candidate: float | None
    n_baseline: int
    n_candidate: int
    min_effect: float
    alpha: float
    max_cv: float

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> Comparison:
        """A comparison as `to_dict` stored it (or as it sits, flattened, in a run-level comparison or an
        anomaly's evidence) read back typed: a missing or non-finite figure is None, an unknown verdict
        is "ambiguous"."""
        d = data if isinstance(data, Mapping) else {}

        def count(key: str) -> int:
            v = d.get(key)
            return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

        def param(key: str, default: float) -> float:
            v = finite_or_none(d.get(key))
            return default if v is None else v

        verdict = d.get("within_verdict", d.get("verdict"))
        return cls(
            verdict=verdict if verdict in VERDICTS else "ambiguous",
            reason=str(d.get("within_reason", d.get("reason")) or ""),
            ratio=finite_or_none(d.get("ratio")), ci_low=finite_or_none(d.get("ci_low")),
            ci_high=finite_or_none(d.get("ci_high")), confidence=param("confidence", 0.99),
            p_value=finite_or_none(d.get("p_value")),
            cv_baseline=finite_or_none(d.get("cv_baseline")),
            cv_candidate=finite_or_none(d.get("cv_candidate")),
            n_baseline=count("n_baseline"), n_candidate=count("n_candidate"),
            min_effect=param("min_effect", 0.05), alpha=param("alpha", 0.002), max_cv=param("max_cv", 0.02),
        )  # fmt: skip


def bootstrap_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """`n_boot` bootstrap medians of `x`: each the median of n draws with replacement from x's n values,
    drawn without drawing the n values (median_positions). The same distribution as resampling (tests
    check it), at 3 or 4 draws a median instead of n."""
    xs = np.sort(x)
    low, high = median_positions(xs.size, n_boot, rng)
    return (xs[low] + xs[high]) / 2.0


def median_positions(n: int, n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Where the middle one or two of n draws with replacement from n sorted values fall, `n_boot` times:
    (lower, upper) indices into the sorted values, the same for odd n. The draws' order statistics are those
    of n uniforms mapped onto the sorted values (floor(n u)), so only the middle ones are drawn: the k-th
    smallest of n uniforms is Beta(k, n - k + 1) (a ratio of gammas), and the next one lies above it as the
    least of the other n - k, a Beta(1, n - k) of the rest of the interval (1 - v^(1/(n-k)), v uniform)."""

    def index(u: np.ndarray) -> np.ndarray:
        return np.minimum((u * n).astype(np.int64), n - 1)

    k = (n + 1) // 2  # the lower middle one (the middle one for odd n)
    below = rng.standard_gamma(k, n_boot)
    u = below / (below + rng.standard_gamma(n - k + 1, n_boot))
    low = index(u)
    if n % 2:
        return low, low
    return low, index(u + (1.0 - u) * (1.0 - rng.random(n_boot) ** (1.0 / (n - k))))


@functools.lru_cache(maxsize=64)
def _ratio_positions(seed: int, n_candidate: int, n_baseline: int, n_boot: int) -> tuple[np.ndarray, ...]:
    """A ratio interval's draws depend only on the seed and the sides' sizes: a report's 750 intervals of
    100-sample trials draw them once (read-only arrays, 4 x 8 B x n_boot a size pair)."""
    rng = np.random.default_rng(seed)
    drawn = (*median_positions(n_candidate, n_boot, rng), *median_positions(n_baseline, n_boot, rng))
    for a in drawn:
        a.setflags(write=False)
    return drawn


def bootstrap_ratio_ci(
    baseline: np.ndarray, candidate: np.ndarray, *, n_boot: int, confidence: float, seed: int
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(candidate)/median(baseline), resampling each side
    (bootstrap_medians: the resamples' medians drawn directly, the candidate's then the baseline's from
    one generator of `seed`)."""
    low, high = bootstrap_ratio_cis(
        np.sort(baseline)[None, :],
        np.sort(candidate)[None, :],
        n_boot=n_boot,
        confidence=confidence,
        seed=seed,
    )
    return float(low[0]), float(high[0])


def bootstrap_ratio_cis(
    baselines: np.ndarray, candidates: np.ndarray, *, n_boot: int, confidence: float, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """bootstrap_ratio_ci of many pairs at once: row i of `baselines` and of `candidates` (2-D, each row
    sorted, every row of a side the same size) is a pair; the pairs share their draws, which depend only
    on the seed and the sizes (a job page's 850 intervals one at a time were 0.12 s). The lows and highs."""
    c_low, c_high, b_low, b_high = _ratio_positions(
        int(seed), candidates.shape[1], baselines.shape[1], int(n_boot)
    )
    ratios = ((candidates[:, c_low] + candidates[:, c_high]) / 2.0) / (
        (baselines[:, b_low] + baselines[:, b_high]) / 2.0
    )
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(ratios, [tail, 100.0 - tail], axis=1)
    return low, high


def mann_whitney_p(x: np.ndarray, y: np.ndarray) -> float:
    """The two-sided Mann-Whitney U test's p-value, as scipy.stats.mannwhitneyu(x, y) gives it: the normal
    approximation with the tie and continuity corrections; SciPy's exact distribution where it uses it (a
    side of 8 or fewer samples and no ties). Numpy's ranks here: SciPy's call costs ~2 ms of checks (half a
    second for a comparison of 250 shapes) and its import 1 s."""
    n1, n2 = x.size, y.size
    _values, inverse, counts = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    ties = bool(np.any(counts > 1))
    if (n1 <= 8 or n2 <= 8) and not ties:
        from scipy.stats import mannwhitneyu

        return float(mannwhitneyu(x, y, alternative="two-sided").pvalue)
    mean_rank = np.cumsum(counts) - (counts - 1) / 2.0  # each distinct value's average rank (from 1)
    u1 = float(mean_rank[inverse[:n1]].sum()) - n1 * (n1 + 1) / 2.0
    u = max(u1, n1 * n2 - u1)
    n = n1 + n2
    tie_term = float(np.sum(counts.astype(np.float64) ** 3 - counts))
    var = n1 * n2 / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if var <= 0:  # every value the same: U is its mean, no evidence either way
        return 1.0
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(var)
    return min(1.0, max(0.0, math.erfc(z / math.sqrt(2.0))))  # 2 x the normal's upper tail at z


def compare_samples(
    baseline_samples: Sequence[float],
    candidate_samples: Sequence[float],
    *,
    min_effect: float = 0.05,
    alpha: float = 0.002,
    max_cv: float = 0.02,
    n_boot: int = 2000,
    confidence: float = 0.99,
    seed: int = 0,
) -> Comparison:
    """Compare two sets of raw timing samples (lower is better); see the module docstring for the rule.

    asv's regression factor 1.1 corresponds to min_effect=0.1."""
    if not 0 < min_effect < 1:
        raise ValueError(f"min_effect must be in (0, 1), got {min_effect}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    b = np.asarray(baseline_samples, dtype=np.float64)
    c = np.asarray(candidate_samples, dtype=np.float64)
    params = {"min_effect": min_effect, "alpha": alpha, "max_cv": max_cv, "confidence": confidence}
    if b.size < 3 or c.size < 3 or not (np.all(np.isfinite(b)) and np.all(np.isfinite(c))):
        return Comparison(
            "ambiguous",
            f"too few or non-finite samples (baseline n={b.size}, candidate n={c.size}): no ratio",
            None, None, None, confidence, None, _cv(b), _cv(c), int(b.size), int(c.size),
            min_effect, alpha, max_cv,
        )  # fmt: skip
    if not (np.median(b) > 0 and np.median(c) > 0):
        return Comparison(
            "ambiguous", "a median of zero: no ratio", None, None, None, confidence, None, _cv(b), _cv(c),
            int(b.size), int(c.size), min_effect, alpha, max_cv,
        )  # fmt: skip
    ratio = float(np.median(c) / np.median(b))
    low, high = bootstrap_ratio_ci(b, c, n_boot=n_boot, confidence=confidence, seed=seed)
    p = mann_whitney_p(b, c)
    cv_b, cv_c = _cv(b), _cv(c)
    # The verdict's dispersion gate uses a robust spread; the raw cvs are reported as they are.
    noise = max(_robust_cv(b), _robust_cv(c))
    verdict, reason = _verdict(ratio, low, high, p, noise, **params)
    return Comparison(
        verdict, reason, ratio, low, high, confidence, p, cv_b, cv_c, int(b.size), int(c.size),
        min_effect, alpha, max_cv,
    )  # fmt: skip


def _verdict(
    ratio: float,
    low: float,
    high: float,
    p: float,
    noise: float,
    *,
    min_effect: float,
    alpha: float,
    max_cv: float,
    confidence: float,
) -> tuple[str, str]:
    effect = abs(ratio - 1.0)
    noisy = noise > max_cv
    excludes_one = low > 1.0 or high < 1.0
    direction = "slower" if ratio > 1.0 else "faster"
    if effect >= min_effect and p < alpha and excludes_one:
        if not noisy:
            return direction, f"{effect:.1%} change >= {min_effect:.1%}, p={p:.2g} < {alpha}"
        near = (low - 1.0) if ratio > 1.0 else (1.0 - high)  # the interval's end nearest to no change
        if near > max(noise, min_effect):
            return direction, f"even the interval's near end ({near:.1%}) exceeds the noise (cv {noise:.1%})"
        return "ambiguous", f"{effect:.1%} change is inside the noise (cv {noise:.1%} > {max_cv:.1%})"
    if noisy:
        return "ambiguous", f"dispersion too high (cv {noise:.1%} > {max_cv:.1%}): no pass on noisy data"
    if 1.0 - min_effect < low and high < 1.0 + min_effect:
        return "same", f"{confidence:.0%} interval [{low:.4f}, {high:.4f}] within 1 +- {min_effect:.1%}"
    return "ambiguous", (
        f"ratio {ratio:.4f}, {confidence:.0%} interval [{low:.4f}, {high:.4f}], p={p:.2g}: "
        f"neither a clear change of >= {min_effect:.1%} nor clearly within it"
    )


# -- step detection ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    index: int  # first sample of the second segment
    before_median: float
    after_median: float
    shift: float  # after_median / before_median - 1
    t_stat: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def detect_step(
    samples: Sequence[float] | np.ndarray,
    *,
    min_segment: int = 10,
    min_shift: float = 0.02,
    threshold: float = 6.0,
) -> Step | None:
    """Find the single split of the stream that best separates two means (max two-sample t statistic
    over all splits, pooled variance); report it when t >= threshold and the medians on the two sides
    differ by at least min_shift (relative), else None. The median check keeps lone spikes from
    counting as a step; the high threshold allows for having searched over every split."""
    x = np.asarray(samples, dtype=np.float64)
    n = x.size
    if n < 2 * min_segment or not np.all(np.isfinite(x)):
        return None
    centred = x - np.median(x)
    s1 = np.concatenate([[0.0], np.cumsum(centred)])
    s2 = np.concatenate([[0.0], np.cumsum(centred * centred)])
    k = np.arange(min_segment, n - min_segment + 1)
    left_mean = s1[k] / k
    right_mean = (s1[n] - s1[k]) / (n - k)
    within = (s2[k] - k * left_mean**2) + (s2[n] - s2[k] - (n - k) * right_mean**2)
    var = np.maximum(within, 0.0) / (n - 2)
    diff = np.abs(left_mean - right_mean)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(
            var > 0, diff / np.sqrt(var * (1.0 / k + 1.0 / (n - k))), np.where(diff > 0, np.inf, 0.0)
        )
    best = int(np.argmax(t))
    split = int(k[best])
    before, after = float(np.median(x[:split])), float(np.median(x[split:]))
    shift = after / before - 1.0 if before > 0 else math.inf
    if t[best] < threshold or abs(shift) < min_shift:
        return None
    return Step(split, before, after, shift, float(t[best]))


def drift_of(samples: list[int]) -> float:
    """How far a run moved from its start to its end, as |log| of the ratio: the last third's median over
    the first third's (from 6 samples on), else the last sample over the first; 0 for fewer than 3."""
    n = len(samples)
    if n < 3 or min(samples) <= 0:
        return 0.0
    if n < 6:
        return abs(math.log(samples[-1] / samples[0]))
    third = n // 3
    return abs(math.log(float(np.median(samples[-third:])) / float(np.median(samples[:third]))))
