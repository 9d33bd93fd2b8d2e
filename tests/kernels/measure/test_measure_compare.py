"""Comparison verdicts on synthetic samples with known shifts."""

from __future__ import annotations

import json

import numpy as np

from kernels.measure import compare_samples


def _samples(n: int, mean: float, noise: float, seed: int) -> np.ndarray:
    return mean * (1.0 + noise * np.random.default_rng(seed).standard_normal(n))


def test_ten_percent_slower_with_one_percent_noise_is_slower() -> None:
    c = compare_samples(_samples(200, 1000, 0.01, 1), _samples(200, 1100, 0.01, 2))
    assert c.verdict == "slower", c.reason
    assert c.ratio > 1.05 and c.ci_low > 1.05 and c.p_value < 0.002


def test_ten_percent_faster_with_one_percent_noise_is_faster() -> None:
    c = compare_samples(_samples(200, 1000, 0.01, 3), _samples(200, 900, 0.01, 4))
    assert c.verdict == "faster", c.reason
    assert c.ci_high < 0.95


def test_ten_percent_shift_inside_twenty_percent_noise_is_ambiguous() -> None:
    for n in (50, 200, 2000):  # more samples do not turn noisy data into a decisive answer
        c = compare_samples(_samples(n, 1000, 0.2, 5), _samples(n, 1100, 0.2, 6))
        assert c.verdict == "ambiguous", (n, c.reason)


def test_no_shift_is_same() -> None:
    c = compare_samples(_samples(200, 1000, 0.01, 7), _samples(200, 1000, 0.01, 8))
    assert c.verdict == "same", c.reason
    assert c.ci_low < 1.0 < c.ci_high


def test_no_shift_with_high_noise_is_never_a_pass() -> None:
    c = compare_samples(_samples(200, 1000, 0.1, 9), _samples(200, 1000, 0.1, 10))
    assert c.verdict == "ambiguous"


def test_large_shift_is_decisive_even_when_noisy() -> None:
    c = compare_samples(_samples(200, 1000, 0.05, 11), _samples(200, 2000, 0.05, 12))
    assert c.verdict == "slower", c.reason


def test_small_significant_shift_below_min_effect_is_same() -> None:
    c = compare_samples(_samples(200, 1000, 0.005, 13), _samples(200, 1020, 0.005, 14))
    assert c.verdict == "same", c.reason
    assert c.p_value < 0.002  # real, but below the 5% minimum effect


def test_deterministic_and_json_safe() -> None:
    b, c = _samples(100, 1000, 0.01, 15), _samples(100, 1030, 0.01, 16)
    assert compare_samples(b, c) == compare_samples(b, c)
    json.dumps(compare_samples(b, c).to_dict())
    few = compare_samples([1.0, 2.0], [1.0, 2.0])
    assert few.verdict == "ambiguous" and "too few" in few.reason
    json.dumps(few.to_dict())


def test_one_preempted_sample_does_not_hide_a_clear_regression():
    rng = np.random.default_rng(7)
    base = rng.normal(1000.0, 5.0, 200)
    cand = rng.normal(1100.0, 5.5, 200)
    cand[17] = 1e6  # the OS paused the process once
    assert compare_samples(base, cand).verdict == "slower"
