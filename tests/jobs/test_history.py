"""`farm history`: one point's median across jobs in commit order, and the change points E-divisive
means finds in it. The store (benchmarks/history_store.py) has 30 jobs of one probe spec (`wait` on two
shapes: a 3 ms sleep in the timed call); from job 20 on the spec carries the probe's `_slowdown: 3` knob
(4x the time). Jobs 1-3 and 20-22 are real sweeps through the runner (local Ray), so the slowdown it
detects is a measured one; the other 24 are written through the Store API with seeded samples around the
real levels (30 real sweeps take about 2 minutes on 2 cores, the runner starting its workers per job:
benchmarks/site_bench.py builds that all-real store).

The real sweeps time a sleep, not a busy loop, because a busy loop's wall time is its work divided by
the share of a core it got, and on a shared machine that share changes from one sweep to the next: with
`spin`, job 20 once ran at twice the share of jobs 21-22 (12 ms against 26 ms, the plain jobs at 5.8 ms),
so it sat nearer the old level and the change point came out at job 21. A sleep's wall time moves only
by a wake-up's delay, far less than the 9 ms step."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks.history_store import build_history_store
from jobs.cli import main
from jobs.history.changepoints import e_divisive
from jobs.history.series import Selection, collect
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of

REAL = (1, 2, 3, 20, 21, 22)
SLOWDOWN = 3.0  # the knob: 4x the time from job 20 on


@pytest.fixture(scope="module")
def history(tmp_path_factory, ray_local):
    path = str(tmp_path_factory.mktemp("history") / "farm.db")
    store = Store(path)
    built = build_history_store(store, jobs=30, slow_from=20, slowdown=SLOWDOWN, real=REAL, backend="wait")
    yield store, path, built
    store.close()


@pytest.mark.slow  # a store of 30 real sweep jobs
def test_one_change_point_at_job_20_the_size_the_real_sweeps_measured(history):
    store, _path, built = history
    assert len(built.job_ids) == 30 and [built.job_ids[n - 1] for n in REAL] == built.real_jobs
    # the slowed jobs ran the knob for real: their trials are `_slowdown: 3` and about 4x slower
    # (per shape, the median over the 3 real jobs of each phase)
    assert {t.config["_slowdown"] for t in store.trials(built.slow_job)} == {SLOWDOWN}

    def real_level(numbers: tuple[int, ...], n: int) -> float:
        return float(np.median([t.median_ns for j in numbers for t in store.trials(built.job_ids[j - 1])
                                if t.shape["n"] == n]))  # fmt: skip

    measured = {n: real_level(REAL[3:], n) / real_level(REAL[:3], n) - 1 for n in (0, 1)}
    # 3 ms and 12 ms of sleep: +300% less what wake-up delays add to both (beside two busy loops: 3.1 and
    # 12.1 ms); halving the step would take 3 ms more delay on each slowed call than on a plain one
    assert all(1.5 < step < 3.1 for step in measured.values()), measured
    waits = collect(store, Selection(family="probe", backend="wait"))
    assert len(waits) == 2  # one series per shape: the knob is not part of the point
    for series in waits:
        assert [p.job_id for p in series.points] == built.job_ids  # commit (creation) order, real ones too
        assert len({p.commit for p in series.points}) == 30
        # one change point, at job 20, and none elsewhere
        assert len(series.changes) == 1, [(c.job_id, c.magnitude) for c in series.changes]
        change = series.changes[0]
        assert change.job_id == built.slow_job == built.job_ids[19]
        assert change.commit == series.points[19].commit
        # its size is the step the real sweeps measured (the written jobs sit at their phases' levels)
        n = dict(series.key.shape)["n"]
        assert change.magnitude == pytest.approx(measured[n], rel=0.15), (change.magnitude, measured)


@pytest.mark.slow  # a store of 30 real sweep jobs
def test_farm_history_prints_the_table_and_the_change_point(history):
    _store, path, built = history
    args = ["history", "--db", path, "--family", "probe", "--backend", "wait", "--shape", "n=0"]
    out = CliRunner().invoke(main, [*args, "--config", "ms=3"])
    assert out.exit_code == 0, out.output
    assert f"change point at job {built.slow_job}" in out.output
    assert out.output.count("ms=3") >= 1 and "+" in out.output
    as_json = CliRunner().invoke(main, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    (series,) = json.loads(as_json.output)
    assert [c["job"] for c in series["changes"]] == [built.slow_job]
    assert len(series["jobs"]) == 30 and series["point"]["config"] == {"ms": 3}
    whole_spec = CliRunner().invoke(main, ["history", "--db", path, "--spec", "history-probe", "--json"])
    assert whole_spec.exit_code == 0 and len(json.loads(whole_spec.output)) == 2  # 2 shapes


@pytest.mark.slow  # a store of 30 real sweep jobs
def test_farm_history_bad_input_names_what_is_wrong(history):
    _store, path, _built = history
    bad = CliRunner().invoke(main, ["history", "--db", path, "--family", "probe", "--shape", "n"])
    assert bad.exit_code == 2 and "--shape" in bad.output and "K=V" in bad.output
    none = CliRunner().invoke(main, ["history", "--db", path])
    assert none.exit_code == 2 and "--family" in none.output
    missing = CliRunner().invoke(main, ["history", "--db", path, "--family", "probe", "--backend", "nope"])
    assert missing.exit_code == 1 and "no finished trial" in missing.output


# ---- the method on controlled series -------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_stationary_noise_has_no_change_point(seed):
    rng = np.random.default_rng(seed)
    assert e_divisive(rng.normal(1.0, 0.02, 40)) == []


def test_two_steps_are_both_found_with_their_size():
    rng = np.random.default_rng(7)
    x = np.r_[rng.normal(1.0, 0.01, 15), rng.normal(1.3, 0.013, 15), rng.normal(1.1, 0.011, 15)]
    found = e_divisive(x)
    assert [c.index for c in found] == [15, 30]
    assert abs(found[0].magnitude - 0.3) < 0.03 and abs(found[1].magnitude - (1.1 / 1.3 - 1)) < 0.03
    assert e_divisive(x) == found  # a fixed seed: the same series gives the same answer


def test_one_outlier_is_not_a_change_point():
    rng = np.random.default_rng(3)
    x = rng.normal(1.0, 0.01, 30)
    x[12] = 1.7  # a run on a busy machine
    assert e_divisive(x) == []


def test_short_or_bad_series():
    assert e_divisive([1.0, 2.0, 2.0]) == []
    with pytest.raises(ValueError, match="finite"):
        e_divisive([1.0, float("nan"), 1.0, 1.0, 1.0, 1.0])


def _points(levels, medians, contended=()):
    from datetime import datetime

    from jobs.history.series import HistoryPoint

    return [
        HistoryPoint(job_id=i + 1, job_name="s", commit=f"c{i + 1}", created_at=datetime(2026, 1, 1),
                     trial_id=i, median_ns=m, p10_ns=lv * 0.95, p90_ns=m * 1.5, iqr_ns=lv * 0.05, n=20,
                     mad_ns=lv * 0.02, flags=("noisy", "contended") if i in contended else ())
        for i, (lv, m) in enumerate(zip(levels, medians, strict=True))
    ]  # fmt: skip


def test_each_job_reads_its_median_with_the_standard_error_of_a_median():
    from jobs.history.series import changes_of

    rng = np.random.default_rng(32)
    levels = [20e6 * (1.6 if i >= 8 else 1.0) * rng.normal(1, 0.02) for i in range(16)]
    points = _points(levels, levels)
    (change,) = changes_of(points)
    assert (change.job_id, round(change.magnitude, 1)) == (9, 0.6)
    assert points[0].level_ns == points[0].median_ns
    assert points[0].uncertainty_ns == pytest.approx(1.2533 * 1.4826 * points[0].mad_ns / 20**0.5)


def test_a_contended_point_is_left_out_and_the_change_still_lands_on_its_job():
    from jobs.history.series import changes_of

    levels = [10e6] * 10 + [16e6] * 10
    flat = changes_of(_points(levels, levels, contended={10, 11}))  # the first two slow jobs were contended
    assert [c.job_id for c in flat] == [11]
    wild = [lv * (30 if i in (3, 14) else 1) for i, lv in enumerate(levels)]  # contended, far off
    assert [c.job_id for c in changes_of(_points(wild, wild, contended={3, 14}))] == [11]


def test_a_series_too_short_for_any_change_point_says_how_many_jobs_it_needs(store):
    from jobs.history.series import min_jobs

    assert min_jobs() == 11  # p <= 0.01 over 199 permutations, >= 3 points a side
    spec = loads_spec("name: short\nfamily: probe\nbackends: [{name: noop, baseline: true}]\n"
                      "shapes: {grid: {n: [0]}}\n")  # fmt: skip
    for i in range(4):
        job = store.create_job(name="short", family="probe", spec_yaml="x", spec_hash=spec.spec_hash(),
                               trials=spec.trials(), git_commit=f"c{i}")  # fmt: skip
        store.record_results([result_of(store.trials(job)[0].id, [1000 + i, 1001 + i, 1002 + i])])
    out = CliRunner().invoke(main, ["history", "--db", store.url, "--spec", "short"])
    assert out.exit_code == 0, out.output
    assert "no change point can be called yet: that takes at least 11 jobs, this has 4" in out.output


def test_a_level_that_moves_a_hundredth_of_a_percent_is_no_change():
    from jobs.history.series import changes_of

    # python -m benchmarks history-noise --fresh (issue 45): flat series of the run-queue-corrected CPU level
    # differ by ~0.01% from job to job, and e-divisive can call such a step significant
    flat = [20.0e6] * 6 + [20.002e6] * 6
    assert changes_of(_points(flat, flat)) == []
    step = [20.0e6] * 6 + [32.0e6] * 6
    assert [c.job_id for c in changes_of(_points(step, step))] == [7]


def test_the_collector_is_paused_while_a_read_builds_its_points_and_set_back_after():
    """paused_gc: Python's cyclic collector off inside, on again after (an error too), left off after a
    pause inside another; collect leaves it as it found it."""
    import gc

    from jobs.history.series import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
