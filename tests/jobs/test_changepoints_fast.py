"""E-divisive means at a year's series lengths (issue 46): every split of a segment is scored at once, the
orderings of a permutation test scored a batch at a time on the segment's own ranks and row sums (the
pairs before each point in log^2 n, not n), and a test stops as soon as its split cannot stand. None of it
changes an answer: the best split and its Q are the energy statistic's, straight from its definition, and
the change points (indices, p-values, levels) are those of the search written out plainly (a distance
matrix per ordering, every ordering run one at a time), on random series with none, one and several
changes, with ties (few distinct values) and without."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.history import changepoints as cp
from jobs.history.changepoints import DEFAULT_SEED, _best_split, e_divisive


def _q(x: np.ndarray, tau: int) -> float:
    """Q(tau) from the definition (module docstring of jobs.history.changepoints)."""
    a, b = x[:tau], x[tau:]
    m, k = len(a), len(b)
    between = np.abs(a[:, None] - b[None, :]).sum() / (m * k)
    within_a = np.abs(a[:, None] - a[None, :]).sum() / (m * (m - 1))
    within_b = np.abs(b[:, None] - b[None, :]).sum() / (k * (k - 1))
    return m * k / (m + k) * (2 * between - within_a - within_b)


def _plain_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """The best split from the definition, every tau scanned from the left."""
    if len(x) < 2 * min_size:
        return -1, 0.0
    qs = [(_q(x, t), t) for t in range(min_size, len(x) - min_size + 1)]
    best = max(q for q, _ in qs)
    return next(t for q, t in qs if q >= best - 1e-9 * abs(best)), best


def _plain(values, p_value=0.01, permutations=199, min_size=3) -> list[tuple[int, float]]:
    """The search with every permutation run, one at a time: (index, p) of each change point."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(DEFAULT_SEED)
    cuts, found = [0, len(x)], {}
    while True:
        cands = [(*_plain_split(x[s:e], min_size)[::-1], s, e) for s, e in zip(cuts, cuts[1:], strict=False)]
        cands = [(q, s, e, s + tau) for q, tau, s, e in cands if tau > 0]
        if not cands:
            break
        q, s, e, index = max(cands)
        seg = x[s:e]
        perms = [_plain_split(rng.permutation(seg), min_size)[1] for _ in range(permutations)]
        p = (1 + sum(qp >= q - 1e-9 * abs(q) for qp in perms)) / (1 + permutations)
        if p > p_value:
            break
        found[index] = p
        cuts = sorted([*cuts, index])
    return sorted(found.items())


@pytest.mark.parametrize("n", [6, 7, 20, 61, 200])
def test_the_best_split_is_the_definitions(n):
    x = np.random.default_rng(n).normal(100, 5, n)
    x[n // 2 :] += 8
    tau, q = _best_split(x, 3)
    qs = {t: _q(x, t) for t in range(3, n - 3 + 1)}
    assert tau == max(qs, key=lambda t: (qs[t], -t)) and q == pytest.approx(qs[tau], rel=1e-9)


@pytest.mark.parametrize("n", [37, cp.SHORT, cp.SHORT + 1, 150])
def test_every_orderings_score_is_the_definitions(n):
    """The batch of orderings (rows), each row's best Q as its own series' best split: from the distances
    (up to SHORT points) and from the merge's counts (longer)."""
    x = np.random.default_rng(n).normal(0, 1, n)
    x[n // 2 :] += 1
    v, rank, rowsum = cp._prepared(x)
    orders = np.stack([np.random.default_rng(i).permutation(len(x)) for i in range(5)])
    best = cp._scores(v[orders], rank[orders], rowsum[orders], 3).max(axis=1)
    assert best == pytest.approx([_plain_split(x[o], 3)[1] for o in orders], rel=1e-9)
    assert cp._earlier(v[orders], rank[orders]) == pytest.approx(
        np.array([[np.abs(x[o][:t] - x[o][t]).sum() for t in range(n)] for o in orders]), rel=1e-9, abs=1e-9
    )


def _series(seed: int, n: int, steps: tuple[float, ...], levels: int | None) -> np.ndarray:
    """Noise around 1 ms with `steps` (relative) at equal spacing; `levels`: only that many distinct noise
    values (integers, as the synthetic store's pool of draws gives: ties everywhere)."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(0, 0.01, n) if levels is None else rng.integers(0, levels, n) * 0.004
    x = 1e6 * (1 + noise)
    for i, step in enumerate(steps):
        x[(i + 1) * n // (len(steps) + 1) :] *= 1 + step
    return np.rint(x) if levels is not None else x


@pytest.mark.parametrize(
    ("seed", "n", "steps", "levels"),
    [
        (0, 90, (), None),
        (1, 90, (0.1,), None),
        (2, 90, (0.08, 0.2), None),
        (3, 120, (0.03, -0.05, 0.04), None),
        (4, 64, (0.02,), 4),
        (5, 80, (), 4),
        (6, 150, (0.01, 0.05), 3),
    ],
)
def test_the_change_points_are_the_plain_searchs(seed, n, steps, levels):
    x = _series(seed, n, steps, levels)
    got = [(c.index, c.p_value) for c in e_divisive(list(x))]
    assert got == _plain(x)
    if levels is None:
        assert len(got) >= len(steps) and (steps or not got)  # the steps are found, none in noise alone


@pytest.mark.parametrize("seed", range(12))
def test_random_series_give_the_plain_searchs_decisions(seed):
    """Random lengths, steps and p-value levels: the same splits and the same p (the decisions with them)
    as the plain search, with the same seed."""
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(12, 70))
    steps = tuple(float(s) for s in rng.normal(0, 0.05, int(rng.integers(0, 3))))
    x = _series(seed, n, steps, None if seed % 3 else int(rng.integers(2, 6)))
    p_value = float(rng.choice([0.01, 0.05]))
    got = [(c.index, c.p_value) for c in e_divisive(x, p_value=p_value, permutations=99)]
    assert got == _plain(x, p_value=p_value, permutations=99)


@pytest.mark.parametrize("seed", [1, 2])
def test_many_series_at_once_give_each_series_own_change_points(seed):
    """e_divisive_many (the first step of every series' search taken together, issue 46) gives what
    e_divisive gives each series: series of several lengths (too short for a split, short, over SHORT),
    without a change, with one or two, with ties, in one call."""
    rng = np.random.default_rng(seed)
    series = []
    for n in (4, 5, 6, 7, 12, 30, 30, 30, 41, cp.SHORT + 9):
        for kind in range(6):
            x = 100 + rng.normal(0, 2, n)
            if kind in (1, 2):
                x[n // 2 :] += 15 * kind  # one step
            if kind == 3:
                x[n // 3 :] += 10
                x[2 * n // 3 :] -= 25  # two
            if kind == 4:
                x = rng.integers(0, 3, n).astype(float)  # few distinct values
            series.append(list(x))
    many = cp.e_divisive_many(series)
    assert many == [e_divisive(x) for x in series]
    assert sum(bool(found) for found in many) >= 10  # not only series without a change
    assert cp.e_divisive_many([]) == []
    with pytest.raises(ValueError, match="finite"):
        cp.e_divisive_many([[1.0] * 8, [1.0, float("inf")] * 4])


def test_many_series_without_orderings_to_test_have_no_change_point():
    """With no orderings (or too few for the p-value) no split stands, in one series as in many."""
    x = [1.0] * 20 + [2.0] * 20
    for settings in ({"permutations": 0}, {"permutations": 50, "p_value": 0.01}):
        assert cp.e_divisive_many([x, x[:30]], **settings) == [e_divisive(x, **settings), []] == [[], []]
