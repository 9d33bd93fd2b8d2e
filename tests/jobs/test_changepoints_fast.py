"""E-divisive means at a year's series lengths (issue 46): every split of a segment is scored at once and a
permutation test stops as soon as its split cannot stand. Neither changes an answer: the best split and
its Q are the energy statistic's, straight from its definition, and the change points (indices, p-values,
levels) are those of the full search, here written out plainly, on series with none, one and two
changes."""

from __future__ import annotations

import numpy as np
import pytest

from jobs.history.changepoints import DEFAULT_SEED, _best_split, e_divisive


def _q(x: np.ndarray, tau: int) -> float:
    """Q(tau) from the definition (module docstring of jobs.history.changepoints)."""
    a, b = x[:tau], x[tau:]
    m, k = len(a), len(b)
    between = np.abs(a[:, None] - b[None, :]).sum() / (m * k)
    within_a = np.abs(a[:, None] - a[None, :]).sum() / (m * (m - 1))
    within_b = np.abs(b[:, None] - b[None, :]).sum() / (k * (k - 1))
    return m * k / (m + k) * (2 * between - within_a - within_b)


def _plain(values, p_value=0.01, permutations=199, min_size=3) -> list[tuple[int, float]]:
    """The search with every permutation run: (index, p) of each change point."""
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(DEFAULT_SEED)
    cuts, found = [0, len(x)], {}
    while True:
        cands = [(*_best_split(x[s:e], min_size)[::-1], s, e) for s, e in zip(cuts, cuts[1:], strict=False)]
        cands = [(q, s, e, s + tau) for q, tau, s, e in cands if tau > 0]
        if not cands:
            break
        q, s, e, index = max(cands)
        seg = x[s:e]
        reached = sum(_best_split(rng.permutation(seg), min_size)[1] >= q for _ in range(permutations))
        p = (1 + reached) / (1 + permutations)
        if p > p_value:
            break
        found[index] = p
        cuts = sorted([*cuts, index])
    return sorted(found.items())


@pytest.mark.parametrize("n", [6, 7, 20, 61])
def test_the_best_split_is_the_definitions(n):
    x = np.random.default_rng(n).normal(100, 5, n)
    x[n // 2 :] += 8
    tau, q = _best_split(x, 3)
    qs = {t: _q(x, t) for t in range(3, n - 3 + 1)}
    assert tau == max(qs, key=lambda t: (qs[t], -t)) and q == pytest.approx(qs[tau], rel=1e-12)


@pytest.mark.parametrize("steps", [(), (0.1,), (0.08, 0.2)])
def test_the_change_points_are_the_full_searchs(steps):
    rng = np.random.default_rng(len(steps))
    x = 1e6 * (1 + rng.normal(0, 0.01, 90))
    for i, step in enumerate(steps):
        x[(i + 1) * 90 // (len(steps) + 1) :] *= 1 + step
    got = [(c.index, c.p_value) for c in e_divisive(list(x))]
    assert got == _plain(x)
    assert len(got) >= len(steps) and (steps or not got)  # the steps are found, none in noise alone
