"""Change points in a series of measurements: E-divisive means (Matteson & James 2014).

The method, as MongoDB's signal-processing-algorithms and Apache Otava use it on performance history:
for a split of a segment at tau into X = x[:tau] and Y = x[tau:], the energy distance (alpha = 1)

    E(X, Y) = 2/(m n) sum |x_i - y_j|  -  1/C(m,2) sum_{i<k} |x_i - x_k|  -  1/C(n,2) sum_{j<l} |y_j - y_l|

scaled to Q(tau) = m n / (m + n) E(X, Y). The best split of a segment is the tau that maximises Q. Its
significance comes from a permutation test: the same statistic over random orderings of the segment
(a fixed seed, so the same series always gives the same answer); the split stands when the fraction
of permutations that reach it, p = (1 + #{Q_perm >= Q}) / (1 + permutations), is at most `p_value`.
Splits are found hierarchically: the most significant best split among all current segments is taken,
then its two halves are searched again, until no segment has a significant split.

A change point at index i means x[i] is the first value after the change; its magnitude is the ratio of
the medians of the segments on either side, minus one (+0.20: 20% slower when x is a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_P_VALUE = 0.01
DEFAULT_PERMUTATIONS = 199
DEFAULT_MIN_SIZE = 3  # fewest points on either side of a split
DEFAULT_SEED = 20140101


@dataclass(frozen=True)
class ChangePoint:
    index: int  # the first point after the change
    p_value: float
    before: float  # median of the segment before
    after: float  # median of the segment after

    @property
    def magnitude(self) -> float:
        """after / before - 1: +0.2 is a 20% increase (a slowdown for times)."""
        return self.after / self.before - 1 if self.before else float("inf")


def _best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """(tau, Q) of the best split of x, tau counted from the start of x; (-1, 0) if it is too short."""
    n = len(x)
    if n < 2 * min_size:
        return -1, 0.0
    d = np.abs(x[:, None] - x[None, :])
    # Every split at once (issue 46: a year's series is hundreds of points, and each of the permutations
    # searches every split): with R[i] = sum d[:i+1, :] (cumulated row sums) and W[t] the sum over the
    # pairs i < k < t (cumulated column sums of the upper triangle), a split at tau has
    #   sum d[:tau, tau:] = R[tau-1] - 2 W[tau],  sum d[:tau, :tau] = 2 W[tau],
    #   sum d[tau:, tau:] = R[n-1] - 2 R[tau-1] + 2 W[tau].
    r = np.cumsum(d.sum(axis=1))
    w2 = 2 * np.cumsum(np.triu(d, 1).sum(axis=0))  # w2[t - 1] = 2 W[t]
    tau = np.arange(min_size, n - min_size + 1)
    m, k = tau, n - tau
    between = r[tau - 1] - w2[tau - 1]
    within_x = w2[tau - 1]
    within_y = r[n - 1] - 2 * r[tau - 1] + w2[tau - 1]
    # the square blocks count each pair twice: their sum / (m (m-1)) is 1/C(m,2) sum_{i<k}
    q = m * k / (m + k) * (2 * (between / (m * k)) - within_x / (m * (m - 1)) - within_y / (k * (k - 1)))
    best = int(np.argmax(q))  # the first of equal maxima, as a scan from the left keeps
    return int(tau[best]), float(q[best])


def _significance(
    x: np.ndarray, q: float, min_size: int, permutations: int, rng: np.random.Generator, p_value: float
) -> float:
    """The permutation test's p of the split; it stops as soon as p must exceed `p_value` (the split
    does not stand, and the search ends there: a series without a change costs a few permutations, not
    all of them). A split that stands gets its exact p."""
    reached = 0
    for _ in range(permutations):
        reached += _best_split(rng.permutation(x), min_size)[1] >= q
        if (1 + reached) / (1 + permutations) > p_value:
            break
    return (1 + reached) / (1 + permutations)


def e_divisive(
    values: list[float] | np.ndarray,
    *,
    p_value: float = DEFAULT_P_VALUE,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = DEFAULT_SEED,
) -> list[ChangePoint]:
    """The significant change points of `values`, in order of index."""
    if min_size < 2:
        raise ValueError(f"min_size must be at least 2 (got {min_size})")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"values must be one series (got shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must all be finite")
    rng = np.random.default_rng(seed)
    cuts = [0, len(x)]  # segment boundaries
    found: dict[int, float] = {}
    while True:
        candidates = []
        for start, end in zip(cuts, cuts[1:], strict=False):
            tau, q = _best_split(x[start:end], min_size)
            if tau > 0:
                candidates.append((q, start, end, start + tau))
        if not candidates:
            break
        q, start, end, index = max(candidates)
        p = _significance(x[start:end], q, min_size, permutations, rng, p_value)
        if p > p_value:
            break
        found[index] = p
        cuts = sorted([*cuts, index])
    out = []
    bounds = sorted(found)
    for i, index in enumerate(bounds):
        lo = bounds[i - 1] if i else 0
        hi = bounds[i + 1] if i + 1 < len(bounds) else len(x)
        before, after = float(np.median(x[lo:index])), float(np.median(x[index:hi]))
        out.append(ChangePoint(index=index, p_value=found[index], before=before, after=after))
    return out
