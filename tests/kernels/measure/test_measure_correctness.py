"""Correctness metrics on crafted tensors."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kernels.measure import (
    calc_diff,
    check_allclose,
    check_calc_diff,
    check_flashmla,
    combine_seeds,
    fill_nan,
    poison_like,
    seed_list,
)
from kernels.measure.correctness import FLASHMLA_LSE, default_tolerances


def _ref(seed: int = 0, shape: tuple[int, ...] = (2, 3, 4, 16)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def test_flashmla_passes_within_tolerance() -> None:
    ref = _ref()
    out = ref + 1e-4 * _ref(1)  # well inside atol 8e-4
    r = check_flashmla(out, ref)
    assert r.passed, r.message
    assert r.mismatches == 0 and r.max_abs_err < 8e-4 and r.cos_diff is not None and r.cos_diff < 5e-6


def test_flashmla_matching_nan_positions_pass() -> None:
    ref = _ref()
    ref[0, 1, 2, 3] = float("nan")
    ref[1, 0, 0, 0] = float("inf")
    assert check_flashmla(ref.clone(), ref).passed


def test_nan_in_the_wrong_place_fails_at_its_index() -> None:
    ref = _ref()
    out = ref.clone()
    out[1, 2, 3, 5] = float("nan")
    r = check_flashmla(out, ref)
    assert not r.passed
    assert r.nonfinite_mismatches == 1 and r.mismatches == 1
    assert r.worst_index == (1, 2, 3, 5)
    assert "NaN" in r.message
    # a NaN the reference has but the output lacks fails too, as does inf of the wrong sign
    ref2 = ref.clone()
    ref2[0, 0, 0, 1] = float("nan")
    assert not check_flashmla(ref, ref2).passed
    out3 = ref.clone()
    out3[0, 0, 0, 2] = -float("inf")
    ref3 = ref.clone()
    ref3[0, 0, 0, 2] = float("inf")
    assert check_flashmla(out3, ref3).worst_index == (0, 0, 0, 2)
    assert not check_allclose(out, ref).passed


def test_single_bad_element_is_found_at_its_index() -> None:
    ref = _ref()
    out = ref.clone()
    out[1, 1, 2, 7] += 0.5
    for r in (check_flashmla(out, ref), check_allclose(out, ref), check_calc_diff(out, ref)):
        assert r.worst_index == (1, 1, 2, 7), r.method
        assert r.max_abs_err == pytest.approx(0.5, rel=1e-5)
    assert check_flashmla(out, ref).mismatches == 1
    assert check_allclose(out, ref).mismatches == 1


def test_relative_tolerance_alone_can_pass_an_element() -> None:
    ref = torch.tensor([100.0, 1.0])
    out = torch.tensor([100.5, 1.0])  # abs err 0.5 > 8e-4 but rel err 0.005 <= 2.01/128
    r = check_flashmla(out, ref, max_cos_diff=1e-3)
    assert r.passed and r.mismatches == 0
    assert not check_flashmla(out, ref, rtol=1e-3, max_cos_diff=1e-3).passed


def test_cos_diff_limit_fails_even_when_elements_pass() -> None:
    ref = torch.full((1000,), 1e-3)
    out = torch.zeros(1000)  # every element within atol 8e-4? no: 1e-3 > 8e-4 ...
    out = ref * 0.5  # abs err 5e-4 <= atol everywhere, yet the vectors differ a lot
    r = check_flashmla(out, ref)
    assert r.mismatches == 0 and not r.passed and "cos_diff" in r.message


def test_lse_limits() -> None:
    ref = _ref(shape=(4, 8)) + 10
    assert check_flashmla(ref + 5e-7, ref, **FLASHMLA_LSE).passed
    assert not check_flashmla(ref + 1e-2, ref, **FLASHMLA_LSE).passed


def test_calc_diff_matches_the_formula_and_threshold() -> None:
    ref = _ref(shape=(64, 128)).to(torch.bfloat16)
    x, y = ref.double(), ref.double()
    assert calc_diff(x, y) == pytest.approx(0.0, abs=1e-15)
    noisy = ref.float() + 0.02 * _ref(3, (64, 128))  # ~2e-4: the normal FP8 range
    r = check_calc_diff(noisy, ref)
    assert r.passed and 0 < r.calc_diff < 1e-3, r.calc_diff
    bad = ref.float() + 0.1 * _ref(4, (64, 128))  # ~5e-3
    r = check_calc_diff(bad, ref)
    assert not r.passed and r.calc_diff > 1e-3
    a, b = bad.double(), ref.double()
    assert r.calc_diff == pytest.approx(1 - 2 * float((a * b).sum()) / float((a * a + b * b).sum()))
    nan_out = ref.float().clone()
    nan_out[3, 4] = float("nan")
    r = check_calc_diff(nan_out, ref)
    assert not r.passed and math.isnan(r.calc_diff) and r.worst_index == (3, 4)
    assert calc_diff(torch.zeros(4), torch.zeros(4)) == 0.0


def test_allclose_per_dtype_defaults() -> None:
    assert default_tolerances(torch.float32) == (1e-5, 1.3e-6)
    assert default_tolerances(torch.bfloat16, torch.float32) == (1e-5, 1.6e-2)
    ref = _ref()
    out_bf16 = ref.to(torch.bfloat16)
    assert check_allclose(out_bf16, ref).passed  # bf16 rounding is within bf16 tolerance
    assert not check_allclose(out_bf16.float(), ref).passed  # but not within float32's
    assert check_allclose(out_bf16.float(), ref, rtol=1e-2).passed


def test_shape_mismatch_fails() -> None:
    r = check_flashmla(torch.zeros(3, 4), torch.zeros(4, 3))
    assert not r.passed and "shape" in r.message


def test_combine_seeds_needs_all_to_pass() -> None:
    seeds = seed_list(3)
    assert seeds == [0, 1, 2]
    reports = []
    for s in seeds:
        ref = _ref(s)
        out = ref.clone()
        if s == 1:
            out[0, 0, 0, 0] += 1.0
        reports.append(check_flashmla(out, ref))
    combined = combine_seeds(reports, seeds)
    assert not combined.passed and combined.seed == 1 and combined.worst_index == (0, 0, 0, 0)
    assert len(combined.per_seed) == 3 and "seeds [1]" in combined.message
    good = combine_seeds([reports[0], reports[2]], [0, 2])
    assert good.passed and good.mismatches == 0
    assert not combine_seeds([]).passed
    json.dumps(combined.to_dict())
    with pytest.raises(ValueError):
        seed_list(0)


def test_poisoning_unused_memory() -> None:
    kv = torch.zeros(4, 64, 8)
    fill_nan(kv, (slice(2, None),))  # pages 2.. are unused
    assert torch.isnan(kv[2:]).all() and not torch.isnan(kv[:2]).any()
    table = poison_like(torch.zeros(2, 5, dtype=torch.int32))
    assert (table == torch.iinfo(torch.int32).max).all()
    assert torch.isnan(poison_like(torch.ones(3, dtype=torch.bfloat16))).all()
    mask = torch.tensor([True, False, True])
    assert torch.isnan(fill_nan(torch.ones(3), mask)).tolist() == [True, False, True]
