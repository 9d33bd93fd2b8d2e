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

import copy
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

DEFAULT_P_VALUE = 0.01
DEFAULT_PERMUTATIONS = 199
DEFAULT_MIN_SIZE = 3  # fewest points on either side of a split
DEFAULT_SEED = 20140101
TIE = 1e-9  # relative: two statistics this close are one (summed in another order)
FIRST_BATCH = 4  # orderings scored at once in a permutation test, doubling while it goes on
BATCH_CELLS = 1 << 20  # at most this many values in one batch of orderings
SHORT = 96  # segments up to this long are scored from their distances (see _earlier)
# the first tests of many series (`_first_tests`): while many series' tests go on, a batch is a few
# orderings of each (at least MANY_BATCH, MANY_ORDERINGS in all): most stop at their second (p > 0.01 of
# 199), and batches doubling from FIRST_BATCH for all of them scored a family's 1,000 series' orderings
# 1.3 times over; when few go on (a stepped series, or one series), doubling batches save numpy calls
MANY_BATCH = 2
MANY_ORDERINGS = 256


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


def _prepared(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(v, rank, rowsum) of a segment (or of each row of segments of one length, along the last axis): its
    values less their minimum (the distances unchanged, the sums small), each value's rank (ties in order
    of position) and its sum of distances to every value."""
    n = x.shape[-1]
    v = x - x.min(axis=-1, keepdims=True)
    order = np.argsort(v, axis=-1, kind="stable")
    j = np.broadcast_to(np.arange(n), v.shape)
    rank = np.empty(v.shape, dtype=np.int64)
    np.put_along_axis(rank, order, j, axis=-1)
    s = np.take_along_axis(v, order, axis=-1)
    zero = np.zeros((*v.shape[:-1], 1))
    before = np.concatenate((zero, np.cumsum(s, axis=-1)), axis=-1)  # before[j]: the sum of the j smallest
    sums = s * j - before[..., :-1] + (before[..., -1:] - before[..., 1:]) - s * (n - 1 - j)
    rowsum = np.empty(v.shape)
    np.put_along_axis(rowsum, order, sums, axis=-1)
    return v, rank, rowsum


def _earlier(v: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """For each row b and position t, sum_{i<t} |v[b,i] - v[b,t]|, in O(n log^2 n) a row: every pair
    i < t meets at one level of a bottom-up merge (the level at which i is in the left half and t in the
    right half of one block), where t's earlier smaller values are counted and summed by a search in the
    left half's sorted ranks. |v_i - v_t| summed over i < t is v_t (2 c - t) + (sum_{i<t} v_i) - 2 s, with
    c of them smaller than v_t, summing to s. Up to SHORT points, the distances themselves (fewer numpy
    calls: a nightly team's month is 150 points)."""
    rows, n = v.shape
    if n <= SHORT:
        lower = _lower(n)  # [t, i]: i < t
        d = v[:, :, None] - v[:, None, :]
        np.abs(d, out=d)  # in place: one array of the distances, not three
        d *= lower
        return d.sum(axis=2)
    t = np.arange(n)
    count = np.zeros((rows, n))
    below = np.zeros((rows, n))
    row = np.arange(rows)[:, None]
    half = 1
    while half < n:
        right = (t // half) % 2 == 1
        blocks = -(-n // (2 * half))
        group = row * blocks + t[None, :] // (2 * half)  # one block of one row
        left_keys = (group[:, ~right] * n + rank[:, ~right]).ravel()
        order = np.argsort(left_keys, kind="stable")
        keys = left_keys[order]
        sums = np.concatenate(([0.0], np.cumsum(v[:, ~right].ravel()[order])))
        at = np.searchsorted(keys, (group[:, right] * n + rank[:, right]).ravel())
        start = np.searchsorted(keys, (group[:, right] * n).ravel())
        count[:, right] += (at - start).reshape(rows, -1)
        below[:, right] += (sums[at] - sums[start]).reshape(rows, -1)
        half *= 2
    return v * (2 * count - t) + (np.cumsum(v, axis=1) - v) - 2 * below


@cache
def _lower(n: int) -> np.ndarray:
    """[t, i]: 1.0 where i < t, else 0.0 (n by n)."""
    out = (np.arange(n)[None, :] < np.arange(n)[:, None]).astype(float)
    out.flags.writeable = False
    return out


def _scores(v: np.ndarray, rank: np.ndarray, rowsum: np.ndarray, min_size: int) -> np.ndarray:
    """Q(tau) of every split (columns: tau = min_size .. n - min_size) of every row (an ordering of one
    segment: v, rank and rowsum its values, ranks and row sums in that order). With R[i] the cumulated
    row sums and W[t] the sum over the pairs i < k < t (cumulated `_earlier`), a split at tau has
      sum d[:tau, tau:] = R[tau-1] - 2 W[tau],  sum d[:tau, :tau] = 2 W[tau],
      sum d[tau:, tau:] = R[n-1] - 2 R[tau-1] + 2 W[tau]."""
    n = v.shape[1]
    r = np.cumsum(rowsum, axis=1)
    w2 = 2 * np.cumsum(_earlier(v, rank), axis=1)  # w2[:, t - 1] = 2 W[t]
    tau = np.arange(min_size, n - min_size + 1)
    m, k = tau, n - tau
    between = r[:, tau - 1] - w2[:, tau - 1]
    within_x = w2[:, tau - 1]
    within_y = r[:, n - 1 : n] - 2 * r[:, tau - 1] + w2[:, tau - 1]
    # the square blocks count each pair twice: their sum / (m (m-1)) is 1/C(m,2) sum_{i<k}
    return m * k / (m + k) * (2 * (between / (m * k)) - within_x / (m * (m - 1)) - within_y / (k * (k - 1)))


def _best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """(tau, Q) of the best split of x, tau counted from the start of x; (-1, 0) if it is too short."""
    n = len(x)
    if n < 2 * min_size:
        return -1, 0.0
    v, rank, rowsum = _prepared(x)
    q = _scores(v[None, :], rank[None, :], rowsum[None, :], min_size)[0]
    best = int(np.argmax(q))  # the first of equal maxima, as a scan from the left keeps
    return best + min_size, float(q[best])


def _significance(
    x: np.ndarray, q: float, min_size: int, permutations: int, rng: np.random.Generator, p_value: float
) -> float:
    """The permutation test's p of the split, p = (1 + #{Q_perm >= Q}) / (1 + permutations), a Q_perm
    within TIE (relative) of Q counting as equal (the same arrangement's statistic summed in another
    order). The orderings are drawn one by one from `rng` as `rng.permutation(x)` draws them and scored
    a batch at a time (the distances of a segment reused: every ordering's row sums are its values' own,
    and the pairs before each point cost log^2 n, not n); the test stops at the first ordering after
    which p must exceed `p_value` (the split does not stand, and the search ends there: a series without
    a change costs a few orderings, not all of them), so p is what the test one ordering at a time gives.
    A split that stands gets its exact p."""
    v, rank, rowsum = _prepared(x)
    reach = q - TIE * abs(q)
    reached, done, batch = 0, 0, FIRST_BATCH
    while done < permutations:
        take = min(batch, permutations - done, max(1, BATCH_CELLS // len(x)))
        order = np.stack([rng.permutation(len(x)) for _ in range(take)])
        best = _scores(v[order], rank[order], rowsum[order], min_size).max(axis=1)
        hits = np.cumsum(best >= reach) + reached
        over = np.flatnonzero((1 + hits) / (1 + permutations) > p_value)
        if len(over):
            return (1 + int(hits[over[0]])) / (1 + permutations)
        reached, done, batch = int(hits[-1]), done + take, batch * 2
    return (1 + reached) / (1 + permutations)


def _checked(values: Sequence[float] | np.ndarray, min_size: int) -> np.ndarray:
    if min_size < 2:
        raise ValueError(f"min_size must be at least 2 (got {min_size})")
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"values must be one series (got shape {x.shape})")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must all be finite")
    return x


def _best_rows(v: np.ndarray, rank: np.ndarray, rowsum: np.ndarray, min_size: int) -> np.ndarray:
    """The best Q of every row (`_scores`' rows), at most BATCH_CELLS distances' worth of rows at once."""
    n = v.shape[1]
    step = max(1, BATCH_CELLS // (n * n if n <= SHORT else n))
    parts = [
        _scores(v[i : i + step], rank[i : i + step], rowsum[i : i + step], min_size).max(axis=1)
        for i in range(0, len(v), step)
    ]
    return np.concatenate(parts)


def _first_tests(
    v: np.ndarray, rank: np.ndarray, rowsum: np.ndarray, q: np.ndarray, min_size: int, permutations: int,
    p_value: float, seed: int,
) -> tuple[np.ndarray, np.random.Generator]:  # fmt: skip
    """For segments of one length (rows of v, rank and rowsum as `_prepared` makes them, q their best
    splits' Q), the p of the permutation test of each best split, NaN where it stops with p > p_value, and
    the generator as such a test that does not stop leaves it. Each segment's test, with a fresh generator
    of `seed`, draws the same orderings (it draws nothing else): they are drawn once, a batch at a time
    (doubling from FIRST_BATCH, as `_significance` draws them, but no more than MANY_ORDERINGS orderings of
    all pending segments together, and no fewer than MANY_BATCH), and every pending segment's batch scored
    in one numpy call; the same hits, so the same p, as `_significance` with a fresh generator (what a
    test that stands draws, all its orderings, does not depend on how they are batched)."""
    rows, n = v.shape
    rng = np.random.default_rng(seed)
    reach = q - TIE * np.abs(q)
    reached = np.zeros(rows, dtype=np.int64)
    p = np.full(rows, np.nan)
    pending = np.arange(rows)
    done, batch = 0, FIRST_BATCH
    while done < permutations and len(pending):
        many = max(MANY_BATCH, MANY_ORDERINGS // len(pending))  # a batch's orderings of all pending rows
        take = min(batch, many, permutations - done, max(1, BATCH_CELLS // n))
        order = np.stack([rng.permutation(n) for _ in range(take)])
        src = np.repeat(pending, take)[:, None]
        at = np.tile(order, (len(pending), 1))
        best = _best_rows(v[src, at], rank[src, at], rowsum[src, at], min_size)
        hits = (
            np.cumsum(best.reshape(len(pending), take) >= reach[pending, None], axis=1)
            + reached[pending, None]
        )
        over = ((1 + hits) / (1 + permutations) > p_value).any(axis=1)
        reached[pending] = hits[:, -1]
        pending = pending[~over]
        done, batch = done + take, batch * 2
    final = (1 + reached[pending]) / (1 + permutations)
    p[pending] = np.where(final <= p_value, final, np.nan)  # none stands without orderings to test it
    return p, rng


def e_divisive_many(
    series: Sequence[Sequence[float] | np.ndarray],
    *,
    p_value: float = DEFAULT_P_VALUE,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = DEFAULT_SEED,
) -> list[list[ChangePoint]]:
    """`[e_divisive(x) for x in series]`, the same change points, with the first step of each search (the
    best split of the whole series and its permutation test) taken for all series of one length together:
    a numpy call a batch of all of them, not one a series (a family's 1,000 series of 30 points took 0.4
    ms each, mostly numpy's overhead a call). A series whose first split does not stand has no change
    point (e_divisive's search ends there); a series whose does is searched on from it as e_divisive
    searches it (its first test not run again: 1,000 series of 50 points, a tenth stepped, 0.57 -> 0.30 s)."""
    xs = [_checked(x, min_size) for x in series]
    out: list[list[ChangePoint]] = [[] for _ in xs]
    by_length: dict[int, list[int]] = defaultdict(list)
    for i, x in enumerate(xs):
        if len(x) >= 2 * min_size:  # a shorter one has no split
            by_length[len(x)].append(i)
    for ids in by_length.values():
        v, rank, rowsum = _prepared(np.stack([xs[i] for i in ids]))
        q = _best_rows(v, rank, rowsum, min_size)
        p, rng = _first_tests(v, rank, rowsum, q, min_size, permutations, p_value, seed)
        for i, first_p in zip(ids, p, strict=True):
            if not np.isnan(first_p):  # the first split stands: the search goes on from there
                tau, _ = _best_split(xs[i], min_size)
                found = {tau: float(first_p)}
                out[i] = _search(xs[i], copy.deepcopy(rng), found, p_value, permutations, min_size)
    return out


def e_divisive(
    values: list[float] | np.ndarray,
    *,
    p_value: float = DEFAULT_P_VALUE,
    permutations: int = DEFAULT_PERMUTATIONS,
    min_size: int = DEFAULT_MIN_SIZE,
    seed: int = DEFAULT_SEED,
) -> list[ChangePoint]:
    """The significant change points of `values`, in order of index."""
    x = _checked(values, min_size)
    return _search(x, np.random.default_rng(seed), {}, p_value, permutations, min_size)


def _search(
    x: np.ndarray, rng: np.random.Generator, found: dict[int, float], p_value: float, permutations: int,
    min_size: int,
) -> list[ChangePoint]:  # fmt: skip
    """The search of e_divisive from the change points `found` (index: p) on, the orderings of its tests
    drawn from `rng` (as the tests of `found` left it)."""
    cuts = sorted({0, len(x), *found})  # segment boundaries
    splits: dict[tuple[int, int], tuple[int, float]] = {}  # each segment's best split, found once
    while True:
        candidates = []
        for start, end in zip(cuts, cuts[1:], strict=False):
            if (start, end) not in splits:
                splits[start, end] = _best_split(x[start:end], min_size)
            tau, q = splits[start, end]
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
