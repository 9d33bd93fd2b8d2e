"""The results store's schema is Alembic's (jobs/store/migrations), on a real SQLite file: a new store is
created at the newest revision, equal to the tables of jobs/store/tables/; a store from before
migrations is refused by every command, naming `farm db upgrade`, which adopts it (its rows kept); a store
from a newer release is refused; first starts at once create the tables once, on SQLite and on PostgreSQL
(the session's server, tests/pgserver.py), even one whose first look finds another start's tables half
made (it looks again under the migration lock)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, event, insert, inspect, select, text
from sqlalchemy.engine import Engine

from jobs.cli import main
from jobs.store import Base, DraftRunRecord, Store, make_engine
from jobs.store.schema import (
    VERSION_TABLE,
    SchemaState,
    StoreSchemaError,
    head_revision,
    migration_options,
    schema_state,
    upgrade_schema,
)
from jobs.store.tables.trials import shape_key

REPO = Path(__file__).resolve().parents[2]
TABLES = set(Base.metadata.tables)


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> str:
    """Where a fresh store goes: an SQLite file that does not exist yet, or a new, empty database on the
    session's PostgreSQL server."""
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres")
        return server.url(server.create_database("farm"))
    return str(tmp_path / "farm.db")


def _differences(engine) -> list:
    """What Alembic's autogenerate finds between the store and the tables of jobs/store/tables/."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts=migration_options(conn.dialect, Base.metadata))
        return compare_metadata(ctx, Base.metadata)


def _versions(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()


def _farm(*args: str):
    return CliRunner().invoke(main, list(args))


def _old_style(path: Path) -> None:
    """What the releases before migrations made (`Base.metadata.create_all` at every start), as a store of
    an older release had it: no drafts tables yet, no trials.resources column; one job with one trial."""
    engine = create_engine(f"sqlite:///{path}")
    tables = Base.metadata.tables
    with engine.begin() as conn:
        # added by later releases
        later = ("draft_runs", "drafts", "job_queue", "trial_claims", "job_events", "farm_pools")
        later += ("kernel_sources", "owner_usage", "trial_preemptions", "comparisons")
        old = [t for name, t in tables.items() if name not in later and name != "samples"]
        Base.metadata.create_all(conn, tables=old)
        conn.execute(text(OLD_SAMPLES))  # one row per sample until 0010
        conn.execute(text("ALTER TABLE trials DROP COLUMN resources"))  # added by a later release
        conn.execute(text("DROP INDEX ix_trials_series"))  # added by a later release (0007)
        conn.execute(text("DROP INDEX ix_baseline_trials_trial_id"))
        conn.execute(text("DROP INDEX ix_trials_job_status_seq"))  # added by a later release (0011)
        conn.execute(text("DROP INDEX ix_jobs_status"))
        conn.execute(text("CREATE INDEX ix_trials_status ON trials (status)"))  # dropped by 0011
        conn.execute(text("CREATE INDEX ix_trials_job_id ON trials (job_id)"))  # dropped by 0011
        conn.execute(text("ALTER TABLE trials DROP COLUMN shape_key"))
        conn.execute(text("ALTER TABLE trials DROP COLUMN gpu_type"))  # added by a later release (0008)
        job = {"name": "old", "family": "probe", "spec": "{}", "spec_hash": "h" * 32, "status": "completed"}
        job_id = conn.execute(insert(tables["jobs"]).values(**job)).inserted_primary_key[0]
        trial = {"job_id": job_id, "key": "k1", "seq": 0, "family": "probe", "backend": "noop"}
        trial |= {"baseline": True, "shape": {"n": 1}, "config": {}, "dtype": "fp32", "status": "ok"}
        trial_id = conn.execute(insert(tables["trials"]).values(**trial)).inserted_primary_key[0]
        rows = [{"t": trial_id, "s": i, "v": v} for i, v in enumerate(OLD_VALUES)]
        conn.execute(text("INSERT INTO samples (trial_id, seq, value_ns) VALUES (:t, :s, :v)"), rows)
    engine.dispose()


OLD_SAMPLES = """CREATE TABLE samples (trial_id INTEGER NOT NULL REFERENCES trials (id) ON DELETE CASCADE,
seq INTEGER NOT NULL, value_ns BIGINT NOT NULL, PRIMARY KEY (trial_id, seq))"""
OLD_VALUES = [1500, 1400, 2**40 + 3, 1450]


def _columns(path: Path, table: str) -> set[str]:
    engine = create_engine(f"sqlite:///{path}")
    try:
        with engine.connect() as conn:
            return {c["name"] for c in inspect(conn).get_columns(table)}
    finally:
        engine.dispose()


def test_a_new_store_is_created_at_the_newest_revision_as_store_py_has_it(tmp_path):
    path = tmp_path / "farm.db"
    store = Store(str(path))  # zero setup: no command needed
    try:
        state = schema_state(store.engine, Base.metadata)
        assert state.up_to_date and state.current == head_revision()
        assert state.tables == TABLES
        assert _differences(store.engine) == []  # the migrations make exactly these tables
        names = set(inspect(store.engine).get_table_names())
        assert VERSION_TABLE in names and "alembic_version" not in names
        before, after = upgrade_schema(store.engine, Base.metadata)
        assert before == after  # nothing to do
    finally:
        store.close()
    Store(str(path)).close()  # a second open changes nothing
    res = _farm("db", "upgrade", "--db", str(path))
    assert res.exit_code == 0, res.output
    assert f"already at the newest revision, {head_revision()}" in res.output, res.output


def test_an_old_style_store_is_refused_until_db_upgrade_adopts_it(tmp_path):
    path = tmp_path / "farm.db"
    _old_style(path)
    with pytest.raises(StoreSchemaError) as ei:
        Store(str(path))
    message = str(ei.value)
    assert "`farm db upgrade`" in message and "before schema migrations" in message and "\n" not in message
    res = _farm("jobs", "list", "--db", str(path))  # every command on the store says so, in one line
    assert res.exit_code == 4 and "farm db upgrade" in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert "resources" not in _columns(path, "trials")  # the refusals changed nothing

    res = _farm("db", "upgrade", "--db", str(path))
    assert res.exit_code == 0, res.output
    assert f"schema upgraded from tables from before migrations to {head_revision()}" in res.output
    res = _farm("db", "upgrade", "--db", str(path))
    assert res.exit_code == 0 and f"already at the newest revision, {head_revision()}" in res.output

    store = Store(str(path))
    try:
        assert _differences(store.engine) == []  # adopted: the same tables as a new store
        ((job, counts),) = store.list_jobs()
        assert job.name == "old" and counts == {"ok": 1}
        trials = Base.metadata.tables["trials"]
        with store.engine.connect() as conn:
            assert conn.execute(select(trials.c.key, trials.c.resources)).all() == [("k1", None)]
            # 0007 backfilled the shape's key that history finds a series by
            assert conn.execute(select(trials.c.shape_key)).scalars().all() == [shape_key({"n": 1})]
            (trial_id,) = conn.execute(select(trials.c.id)).scalars().all()
        assert store.samples(trial_id) == OLD_VALUES  # 0010: one array, every value in its order
        store.replace_drafts(job.id, _draft_run(), [])  # the tables added by the adoption take rows
        assert store.drafts(job.id)[0] is not None
    finally:
        store.close()
    assert _farm("jobs", "list", "--db", str(path)).exit_code == 0


def _draft_run() -> DraftRunRecord:
    return DraftRunRecord(task="checklist", anomalies=0, sent=0, raw_bytes=0, compressed_bytes=0)


def test_a_store_from_a_newer_release_is_refused(tmp_path):
    path = tmp_path / "farm.db"
    Store(str(path)).close()
    engine = make_engine(str(path), check_schema=False)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
        with pytest.raises(StoreSchemaError, match="at schema revision 0099, which this farm does not know"):
            Store(str(path))
        with pytest.raises(StoreSchemaError, match="0099"):
            upgrade_schema(engine, Base.metadata)  # never "downgraded" by an older release
        assert _versions(engine) == [("0099",)]
    finally:
        engine.dispose()
    res = _farm("db", "upgrade", "--db", str(path))
    assert res.exit_code == 4 and "does not know" in res.output and "Traceback" not in res.output


def test_first_starts_at_once_in_threads_create_the_tables_once(empty_url):
    url = empty_url
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def first_start() -> None:
        start.wait()
        try:
            Store(url).close()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    engine = make_engine(url, check_schema=False)
    try:
        assert _versions(engine) == [(head_revision(),)] and _differences(engine) == []
    finally:
        engine.dispose()


_CHILD = """
import sys
from jobs.store import Store
print("ready", flush=True)
sys.stdin.readline()  # the parent says go to all children at once
Store(sys.argv[1]).close()
print("opened", flush=True)
"""


PROCESSES = 6


@pytest.mark.slow  # farm processes started at once
def test_first_starts_at_once_in_processes_create_the_tables_once(empty_url, tmp_path):
    url = empty_url
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env["PYTHONPATH"] = str(REPO)
    pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    procs = [
        subprocess.Popen([sys.executable, "-c", _CHILD, url], text=True, env=env, cwd=tmp_path, **pipes)
        for _ in range(PROCESSES)
    ]
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready", p.stderr.read()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0 and out.strip() == "opened", err
    engine = make_engine(url, check_schema=False)
    try:
        assert _versions(engine) == [(head_revision(),)] and _differences(engine) == []
    finally:
        engine.dispose()


def _has_version_table_query(statement: str, parameters) -> bool:
    """Whether a statement is the one that asks if the version table exists (PostgreSQL: the name is a
    parameter; SQLite: PRAGMA table_info names it)."""
    return VERSION_TABLE in statement or VERSION_TABLE in str(parameters)


def test_a_first_start_that_looks_while_another_creates_the_tables_looks_again_under_the_lock(empty_url):
    """The race of two first starts, made to happen every time: this start finds no version table, then,
    before it lists the tables, another start creates them all and commits. The tables without a version
    looked like a store from before migrations (refused, naming `farm db upgrade`); read again under the
    migration lock, the store is at the newest revision."""
    other = make_engine(empty_url, check_schema=False)
    started = threading.Event()  # set once: the other start's own statements pass through here too
    created: list[tuple] = []

    def another_start_creates_the_tables(conn, cursor, statement, parameters, context, executemany):
        if started.is_set() or not _has_version_table_query(statement, parameters):
            return
        started.set()
        created.append(upgrade_schema(other, Base.metadata))  # another process's first start, committed

    event.listen(Engine, "after_cursor_execute", another_start_creates_the_tables)
    try:
        Store(empty_url).close()
    finally:
        event.remove(Engine, "after_cursor_execute", another_start_creates_the_tables)
    try:
        ((before, after),) = created  # the other start ran, in between, and created the tables
        assert before.empty and after.up_to_date
        assert _versions(other) == [(head_revision(),)] and _differences(other) == []
    finally:
        other.dispose()


def test_an_older_revision_is_named_with_the_command_and_the_password_never():
    url = "postgresql+psycopg://farm:s3cret-pw@db.example/farm"
    message = SchemaState("0001", "0002", frozenset(TABLES)).problem(url)
    assert "at schema revision 0001, older than the 0002 this farm needs" in message
    assert "run `farm db upgrade` (with the same --db)" in message
    assert "s3cret-pw" not in message and "farm:***@db.example/farm" in message
    assert SchemaState("0002", "0002", frozenset()).problem(url) is None
    assert SchemaState(None, "0002", frozenset()).empty
