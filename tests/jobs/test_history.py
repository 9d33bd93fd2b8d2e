"""`farm history`: one point's median across jobs in commit order, and the change points E-divisive
means finds in it. The store has 30 jobs of one probe spec, the first 3 real sweeps through the runner
(local Ray), the rest written through the Store API with seeded samples; from job 20 on every `spin`
trial is 20% slower."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks.history_store import build_history_store
from cluster import session
from jobs.cli import main
from jobs.history.changepoints import e_divisive
from jobs.history.series import Selection, collect
from jobs.store.repository import Store


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    session.connect(gpus=1)
    path = str(tmp_path_factory.mktemp("history") / "farm.db")
    store = Store(path)
    try:
        built = build_history_store(store, jobs=30, slow_from=20, slowdown=0.20, real_sweeps=3)
    finally:
        session.disconnect()
    yield store, path, built
    store.close()


def test_one_change_point_at_job_20_of_about_20_percent(history):
    store, _path, built = history
    assert len(built.job_ids) == 30 and built.job_ids[:3] == built.real_jobs
    spins = collect(store, Selection(family="probe", backend="spin"))
    assert len(spins) == 2  # one series per shape
    for series in spins:
        assert [p.job_id for p in series.points] == built.job_ids  # commit (creation) order, real ones too
        assert len({p.commit for p in series.points[3:]}) == 27
        assert len(series.changes) == 1, series.changes
        change = series.changes[0]
        assert change.job_id == built.slow_job == built.job_ids[19]
        assert change.commit == series.points[19].commit
        assert abs(change.magnitude - 0.20) <= 0.05, change.magnitude
    # the baseline backend was never slowed down: no change point anywhere in its history
    assert all(not s.changes for s in collect(store, Selection(family="probe", backend="noop")))


def test_farm_history_prints_the_table_and_the_change_point(history):
    _store, path, built = history
    args = ["history", "--db", path, "--family", "probe", "--backend", "spin", "--shape", "n=0"]
    out = CliRunner().invoke(main, [*args, "--config", "ms=2"])
    assert out.exit_code == 0, out.output
    assert f"change point at job {built.slow_job}" in out.output
    assert out.output.count("ms=2") >= 1 and "+" in out.output
    as_json = CliRunner().invoke(main, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    (series,) = json.loads(as_json.output)
    assert [c["job"] for c in series["changes"]] == [built.slow_job]
    assert len(series["jobs"]) == 30 and series["point"]["config"] == {"ms": 2}
    whole_spec = CliRunner().invoke(main, ["history", "--db", path, "--spec", "history-probe", "--json"])
    assert whole_spec.exit_code == 0 and len(json.loads(whole_spec.output)) == 4  # 2 backends x 2 shapes


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
