"""Migration 0008 (fair share, issue 47) on a store at 0007 with rows: upgraded, every row is intact and
the new columns and tables are there, empty."""

from __future__ import annotations

from sqlalchemy import create_engine, insert, inspect, select

from jobs.store import Base
from jobs.store.schema import upgrade_schema


def test_a_store_at_0007_with_a_queued_job_is_upgraded_with_its_rows_intact(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'farm.db'}")
    upgrade_schema(engine, Base.metadata, "0007")
    t = Base.metadata.tables
    with engine.begin() as conn:
        job = {"name": "old", "family": "probe", "spec": "{}", "spec_hash": "h" * 32, "status": "queued"}
        job_id = conn.execute(insert(t["jobs"]).values(**job)).inserted_primary_key[0]
        trial = {
            "job_id": job_id,
            "key": "k1",
            "seq": 0,
            "family": "probe",
            "backend": "noop",
            "shape": {"n": 1},
        }
        trial |= {"baseline": True, "config": {}, "dtype": "fp32", "status": "pending", "attempt": 0}
        conn.execute(insert(t["trials"]).values(**trial))
        queued = {"job_id": job_id, "priority": 3, "owner": "ana", "submitted_at": _now()}
        conn.execute(insert(t["job_queue"]).values(**queued))
        conn.execute(
            insert(t["farm_pools"]).values(id="p", host="h", workers=2, started_at=_now(), seen_at=_now())
        )
    before, after = upgrade_schema(engine, Base.metadata, "0008")
    assert (before.current, after.current) == ("0007", "0008")
    with engine.connect() as conn:
        row = conn.execute(select(t["job_queue"])).mappings().one()
        assert (row["owner"], row["priority"], row["project"], row["gpu_type"], row["last_taken_at"]) == (
            "ana",
            3,
            None,
            None,
            None,
        )
        assert conn.execute(select(t["trials"].c.key, t["trials"].c.gpu_type)).all() == [("k1", None)]
        assert conn.execute(select(t["farm_pools"].c.id, t["farm_pools"].c.policy)).all() == [("p", None)]
        assert conn.execute(select(t["owner_usage"])).all() == []
    assert {"owner_usage", "trial_preemptions"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def _now():
    from jobs.store import now

    return now()
