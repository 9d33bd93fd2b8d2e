"""The synthetic year of benchmarks/scale_store.py is written in bulk; its rows must be the rows the
farm's write paths make (issue 46): one job written in bulk and the same job written through
`Store.create_job` and `Store.record_results` have the same jobs, trials and samples rows, column for
column."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from benchmarks import scale_store as ss
from jobs.store import Job, Sample, Store, TrialRow


def _rows(store: Store, table) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(table).order_by(*table.primary_key.columns))]


def test_a_bulk_job_has_the_rows_of_the_same_job_written_through_the_store(tmp_path):
    bulk, api = Store(str(tmp_path / "bulk.db")), Store(str(tmp_path / "api.db"))
    try:
        pool = ss.make_pool(ss.SPECS["gemm-nightly"], ss.environment_id(bulk), seed=3, draws=1)
        assert ss.environment_id(api) == ss.environment_id(bulk)
        p = ss.JobPlan("gemm-nightly", 7, ss.START + timedelta(days=2), 0, frozenset({4, 99, 321}))
        ss.write_jobs(bulk, [p], {"gemm-nightly": pool})
        ss.write_through_store(api, p, pool)
        for table in (Job.__table__, TrialRow.__table__, Sample.__table__):
            got, want = _rows(bulk, table), _rows(api, table)
            assert len(got) == len(want) > 0, table.name
            for g, w in zip(got, want, strict=True):
                assert g == w, (table.name, {k: (g[k], w[k]) for k in g if g[k] != w[k]})
        trials = api.trials(1)
        assert len(trials) == 500 and {t.status for t in trials} == {"ok"}
        slow = [t.median_ns / pool.level[t.seq] for t in trials if t.seq in p.regressed]
        assert all(1.15 < r < 1.35 for r in slow), slow  # the regressed points ran 25% slower
    finally:
        bulk.close()
        api.close()


def test_a_baseline_is_set_at_the_teams_time_a_minute_after_its_job_ended(tmp_path):
    """The synthetic year's clock, not the build's: a job's report takes the baseline as it stood when the
    job ended, which a move stamped with today's time would put after every job of the year."""
    store = Store(str(tmp_path / "farm.db"))
    try:
        ss.build(store, 1, pools=ss.make_pools(store))
        moves = store.baseline_history()
        assert len(moves) == len(ss.SPECS)
        for move in moves:
            job = store.get_job(move.job_id)
            assert move.set_at == job.finished_at + timedelta(minutes=1)
            assert store.get_baseline(move.name).created_at == move.set_at
    finally:
        store.close()
