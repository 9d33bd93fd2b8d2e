"""The stopping rule and the step detector on synthetic sample streams (nothing is timed)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from kernels.measure import MeasurePolicy, StoppingRule, detect_step, run_stream


def _stream(n: int, mean_ns: float, noise: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return mean_ns * (1.0 + noise * rng.standard_normal(n))


def test_stable_stream_stops_early_converged() -> None:
    policy = MeasurePolicy()  # defaults: 0.5% target, 0.5 s minimum measured time, 20000 samples
    result = run_stream(_stream(5000, 10e6, 0.001, seed=1), policy)  # 10 ms samples, 0.1% noise
    assert result.stop_reason == "converged"
    assert 50 <= result.n_used <= 52  # as soon as 0.5 s of measured time is reached
    assert result.cv < policy.target_rel_stdev


def test_stable_stream_stops_at_min_samples_when_min_time_is_small() -> None:
    result = run_stream(_stream(5000, 1e3, 0.001, seed=2), MeasurePolicy(min_time_s=0.0))
    assert (result.stop_reason, result.n_used) == ("converged", 10)


def test_noisy_stream_hits_the_cap_with_high_cv() -> None:
    policy = MeasurePolicy(noise_stop=False, max_samples=300)
    result = run_stream(_stream(5000, 10e6, 0.2, seed=3), policy)
    assert result.stop_reason == "max_samples"
    assert result.n_used == 300
    assert result.cv > 0.15


def test_noisy_stream_hits_the_wall_clock_cap() -> None:
    policy = MeasurePolicy(noise_stop=False, max_samples=100_000, max_time_s=2.0)
    result = run_stream(_stream(5000, 10e6, 0.2, seed=4), policy)  # wall time = sum of samples
    assert result.stop_reason == "max_time"
    assert 150 <= result.n_used <= 250
    assert result.cv > 0.15


def test_noisy_stream_stops_on_noise_plateau_with_high_cv() -> None:
    policy = MeasurePolicy()
    result = run_stream(_stream(5000, 10e6, 0.2, seed=5), policy)
    assert result.stop_reason == "noise_plateau"
    assert result.n_used < policy.max_samples
    assert result.cv > 0.15


def test_samples_not_kept_count_towards_caps_only() -> None:
    rule = StoppingRule(MeasurePolicy(min_samples=5, max_samples=8, min_time_s=0.0))
    for _ in range(7):
        assert rule.add(100.0, keep=False) is None
    assert rule.add(100.0, keep=False) == "max_samples"
    assert (rule.n_raw, rule.n_kept) == (8, 0)


def test_explicit_wall_time_caps() -> None:
    rule = StoppingRule(MeasurePolicy(max_time_s=1.0, noise_stop=False))
    assert rule.add(1.0, wall_s=0.5) is None
    assert rule.add(1.0, wall_s=1.0) == "max_time"
    assert rule.add(1.0, wall_s=0.1) == "max_time"  # stays stopped


def test_stream_with_a_step_is_flagged() -> None:
    stream = np.concatenate([_stream(150, 1000.0, 0.01, seed=6), _stream(150, 1100.0, 0.01, seed=7)])
    step = detect_step(stream)
    assert step is not None
    assert abs(step.index - 150) <= 2
    assert step.shift == pytest.approx(0.10, abs=0.01)


def test_stream_without_a_step_is_not_flagged() -> None:
    assert detect_step(_stream(300, 1000.0, 0.01, seed=8)) is None
    spiky = _stream(300, 1000.0, 0.01, seed=9)
    spiky[[40, 170, 260]] = 20_000.0  # lone spikes are not a step
    assert detect_step(spiky) is None
    assert detect_step([1.0] * 5) is None  # too short to tell


def test_policy_validation_names_the_problem() -> None:
    with pytest.raises(ValidationError, match="max_samples"):
        MeasurePolicy(min_samples=20, max_samples=10)
    with pytest.raises(ValidationError, match="choose one"):
        MeasurePolicy(cuda_graph=True, kernel_only=True)
    with pytest.raises(ValidationError, match="kernel_only"):
        MeasurePolicy(kernel_name="flash_fwd")
    with pytest.raises(ValidationError, match="seeds"):
        MeasurePolicy(seeds=0)
    with pytest.raises(ValidationError, match="target_rel_stdev"):
        MeasurePolicy(target_rel_stdev=0)
    with pytest.raises(ValidationError, match="throttle_max_drop"):
        MeasurePolicy(throttle_max_drop=1.5)
    with pytest.raises(ValidationError, match="extra"):
        MeasurePolicy.model_validate({"warmup_ms": 10, "bogus": 1})
    p = MeasurePolicy.model_validate({"kernel_only": True, "kernel_name": "fmha", "min_time_s": 0.01})
    assert p.timer_name(on_gpu=True) == "cupti" and p.timer_name(on_gpu=False) == "cpu_perf_counter"
    d = MeasurePolicy()
    assert (d.seeds, d.target_rel_stdev, d.min_time_s, d.throttle_max_drop) == (2, 0.005, 0.5, 0.05)


def test_short_kernel_converges_on_default_policy() -> None:
    # 100 us samples need 5000 samples for 0.5 s of measured time: the default cap must allow that
    result = run_stream(_stream(20_000, 100e3, 0.001, seed=6), MeasurePolicy())
    assert result.stop_reason == "converged"
    assert 5000 <= result.n_used <= 5010
