"""The bootstrap and the rank test under compare_samples and a report's speedup intervals (issue 46): the
resamples' medians drawn from their order statistics have the distribution of resampling itself, the
intervals cover a known ratio at their nominal rate, and the p-value is SciPy's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from kernels.measure.stats import bootstrap_medians, bootstrap_ratio_ci, compare_samples, mann_whitney_p


def _resampled_medians(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """The bootstrap as defined: n draws with replacement, their median."""
    return np.median(x[rng.integers(0, x.size, (n_boot, x.size))], axis=1)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    grid = np.union1d(a, b)
    cdf_a = np.searchsorted(np.sort(a), grid, side="right") / a.size
    cdf_b = np.searchsorted(np.sort(b), grid, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


@pytest.mark.parametrize("n", [5, 6, 51, 100])
def test_the_medians_have_the_distribution_of_resampling(n):
    rng = np.random.default_rng(n)
    x = np.round(rng.lognormal(0.0, 0.3, n), 1)  # rounded: ties, as integer nanoseconds have
    drawn = bootstrap_medians(x, 40_000, np.random.default_rng(1))
    resampled = _resampled_medians(x, 40_000, np.random.default_rng(2))
    # two samples of 40k from one distribution: KS above 0.02 has a probability under 1e-6
    assert _ks(drawn, resampled) < 0.02
    assert set(np.unique(drawn)) <= set(np.unique(resampled)) | set(np.unique((x[:, None] + x) / 2))


def test_a_wrong_order_statistic_would_be_seen():
    """The check above can fail: the medians of one draw fewer are told apart."""
    x = np.random.default_rng(3).lognormal(0.0, 0.3, 100)
    drawn = bootstrap_medians(x, 40_000, np.random.default_rng(1))
    shifted = np.sort(x)[np.minimum((np.random.default_rng(2).beta(45, 56, 40_000) * 100).astype(int), 99)]
    assert _ks(drawn, shifted) > 0.05


@pytest.mark.parametrize(("confidence", "n_boot"), [(0.95, 400), (0.99, 2000)])
def test_the_interval_covers_a_known_ratio_at_its_nominal_rate(confidence, n_boot):
    """Lognormal timings, the candidate's 1.1x the baseline's (its median ratio is 1.1): over 400 pairs
    the interval holds 1.1 about `confidence` of the time (a binomial's 3 sigma either side)."""
    rng = np.random.default_rng(46)
    reps, covered = 400, 0
    for seed in range(reps):
        base = rng.lognormal(np.log(1000.0), 0.1, 100)
        cand = rng.lognormal(np.log(1100.0), 0.1, 100)
        low, high = bootstrap_ratio_ci(base, cand, n_boot=n_boot, confidence=confidence, seed=seed)
        covered += low <= 1.1 <= high
    sigma = (confidence * (1 - confidence) / reps) ** 0.5
    assert abs(covered / reps - confidence) <= 3 * sigma + 0.01, covered / reps


def test_the_interval_is_seeded():
    rng = np.random.default_rng(5)
    a, b = rng.lognormal(0, 0.1, 80), rng.lognormal(0.1, 0.1, 90)
    first = bootstrap_ratio_ci(a, b, n_boot=2000, confidence=0.99, seed=0)
    assert first == bootstrap_ratio_ci(a, b, n_boot=2000, confidence=0.99, seed=0)
    assert first != bootstrap_ratio_ci(a, b, n_boot=2000, confidence=0.99, seed=1)


@pytest.mark.parametrize(("n_base", "n_cand"), [(100, 100), (81, 100), (7, 8), (1, 2)])
def test_the_interval_is_the_medians_drawn_from_one_generator_whatever_was_asked_before(n_base, n_cand):
    """The interval's draws are kept per seed and sizes (a report asks 750 intervals of the same sizes):
    each interval is still the candidate's then the baseline's bootstrap medians from one generator of its
    seed, for new values of the same sizes as for the first."""
    rng = np.random.default_rng(3)
    for seed in (0, 0, 1):
        base, cand = rng.lognormal(0, 0.1, n_base), rng.lognormal(0.05, 0.1, n_cand)
        drawn = np.random.default_rng(seed)
        ratios = bootstrap_medians(cand, 400, drawn) / bootstrap_medians(base, 400, drawn)
        want = tuple(float(v) for v in np.percentile(ratios, [2.5, 97.5]))
        assert bootstrap_ratio_ci(base, cand, n_boot=400, confidence=0.95, seed=seed) == want


def test_the_p_value_is_scipys():
    rng = np.random.default_rng(7)
    cases = [(np.ones(10), np.ones(12)), (np.arange(5.0), np.arange(3.0, 9.0))]  # all tied; small, exact
    for i in range(300):
        n1, n2 = rng.integers(3, 80, 2)
        if i % 2:  # integer nanoseconds: many ties
            cases.append((rng.integers(100, 110, n1).astype(float), rng.integers(101, 112, n2).astype(float)))
        else:
            cases.append((rng.lognormal(0, 0.1, n1), rng.lognormal(0.03 * (i % 4), 0.1, n2)))
    for x, y in cases:
        want = mannwhitneyu(x, y, alternative="two-sided").pvalue
        assert mann_whitney_p(x, y) == pytest.approx(want, rel=1e-9, abs=1e-300), (x, y)


def test_the_verdict_follows_the_ideal_bootstrap_not_its_draws():
    """The verdicts of a spread of shifts are the same under any seed where the ideal bootstrap is not on
    an edge: the interval's ends move by resampling noise only."""
    rng = np.random.default_rng(11)
    for shift in (1.0, 1.02, 1.1, 0.9, 1.3):
        base = 1000.0 * (1 + 0.005 * rng.standard_normal(200))
        cand = shift * 1000.0 * (1 + 0.005 * rng.standard_normal(200))
        verdicts = {compare_samples(base, cand, seed=s).verdict for s in range(5)}
        assert len(verdicts) == 1, (shift, verdicts)
