"""The farm's hot reads stay on their indexes (issue 46), checked on PostgreSQL (the session's server,
tests/pgserver.py) by EXPLAIN of the statements the code itself sends: `farm history` of one series (all
of it, and its newest jobs) and of a family (its newest jobs' trials), a job's trials, `farm jobs list`'s
trial counts, the failure bank by fingerprint, the judge's read of a baseline's points and trials, and a
trial's samples.

How the check can fail: the store holds two nights of the synthetic team (benchmarks/scale_store.py: 40
jobs, 20,000 trials), too few rows for the planner to prefer an index on its own costs, so each plan is
made with `SET LOCAL enable_seqscan = off`. That setting does not forbid a sequential scan: PostgreSQL
still makes one where no index can serve the statement. So a plan is asked to use the index named for
it (an Index, Index Only or Bitmap Index scan of that index) and no sequential scan of the big tables;
each case then drops its index inside the same rolled-back transaction and the check must fail: a test
that passes whatever the schema holds would prove nothing. At a team's year, the planner's own choice
on these tables is measured by `python -m benchmarks scale` on PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from sqlalchemy import event, text

from benchmarks import scale_store as ss
from jobs.history.series import Selection, collect
from jobs.judge.baselines import point_key
from jobs.store import Store

BIG = {"trials", "samples", "failures", "anomalies", "baseline_trials", "job_events", "drafts"}


@pytest.fixture(scope="module")
def pg_store(postgres):
    store = Store(postgres.url(postgres.create_database("plans")))
    ss.build(store, 2, pools=ss.make_pools(store, draws=1))
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
    yield store
    store.close()


def _captured(store: Store, read: Callable[[], object]) -> list[tuple[str, object]]:
    """The SELECT statements `read` sends, with their parameters."""
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        read()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return seen


def _scans(node: dict) -> list[tuple[str, str | None, str | None]]:
    """(node type, relation, index) of every scan in a plan."""
    out = []
    if "Scan" in node["Node Type"]:
        out.append((node["Node Type"], node.get("Relation Name"), node.get("Index Name")))
    for child in node.get("Plans", []):
        out += _scans(child)
    return out


def _plan_scans(store: Store, statement: str, parameters: object, drop: tuple[str, ...] = ()) -> list:
    with store.engine.connect() as conn, conn.begin() as tx:
        for ddl in drop:
            conn.execute(text(ddl))
        conn.exec_driver_sql("SET LOCAL enable_seqscan = off")
        (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar()
        tx.rollback()
    return _scans(plan["Plan"])


@dataclass(frozen=True)
class Case:
    name: str
    read: Callable[[Store, Known], object]
    table: str  # the statement of `read` that scans this table is the one checked
    indexes: frozenset[str]  # it must use one of these
    drop: tuple[str, ...]  # the DDL that removes them all

    def statement(self, store: Store) -> tuple[str, object]:
        known = Known(_job(store), store.failures()[0].fingerprint)  # read before: not checked
        found = [
            (s, p) for s, p in _captured(store, lambda: self.read(store, known)) if f"FROM {self.table}" in s
        ]
        assert found, f"{self.name}: no statement read {self.table}"
        return found[0]


def _job(store: Store) -> int:
    return store.list_jobs(limit=1)[0][0].id


@dataclass(frozen=True)
class Known:
    """What the reads are given, found before the statements are captured."""

    job: int
    fingerprint: str


# a job's trials: the indexes that lead with the job (migration 0011)
JOB_TRIALS = frozenset({"uq_trial_job_key", "ix_trials_job_status_seq"})
DROP_JOB_TRIALS = (
    "ALTER TABLE trials DROP CONSTRAINT uq_trial_job_key",
    "DROP INDEX ix_trials_job_status_seq",
)
CASES = [
    Case(
        "history of one series",
        lambda st, _k: collect(
            st, Selection(family="gemm", backend="torch_bf16", shape={"m": 64, "n": 256, "k": 256})
        ),
        "trials",
        frozenset({"ix_trials_series"}),
        ("DROP INDEX ix_trials_series",),
    ),
    Case(
        "history of one series, its newest jobs (farm history's default)",
        lambda st, _k: collect(
            st, Selection(family="gemm", backend="torch_bf16", shape={"m": 64, "n": 256, "k": 256}, last=100)
        ),
        "trials",
        frozenset({"ix_trials_series"}),
        ("DROP INDEX ix_trials_series",),
    ),
    Case(
        "history of a family, its newest jobs (farm history --family's default)",
        lambda st, _k: collect(st, Selection(family="gemm", last=100)),
        "trials",
        JOB_TRIALS,
        DROP_JOB_TRIALS,
    ),
    Case(
        "a job's trials",
        lambda st, k: st.trials(k.job),
        "trials",
        JOB_TRIALS,
        DROP_JOB_TRIALS,
    ),
    Case(
        "farm jobs list (trial counts)",
        lambda st, _k: st.list_jobs(limit=5),
        "trials",
        JOB_TRIALS,
        DROP_JOB_TRIALS,
    ),
    Case(
        "failures by fingerprint",
        lambda st, k: st.failures(k.fingerprint),
        "failures",
        frozenset({"ix_failures_fingerprint"}),
        ("DROP INDEX ix_failures_fingerprint",),
    ),
    Case(
        "a baseline's points (the judge's read)",
        lambda st, k: st.judging(k.job, key=point_key),
        "baseline_trials",
        frozenset({"ix_baseline_trials_baseline_id", "uq_baseline_match"}),
        (
            "DROP INDEX ix_baseline_trials_baseline_id",
            "ALTER TABLE baseline_trials DROP CONSTRAINT uq_baseline_match",
        ),
    ),
    Case(
        "a trial's samples",
        lambda st, k: st.samples(st.trials(k.job)[0].id),
        "samples",
        frozenset({"samples_pkey"}),
        ("ALTER TABLE samples DROP CONSTRAINT samples_pkey",),
    ),
]


def _problems(case: Case, scans: list) -> list[str]:
    """What is wrong with a plan of the case's statement: its index unused, a big table scanned whole."""
    out = []
    if not {index for _kind, _rel, index in scans if index} & case.indexes:
        out.append(f"none of {sorted(case.indexes)} used")
    out += [f"sequential scan of {rel}" for kind, rel, _index in scans if kind == "Seq Scan" and rel in BIG]
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_hot_read_uses_its_index_and_fails_without_it(pg_store, case):
    statement, parameters = case.statement(pg_store)
    scans = _plan_scans(pg_store, statement, parameters)
    assert _problems(case, scans) == [], (case.name, scans)
    dropped = _plan_scans(pg_store, statement, parameters, drop=case.drop)
    assert _problems(case, dropped), (case.name, dropped)  # the check fails without the index


def test_the_store_is_big_enough_that_the_reads_select_a_part(pg_store):
    """The cases read a part of the store: one series is 10 of 20,000 trials."""
    series = collect(
        pg_store, Selection(family="gemm", backend="torch_bf16", shape={"m": 64, "n": 256, "k": 256})
    )
    assert sum(len(s.points) for s in series) == 10  # gemm-nightly, 5 jobs a night, 2 nights, 1 trial each
    with pg_store.engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM trials")) == 20_000


def test_the_bulk_store_takes_new_jobs_through_the_write_paths(pg_store):
    """The bulk rows carry their ids: PostgreSQL's sequences are moved past them, so a job the farm
    creates afterwards (a queued job, a confirmation) gets the next id (last in this module: it adds a
    job)."""
    from testkit.jobs import spec_job

    job = spec_job(pg_store, ss.SPECS["probe-io"])
    assert job == 41 and len(pg_store.trials(job)) == 500
    assert min(t.id for t in pg_store.trials(job)) == 20_001
