"""The judge never compares timings across GPU types (issue 47): a time assertion whose trial and
baseline trial ran on different accelerator types is ambiguous naming both, whatever it found; the same
type, an unknown type, or a baseline re-run beside the trial (--confirm) leave it as it is."""

from __future__ import annotations

import pytest

from jobs.judge.acceptance import AssertionResult, across_environment
from jobs.judge.checks import AMBIGUOUS, FAIL, PASS, Context, Outcome
from jobs.store import TrialRow


def _result(outcome: str, ours: str | None, theirs: str | None, **numbers) -> tuple[AssertionResult, dict]:
    trial = TrialRow(id=2, gpu_type=ours, backend="triton")
    base = TrialRow(id=1, gpu_type=theirs, backend="torch")
    r = AssertionResult("regression", trial, "t", Outcome(outcome, "3.0% slower", dict(numbers)))
    return r, {2: Context(card=None, trial=trial, env=None, baseline=base, samples=lambda _i: [])}


@pytest.mark.parametrize("outcome", [PASS, FAIL])
def test_a_comparison_across_gpu_types_is_ambiguous_naming_both(outcome):
    r, contexts = _result(outcome, "H200", "H100")
    across_environment([r], contexts)
    assert r.outcome == AMBIGUOUS
    assert "baseline on H100, this trial on H200" in r.result.reason
    assert r.result.numbers["gpu_types"] == ["H100", "H200"]


@pytest.mark.parametrize(("ours", "theirs", "rerun"), [("H100", "H100", False), (None, "H100", False),
                                                       ("H200", "H100", True)])  # fmt: skip
def test_the_same_type_an_unknown_one_or_a_rerun_baseline_is_judged_as_before(ours, theirs, rerun):
    r, contexts = _result(FAIL, ours, theirs, **({"baseline_rerun": True} if rerun else {}))
    across_environment([r], contexts)
    assert r.outcome == FAIL
