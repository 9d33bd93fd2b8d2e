"""A job's report's recent history (jobs.report.recent): the table `farm history`'s series give (read
through jobs.history.series.collect, as the report did before issue 46), from a read of only each point's
last jobs, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from test_query_plans import BIG, _captured, _plan_scans, pg_store  # noqa: F401 (a fixture)

from jobs.history.series import Selection, collect
from jobs.report.recent import RECENT_JOBS, RecentReads, recent_history, recent_series
from jobs.report.views import Table, spark
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: recent-test
family: probe
backends:
  - {{name: noop, baseline: true}}
  - {{name: spin, configs: {{grid: {{ms: {ms}}}}}}}
shapes: {{grid: {{n: [0, 1]}}}}
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU", "torch": "2.5.0"}


def _job(store: Store, number: int, ms: list[int], torch: str) -> int:
    job = spec_job(store, SPEC.format(ms=ms), git_commit=f"c{number:04d}")
    results = []
    for t in store.trials(job):
        median = 1e6 * (1 + 0.01 * number + 0.1 * t.config.get("ms", 0) + t.shape["n"])
        samples = [int(median * f) for f in (0.99, 1.0, 1.01)]
        summary = Summary.from_stored({"median": float(samples[1]), "n": 3})
        results.append(result_of(t.id, samples, summary=summary, environment=ENV | {"torch": torch}))
    store.record_results(results)
    return job


def _reference(store: Store, job_id: int, family: str, last: int) -> Table | None:
    """The table as the report built it from collect() before issue 46."""
    rows = []
    recent = frozenset(store.recent_jobs(family, job_id, RECENT_JOBS * last))
    for series in collect(store, Selection(family=family, jobs=recent), detect=False):
        at = next((i for i, p in enumerate(series.points) if p.job_id == job_id), None)
        if at is None or at == 0:
            continue
        window = series.points[max(0, at - last + 1) : at + 1]
        prev, this = window[-2], window[-1]
        cells = [
            series.key.label,
            len(window),
            spark([p.median_ns for p in window], marks=(len(window) - 1,)),
            f"{this.median_ns / 1e6:.4f}",
            f"{this.median_ns / prev.median_ns - 1:+.1%} (job {prev.job_id})"
            + "".join(f"; environment changed: {m.text}" for m in series.marks if m.index == at),
        ]
        rows.append((this.trial_id, cells))
    if not rows:
        return None
    rows.sort(key=lambda r: r[0])
    head = ["point", "jobs", f"median, last {last} jobs (red: this job)", "median ms", "vs previous job"]
    return Table(head, [cells for _, cells in rows], left=1)


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_the_table_is_the_series_table_from_each_points_last_jobs(store_url):
    store = Store(store_url)
    try:
        jobs = []
        for number in range(14):
            ms = [1, 2] if number % 3 else [2, 3]  # ms=1 and ms=3 are not in every job
            jobs.append(_job(store, number, ms, "2.5.0" if number < 11 else "2.6.0"))  # torch moves at 11
        for job in (jobs[0], jobs[4], jobs[11], jobs[-1]):
            for last in (3, 5, 20):
                got = recent_history(store, job, "probe", last)
                assert got == _reference(store, job, "probe", last), (job, last)
        assert recent_history(store, jobs[0], "probe") is None  # no earlier job
        # a site's night: the pages' histories from one RecentReads, each job's rows read once for all
        shared = RecentReads(store, jobs[3:])
        for job in reversed(jobs[3:]):
            assert recent_history(store, job, "probe", reads=shared) == recent_history(store, job, "probe")
        seen = _captured(store, lambda: [recent_history(store, j, "probe", reads=shared) for j in jobs[5:]])
        assert not [s for s, _p in seen if "FROM trials" in s], seen  # all read already
        table = recent_history(store, jobs[11], "probe", 5)
        assert table is not None and all("environment changed: torch" in r[-1] for r in table.rows)
        # read: at most `last` points of each series, none of a later job
        series = recent_series(store, jobs[6], "probe", store.recent_jobs("probe", jobs[6], 80), 3)
        assert series and all(len(points) <= 3 for points in series.values())
        assert max(p.job_id for points in series.values() for p in points) == jobs[6]
        assert len(series) == 8  # noop n=0,1; spin ms=1,2,3 x n=0,1 that ran up to job 6
        # the jobs are read `last` at a time from the newest until each of the job's points has `last`:
        # job 10's ms=1 points are in jobs 10, 8 and 7 (same environment), so 2 of the 4 reads of 3 jobs
        newest = store.recent_jobs("probe", jobs[10], 80)
        seen = _captured(store, lambda: recent_series(store, jobs[10], "probe", newest, 3))
        assert len([s for s, _p in seen if "FROM trials" in s]) == 1 + 2, seen  # the job's series, 2 reads
    finally:
        store.close()


def test_the_reads_stay_on_the_trials_indexes(pg_store):  # noqa: F811 (the fixture)
    """On PostgreSQL (two nights of the synthetic team, test_query_plans' store) every statement of the
    recent history that reads trials uses an index of a job's trials or of a series, none scans trials
    whole; with those indexes dropped the check fails."""
    job = max(j.id for j, _counts in pg_store.list_jobs(limit=10) if j.name == "gemm-nightly")
    seen = _captured(pg_store, lambda: recent_history(pg_store, job, "gemm"))
    reads = [(s, p) for s, p in seen if "FROM trials" in s]
    assert len(reads) == 2, seen  # the job's series, then the points of their last jobs
    indexes = {"uq_trial_job_key", "ix_trials_job_id", "ix_trials_job_status_seq", "ix_trials_series"}
    drop = [
        "DROP INDEX ix_trials_series",
        "ALTER TABLE trials DROP CONSTRAINT uq_trial_job_key",
        "DROP INDEX IF EXISTS ix_trials_job_id",  # gone since migration 0011
        "DROP INDEX IF EXISTS ix_trials_job_status_seq",
    ]
    for statement, parameters in reads:
        scans = _plan_scans(pg_store, statement, parameters)
        assert {i for _k, _r, i in scans if i} & indexes, scans
        assert not [r for k, r, _i in scans if k == "Seq Scan" and r in BIG], scans
        dropped = _plan_scans(pg_store, statement, parameters, drop=tuple(drop))
        assert [r for k, r, _i in dropped if k == "Seq Scan" and r == "trials"], dropped
