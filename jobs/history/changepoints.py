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
    # prefix sums so that each split's three sums are O(1): within[a:b] = sum over a <= i < k < b
    row = np.cumsum(np.cumsum(d, axis=0), axis=1)  # row[i, j] = sum d[:i+1, :j+1]

    def block(r0: int, r1: int, c0: int, c1: int) -> float:  # sum d[r0:r1, c0:c1]
        total = row[r1 - 1, c1 - 1]
        if r0:
            total -= row[r0 - 1, c1 - 1]
        if c0:
            total -= row[r1 - 1, c0 - 1]
        if r0 and c0:
            total += row[r0 - 1, c0 - 1]
        return float(total)

    best_tau, best_q = -1, -np.inf
    for tau in range(min_size, n - min_size + 1):
        m, k = tau, n - tau
        between = block(0, tau, tau, n) / (m * k)
        # the square block counts each pair twice: its sum / (m (m-1)) is 1/C(m,2) sum_{i<k}
        within_x = block(0, tau, 0, tau) / (m * (m - 1))
        within_y = block(tau, n, tau, n) / (k * (k - 1))
        q = m * k / (m + k) * (2 * between - within_x - within_y)
        if q > best_q:
            best_tau, best_q = tau, q
    return best_tau, float(best_q)


def _significance(
    x: np.ndarray, q: float, min_size: int, permutations: int, rng: np.random.Generator
) -> float:
    reached = sum(_best_split(rng.permutation(x), min_size)[1] >= q for _ in range(permutations))
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
        p = _significance(x[start:end], q, min_size, permutations, rng)
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
