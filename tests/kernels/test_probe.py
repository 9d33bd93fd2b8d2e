"""The probe family's `_slowdown` test knob: a real, proportional slowdown of `spin` that does not change
the point's identity (jobs.judge.baselines strips `_` keys), and bad values named in the error."""

from __future__ import annotations

import pytest

from jobs.judge.baselines import point_config
from kernels.base import TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from kernels.probe.case import FAMILY

POLICY = MeasurePolicy(warmup_ms=0, min_samples=7, max_samples=7, max_time_s=5, min_time_s=0)


def _fastest_ns(config: dict) -> float:
    """The fastest sample: a busy loop preempted by another process ends only when it runs again (on 2
    busy cores, a whole time slice late), so the median can be a slice long; the fastest is the loop."""
    FAMILY.validate({"n": 0}, config, "float32", "spin")
    out = FAMILY.execute(TrialRequest("probe", "spin", {"n": 0}, config, "float32", POLICY))
    assert out.status == TrialStatus.OK
    return out.summary.min


def test_slowdown_makes_spin_that_much_slower():
    plain = _fastest_ns({"ms": 4})
    slowed = _fastest_ns({"ms": 4, "_slowdown": 0.5})
    # the busy loop runs 4 ms and 6 ms: the ratio is 1.5 up to the timer's overhead
    assert plain == pytest.approx(4e6, rel=0.1)
    assert slowed / plain == pytest.approx(1.5, rel=0.1)


def test_slowdown_is_a_knob_not_part_of_the_point():
    assert point_config({"ms": 2, "_slowdown": 0.2}) == {"ms": 2}


@pytest.mark.parametrize("bad", ["fast", True, -0.1, 1000])
def test_bad_slowdown_is_named(bad):
    with pytest.raises(ValueError, match=r"config\._slowdown must be a number"):
        FAMILY.validate({"n": 0}, {"ms": 1, "_slowdown": bad}, "float32", "spin")


def test_slowdown_applies_only_to_spin():
    with pytest.raises(ValueError, match=r"\['_slowdown'\] do not apply to probe backend noop"):
        FAMILY.validate({"n": 0}, {"_slowdown": 0.2}, "float32", "noop")
