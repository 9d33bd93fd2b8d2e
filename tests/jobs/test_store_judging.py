"""The one read a verdict makes (jobs.store.judging): the baseline picked (named, else the newest of the
family with a point of the job), each trial's baseline trial and the kept samples, read once; and the
verdict written in one transaction (jobs.store.finding_store)."""

from __future__ import annotations

import dataclasses

import pytest

from jobs.judge import baselines
from jobs.store import AnomalyRecord, FailureRecord, Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: judging-test
family: probe
backends: [{name: spin, baseline: true, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1]}}
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU", "torch": "x"}


def _job(store: Store, samples: list[int], summary: Summary | None = None) -> int:
    job = spec_job(store, SPEC)
    store.record_results(
        result_of(t.id, samples, summary=summary, environment=ENV, correct=True) for t in store.trials(job)
    )
    return job


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "farm.db"))
    yield s
    s.close()


def test_the_newest_matching_baseline_its_trials_and_the_kept_samples_in_one_read(store):
    old, new = _job(store, [10, 11, 12]), _job(store, [20, 21, 22])
    baselines.set_from_job(store, old, "old")
    baselines.set_from_job(store, new, "new")
    discarded = dataclasses.replace(Summary.from_samples([30, 31, 99]), discarded=(2,))
    job = _job(store, [30, 31, 99], discarded)
    judging = store.judging(job, key=baselines.point_key)
    assert judging is not None and judging.job.id == job and len(judging.trials) == 2
    assert judging.baseline.name == "new"  # the newest of the family that matches a point
    new_trials = {t.id for t in store.trials(new)}
    assert {judging.matches[t.id].id for t in judging.trials} == new_trials
    for t in judging.trials:
        assert judging.kept_samples(t.id) == [30, 31]  # the discarded sample is left out
        assert judging.kept_samples(judging.matches[t.id].id) == [20, 21, 22]
        assert judging.env_of(t).device_name == "Some CPU"
    named = store.judging(job, key=baselines.point_key, baseline="old", samples=False)
    assert named.baseline.name == "old" and named.samples == {}
    assert {t.id for t in named.matches.values()} == {t.id for t in store.trials(old)}
    assert baselines.resolve(store, job).name == "new" and baselines.matches(store, named.baseline, job)


def test_the_baseline_matches_of_trials_read_already_are_judgings(store):
    """Store.baseline_matches (a job's report: its trials and environments read already) finds the
    baseline and the matched baseline trials judging() finds, named or not, and none without one."""
    job0 = _job(store, [5, 6, 7])
    trials, envs = store.trials(job0), store.environments(job0)
    assert store.baseline_matches(store.get_job(job0), trials, envs, key=baselines.point_key) == (None, {})
    old, new = _job(store, [10, 11, 12]), _job(store, [20, 21, 22])
    baselines.set_from_job(store, old, "old")
    baselines.set_from_job(store, new, "new")
    job = _job(store, [30, 31, 32])
    trials, envs = store.trials(job), store.environments(job)
    for name in (None, "old", "new"):
        judging = store.judging(job, key=baselines.point_key, baseline=name, samples=False)
        found, matched = store.baseline_matches(
            store.get_job(job), trials, envs, key=baselines.point_key, baseline=name
        )
        assert found.name == judging.baseline.name == (name or "new")
        assert matched == {t: b.id for t, b in judging.matches.items()} and len(matched) == 2
    with pytest.raises(LookupError, match="no baseline named 'gone'"):
        store.baseline_matches(store.get_job(job), trials, envs, key=baselines.point_key, baseline="gone")


def test_a_report_matches_the_baselines_where_they_stood_when_the_job_ended(store_url):
    """`as_of` (a finished job's report): each name where its last move by then put it, a name moved since
    matched on the job it was on (its points from that job's trials), a name set later not at all. SQLite
    and PostgreSQL."""
    store = Store(store_url)
    try:
        _baselines_as_they_stood(store)
    finally:
        store.close()


def _baselines_as_they_stood(store: Store) -> None:
    from datetime import datetime

    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from jobs.store import Job
    from jobs.store.tables import BaselineMove

    first, second = _job(store, [10, 11, 12]), _job(store, [20, 21, 22])
    job, later = _job(store, [30, 31, 32]), _job(store, [40, 41, 42])
    baselines.set_from_job(store, first, "nightly")
    baselines.set_from_job(store, second, "nightly", force=True)
    baselines.set_from_job(store, later, "weekly")
    day = lambda d: datetime(2026, 3, d)  # noqa: E731
    with Session(store.engine) as s, s.begin():  # nightly on first (day 1), job ends (day 2), then moves
        for move, d in zip(store.baseline_history(), (1, 3, 4), strict=True):
            s.execute(update(BaselineMove).where(BaselineMove.id == move.id).values(set_at=day(d)))
        s.execute(update(Job).where(Job.id == job).values(finished_at=day(2)))
    row, trials, envs = store.get_job(job), store.trials(job), store.environments(job)

    def matches(as_of):
        found, matched = store.baseline_matches(row, trials, envs, key=baselines.point_key, as_of=as_of)
        return (found.name, found.job_id, sorted(matched.values())) if found else None

    ids = lambda j: sorted(t.id for t in store.trials(j))  # noqa: E731
    assert matches(day(2)) == ("nightly", first, ids(first))  # moved to `second` since: matched on `first`
    assert matches(day(3)) == ("nightly", second, ids(second))  # where it stands now: its stored points
    assert matches(day(5)) == matches(None) == ("weekly", later, ids(later))
    assert matches(datetime(2026, 2, 1)) is None  # no baseline yet
    store.set_job_status(first, "failed")  # its trials still stored: the points are its ok trials
    assert matches(day(2))[1] == first


def test_an_unknown_baseline_is_named_and_a_missing_job_is_none(store):
    job = _job(store, [1, 2, 3])
    baselines.set_from_job(store, job, "main")
    with pytest.raises(LookupError, match=r"no baseline named 'nope' \(known: main\)"):
        store.judging(job, key=baselines.point_key, baseline="nope")
    assert store.judging(job + 100, key=baselines.point_key) is None
    itself = store.judging(job, key=baselines.point_key)  # a job is never its own baseline
    assert itself.baseline is None and itself.matches == {}


def test_a_verdict_replaces_the_previous_one_in_one_write(store):
    job = _job(store, [1, 2, 3])
    trial = store.trials(job)[0]
    anomaly = AnomalyRecord(trial.id, "noisy", "warning", "f" * 32, "noisy", {"cv": 0.5})
    failure = FailureRecord(trial.id, "probe", "stability", "fail", "g" * 32, "spin n=0", "noisy", {})
    store.record_verdict(job, [anomaly, anomaly], [failure])
    assert [a.kind for a in store.anomalies(job)] == ["noisy", "noisy"]
    assert [f.assertion for f in store.failures()] == ["stability"]
    store.record_verdict(job, [], [failure])
    assert store.anomalies(job) == [] and len(store.failures()) == 1
