"""The results store on both of its databases: SQLite and a real PostgreSQL server (the session's one,
tests/pgserver.py; the PostgreSQL cases skip with the reason where it cannot be started).

What broke on PostgreSQL (issue 18): no driver installed, then every command that read a job's
environments (`SELECT DISTINCT` over a JSON column: "could not identify an equality operator for type
json"): the report (table and HTML), the card verdict and `farm baseline set`. Two sweeps writing one
store at once, and a report read while a sweep writes, must work too.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import inspect

from jobs.cli import main
from jobs.report import render as report
from jobs.store import Store
from jobs.store.results import TrialResult, result_of
from jobs.store.schema import VERSION_TABLE, head_revision
from testkit.jobs import spec_job

SPEC = """
name: pg-test
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1, 2]}}
card: probe
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU", "torch": "x"}


def _job(store: Store, text: str = SPEC) -> int:
    return spec_job(store, text)


def _result(trial_id: int, samples: list[int], env: dict = ENV) -> TrialResult:
    return result_of(trial_id, samples, worker="w0", node="n", environment=env)


def _finished_job(store: Store) -> int:
    job = _job(store)
    store.record_results(
        [_result(t.id, [1000 + t.seq, 1001 + t.seq, 1002 + t.seq]) for t in store.trials(job)]
    )
    store.set_job_status(job, "completed")
    return job


def test_the_readme_postgresql_url_has_its_driver(postgres):
    """The URL the README gives a team (`--db postgresql+psycopg://user@host/farm`), pointed at the session's
    server, works as written: the driver it names is installed, and `farm` makes the store, and reads
    back what was written, through it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    found = re.search(r"--db (postgresql\+\w+)://user@host/(\w+)", readme)
    assert found, "README.md: the PostgreSQL `--db` example is gone"
    scheme, _ = found.groups()
    url = f"{scheme}://{postgres.url(postgres.create_database('readme')).split('://', 1)[1]}"

    def farm_jobs_list() -> str:
        listed = CliRunner().invoke(main, ["jobs", "list", "--db", url])
        assert listed.exit_code == 0, listed.output
        return listed.output

    assert "pg-test" not in farm_jobs_list()  # a new store, created through the README's driver
    store = Store(url)
    try:
        job = _finished_job(store)  # written through the README's driver ...
    finally:
        store.close()
    listed = farm_jobs_list()  # ... and read back by `farm` through it
    assert "pg-test" in listed and str(job) in listed, listed


def test_a_new_store_is_migrated_to_the_newest_revision(store_url):
    store = Store(store_url)
    try:
        insp = inspect(store.engine)
        assert {"jobs", "trials", "samples", "baselines", VERSION_TABLE} <= set(insp.get_table_names())
        with store.engine.connect() as conn:
            from alembic.runtime.migration import MigrationContext

            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            assert ctx.get_current_revision() == head_revision()
    finally:
        store.close()


def test_environments_report_baseline_and_verdict_work(store_url, tmp_path):
    store = Store(store_url)
    job = _finished_job(store)
    assert [e.device_name for e in store.environments(job)] == ["Some CPU"]
    assert '"backend": "spin"' in report.to_json(store, job)
    assert "<html" in report.render_html(store, job).lower()
    store.close()
    runner = CliRunner()
    out = runner.invoke(main, ["report", str(job), "--db", store_url])
    assert out.exit_code == 0, out.output
    out = runner.invoke(main, ["baseline", "set", str(job), "--name", "main", "--db", store_url])
    assert out.exit_code == 0 and "6 points" in out.output, out.output
    # a second job of the same points, judged by its card against the baseline
    store = Store(store_url)
    cand = _finished_job(store)
    store.close()
    out = runner.invoke(
        main, ["accept", str(cand), "--baseline", "main", "--ambiguous", "warn", "--db", store_url]
    )
    assert out.exit_code == 0, out.output
    assert "equality operator" not in out.output


def test_two_writers_storing_the_same_new_environment_at_once(store_url):
    """Two sweeps on one host meet the same new environment row: the second waits for the first and
    uses its row (on PostgreSQL it used to fail on the unique fingerprint)."""
    a, b = Store(store_url), Store(store_url)
    job_a, job_b = _job(a), _job(b)
    ta, tb = a.trials(job_a)[0], b.trials(job_b)[0]
    errors: list[BaseException] = []
    with a.engine.begin() as conn:  # writer A: the environment inserted, not yet committed
        a._environment_id(conn, ENV)

        def write_b() -> None:
            try:
                b.record_results([_result(tb.id, [5])])
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        thread = threading.Thread(target=write_b)
        thread.start()
        thread.join(0.5)  # B is now waiting on A's row (or its lock)
    thread.join(30)
    assert not thread.is_alive() and not errors, errors
    a.record_results([_result(ta.id, [6])])
    assert len(a.environments(job_a)) == len(b.environments(job_b)) == 1
    assert a.environments(job_a)[0].id == b.environments(job_b)[0].id
    a.close()
    b.close()


PROBE = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}, {{name: spin, configs: {{grid: {{ms: [20]}}}}}}]
shapes: {{grid: {{n: [0, 1, 2, 3, 4, 5]}}}}
measure: {{warmup_ms: 0, min_samples: 3, max_samples: 3, max_time_s: 1.0}}
timeout_s: 60
"""


def _farm(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "FARM_DB": "", "PYTHONUNBUFFERED": "1"}
    env.pop("FARM_DB")
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **kw,
    )  # fmt: skip


@pytest.mark.slow
def test_two_concurrent_sweeps_and_a_report_during_them(store_url, tmp_path):
    specs = []
    for name in ("sweep-a", "sweep-b"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(PROBE.format(name=name))
        specs.append(path)
    procs = [_farm("sweep", "run", str(p), "--db", store_url, "--gpus", "1", "--quiet") for p in specs]
    try:
        store = Store(store_url)
        deadline = time.monotonic() + 120
        reported = False
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            jobs = store.list_jobs()
            running = [j for j, counts in jobs if counts.get("pending")]
            if running:  # a report of a job while its sweep writes it
                out = CliRunner().invoke(main, ["report", str(running[0].id), "--db", store_url])
                assert out.exit_code == 0, out.output
                reported = True
                break
            time.sleep(0.2)
        outputs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, out in zip(procs, outputs, strict=True):
        assert p.returncode == 0, out[-3000:]
    jobs = store.list_jobs()
    assert sorted(j.name for j, _ in jobs) == ["sweep-a", "sweep-b"]
    for _job_row, counts in jobs:
        assert counts == {"ok": 12}, counts
    assert reported, "no job was seen with pending trials while the sweeps ran"
    store.close()


def test_migration_0002_keeps_each_existing_baseline_as_its_first_move(store_url):
    """Alembic's migrations on both databases: a store at 0001 with a baseline, upgraded to the newest."""
    from datetime import datetime

    from sqlalchemy import insert

    from jobs.store import Base, make_engine
    from jobs.store.schema import upgrade_schema

    engine = make_engine(store_url, check_schema=False)
    try:
        upgrade_schema(engine, Base.metadata, target="0001")
        t = Base.metadata.tables
        at = datetime(2026, 1, 2, 3, 4, 5)
        with engine.begin() as conn:
            job = {"id": 7, "name": "probe-main", "family": "probe", "spec": "", "spec_hash": "h"}
            conn.execute(insert(t["jobs"]).values(**job, status="completed", created_at=at))
            conn.execute(
                insert(t["baselines"]).values(id=1, name="main", job_id=7, family="probe", created_at=at)
            )
        before, after = upgrade_schema(engine, Base.metadata)
        assert (before.current, after.current) == ("0001", head_revision())
    finally:
        engine.dispose()
    store = Store(store_url)
    moves = [
        (m.name, m.job_id, m.previous_job_id, m.spec_name, m.forced, m.set_at)
        for m in store.baseline_history()
    ]
    store.close()
    assert moves == [("main", 7, None, "probe-main", False, at)]
