"""The probe family's `_slowdown` fault (testkit.kernels.faults, a FARM_PLUGINS module): a real,
proportional slowdown of `spin` (CPU time) and `wait` (wall time) that does not change the point's identity
(a variant key, which kernels.registry.point_config drops), and bad values named in the error."""

from __future__ import annotations

import time

import pytest

from kernels.base import TrialRequest, TrialStatus
from kernels.measure.policy import MeasurePolicy
from kernels.probe.case import FAMILY
from kernels.registry import get_family, point_config

get_family("probe")  # FARM_PLUGINS: testkit.kernels.faults wraps its backends when it is handed out

POLICY = MeasurePolicy(warmup_ms=0, min_samples=3, max_samples=3, max_time_s=5, min_time_s=0)


def _cpu_ns(config: dict) -> int:
    """The CPU time one call of spin uses: the work the knob scales, the same however busy the machine is
    (its wall time is that divided by the share of a core it got)."""
    FAMILY.validate({"n": 0}, config, "float32", "spin")
    call = FAMILY.backends.impl("spin")(config)
    start = time.thread_time_ns()
    call()
    return time.thread_time_ns() - start


def test_slowdown_makes_spin_that_much_slower():
    plain = _cpu_ns({"ms": 4})
    slowed = _cpu_ns({"ms": 4, "_slowdown": 0.5})
    # 4 ms and 6 ms of CPU time, up to one turn of the loop (a clock read: about a microsecond)
    assert plain == pytest.approx(4e6, rel=0.02)
    assert slowed / plain == pytest.approx(1.5, rel=0.02)


def test_the_farm_times_spin_no_faster_than_its_cpu_time():
    """What the farm measures (wall time per call) is at least the CPU time spin uses: contention can only
    add to it."""
    out = FAMILY.execute(TrialRequest("probe", "spin", {"n": 0}, {"ms": 4}, "float32", POLICY))
    assert out.status == TrialStatus.OK
    assert out.summary.min >= 4e6 * 0.99


def test_slowdown_makes_wait_that_much_longer_in_wall_time():
    """wait sleeps in the timed call: the farm measures the sleep (a sleep cannot end early, and the 12 ms
    of the slowed one exceed the plain one's 4 ms by far more than a wake-up's delay on a busy machine)."""
    plain = FAMILY.execute(TrialRequest("probe", "wait", {"n": 0}, {"ms": 4}, "float32", POLICY))
    slowed = FAMILY.execute(
        TrialRequest("probe", "wait", {"n": 0}, {"ms": 4, "_slowdown": 2}, "float32", POLICY)
    )
    assert plain.status == slowed.status == TrialStatus.OK
    assert plain.summary.min >= 4e6 and slowed.summary.min >= 12e6
    assert slowed.summary.median > plain.summary.median + 6e6


def test_slowdown_is_a_knob_not_part_of_the_point():
    assert point_config("probe", "spin", {"ms": 2, "_slowdown": 0.2}) == {"ms": 2}


@pytest.mark.parametrize("bad", ["fast", True, -0.1, 1000])
def test_bad_slowdown_is_named(bad):
    with pytest.raises(ValueError, match=r"config\._slowdown must be a number"):
        FAMILY.validate({"n": 0}, {"ms": 1, "_slowdown": bad}, "float32", "spin")


def test_slowdown_applies_only_to_spin_and_wait():
    with pytest.raises(ValueError, match=r"\['_slowdown'\] do not apply to probe backend noop"):
        FAMILY.validate({"n": 0}, {"_slowdown": 0.2}, "float32", "noop")
