"""Migration 0011 (the queue's indexes, issue 46) on a store at 0010 with a queued job, on SQLite and on
PostgreSQL: upgraded, its rows are intact, the two indexes are there and trials' indexes on status alone
and on job alone are gone."""

from __future__ import annotations

from sqlalchemy import create_engine, insert, inspect, select

from jobs.store import Base, now
from jobs.store.schema import upgrade_schema

INDEXES = {"trials": "ix_trials_job_status_seq", "jobs": "ix_jobs_status"}
GONE = {"ix_trials_status", "ix_trials_job_id"}


def _indexes(engine) -> set[str]:
    found = inspect(engine)
    return {i["name"] for table in INDEXES for i in found.get_indexes(table)} & {*INDEXES.values(), *GONE}


def _rows(engine) -> tuple:
    t = Base.metadata.tables
    with engine.connect() as conn:
        return (
            conn.execute(select(t["jobs"].c.id, t["jobs"].c.status)).all(),
            conn.execute(select(t["trials"].c.key, t["trials"].c.status, t["trials"].c.seq)).all(),
            conn.execute(select(t["job_queue"].c.job_id, t["job_queue"].c.owner)).all(),
        )


def test_a_store_at_0010_with_a_queued_job_gets_the_queue_indexes_with_its_rows_intact(store_url):
    engine = create_engine(store_url)
    upgrade_schema(engine, Base.metadata, "0010")
    t = Base.metadata.tables
    with engine.begin() as conn:
        job = {"name": "old", "family": "probe", "spec": "{}", "spec_hash": "h" * 32, "status": "queued"}
        job_id = conn.execute(insert(t["jobs"]).values(**job)).inserted_primary_key[0]
        base = {"job_id": job_id, "family": "probe", "backend": "noop", "shape": {"n": 1}, "config": {}}
        base |= {"baseline": True, "dtype": "fp32", "attempt": 0}
        trials = [base | {"key": f"k{i}", "seq": i, "status": "ok" if i < 2 else "pending"} for i in range(5)]
        conn.execute(insert(t["trials"]), trials)
        queued = {"job_id": job_id, "priority": 0, "owner": "ana", "submitted_at": now()}
        conn.execute(insert(t["job_queue"]).values(**queued))
    rows = _rows(engine)
    assert _indexes(engine) == GONE
    before, after = upgrade_schema(engine, Base.metadata, "0011")
    assert (before.current, after.current) == ("0010", "0011")
    assert _indexes(engine) == set(INDEXES.values())
    assert _rows(engine) == rows
    engine.dispose()
