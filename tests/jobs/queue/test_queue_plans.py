"""The queue's statements stay on their indexes and in number (issue 46): a pool's claim (the waiting jobs
with their trials running and waiting, a job's first trials in grid order), `Queue.finish`'s probe for a
pending trial, and `farm jobs list`'s progress of the listed jobs, checked by EXPLAIN on PostgreSQL as
tests/jobs/test_query_plans.py checks the farm's reads (the same helpers: each plan made with
`enable_seqscan = off`, every index named must be used and no big table scanned whole, and with the
indexes dropped in a rolled-back transaction the check must fail). And `farm jobs list` sends as many
statements for 12 queued jobs as for 2: no statement per job.

The store: two nights of the synthetic team (40 finished jobs, 20,000 trials) and 6 queued jobs of 400
trials by 3 owners, left unanalyzed after they were submitted, as a team's store is right after a burst
of submissions (its statistics say that almost no trial is pending)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import pytest
from click.testing import CliRunner
from sqlalchemy import bindparam, event, text

from benchmarks import scale_queue
from benchmarks import scale_store as ss
from jobs.cli import main
from jobs.queue.policy import Policy
from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from tests.jobs.test_query_plans import BIG, DROP_JOB_TRIALS, JOB_TRIALS, _captured, _plan_scans

SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""


@pytest.fixture(scope="module")
def queue_store(postgres):
    store = Store(postgres.url(postgres.create_database("queueplans")))
    ss.build(store, 2, pools=ss.make_pools(store, draws=1))
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("ANALYZE")
    queue = Queue(store, Policy())
    spec = loads_spec(scale_queue.SPEC)
    jobs = [queue.submit(spec, owner=f"owner{i % 3}") for i in range(6)]
    with store.engine.begin() as conn:  # trials past the first written (the pace's), as a pool writes them
        written = text(
            "UPDATE trials SET status = 'ok', started_at = :at, finished_at = :at "
            "WHERE job_id IN :jobs AND seq BETWEEN 100 AND 120"
        )
        conn.execute(
            written.bindparams(bindparam("jobs", expanding=True)),
            {"jobs": jobs, "at": datetime(2026, 12, 7, 12, 0)},
        )  # fmt: skip
    queue.claim_many("plans-pool", None, 8)  # a few trials running, as a pool leaves them
    yield store, jobs
    store.close()


@dataclass(frozen=True)
class QueueCase:
    name: str
    read: Callable[[Store, list[int]], object]
    marker: str  # the statement of `read` that contains this is the one checked
    indexes: frozenset[str]  # it must use every one of these ...
    any_of: frozenset[str]  # ... and one of these (empty: no such choice)
    drop: tuple[str, ...]  # the DDL that removes them

    def problems(self, scans: list) -> list[str]:
        used = {index for _kind, _rel, index in scans if index}
        out = [f"{index} not used" for index in sorted(self.indexes - used)]
        if self.any_of and not used & self.any_of:
            out.append(f"none of {sorted(self.any_of)} used")
        return out + [f"sequential scan of {r}" for k, r, _i in scans if k == "Seq Scan" and r in BIG]


CASES = [
    QueueCase(
        "claim: the waiting jobs, their trials running and waiting",
        lambda st, _jobs: Queue(st, Policy()).claim_many("plans-pool", None, 2),
        "FROM job_queue JOIN jobs",
        frozenset({"ix_jobs_status", "ix_trials_job_status_seq"}),
        frozenset(),
        ("DROP INDEX ix_jobs_status", "DROP INDEX ix_trials_job_status_seq"),
    ),
    QueueCase(
        "claim: a job's first trials in grid order",
        lambda st, _jobs: Queue(st, Policy()).claim_many("plans-pool", None, 2),
        "FOR UPDATE OF trials SKIP LOCKED",
        frozenset({"ix_trials_job_status_seq"}),
        frozenset(),
        ("DROP INDEX ix_trials_job_status_seq",),
    ),
    QueueCase(
        "finish: which jobs have a pending trial left",
        lambda st, jobs: Queue(st, Policy()).finish(set(jobs)),
        "EXISTS (SELECT",
        frozenset({"ix_trials_job_status_seq"}),
        frozenset(),
        ("DROP INDEX ix_trials_job_status_seq",),
    ),
    QueueCase(
        "farm jobs list: the queued jobs' progress",
        lambda st, _jobs: Queue(st, Policy()).lines(),
        "GROUP BY trials.job_id",
        frozenset(),
        JOB_TRIALS,
        DROP_JOB_TRIALS,
    ),
    QueueCase(
        "farm jobs list: the running jobs' newest written trials (the pace)",
        lambda st, _jobs: Queue(st, Policy()).lines(),
        "ORDER BY trials.seq DESC",
        frozenset({"ix_trials_job_status_seq"}),
        frozenset(),
        ("DROP INDEX ix_trials_job_status_seq",),
    ),
]


def _sent(store: Store, read: Callable[[], object]) -> list[tuple[str, object]]:
    """The statements `read` sends that read rows: SELECTs (tests/jobs/test_query_plans.py's `_captured`),
    a claim's WITH (its trials locked, claimed and read in one statement) and DELETEs."""
    seen: list[tuple[str, object]] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.lstrip().upper().startswith(("WITH", "DELETE")):
            seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        selects = _captured(store, read)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return seen + selects


def _statement(store: Store, jobs: list[int], case: QueueCase) -> tuple[str, object]:
    found = [(s, p) for s, p in _sent(store, lambda: case.read(store, jobs)) if case.marker in s]
    assert found, f"{case.name}: no statement with {case.marker!r}"
    return found[0]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_a_queue_statement_uses_its_indexes_and_fails_without_them(queue_store, case):
    store, jobs = queue_store
    statement, parameters = _statement(store, jobs, case)
    scans = _plan_scans(store, statement, parameters)
    assert case.problems(scans) == [], (case.name, scans)
    dropped = _plan_scans(store, statement, parameters, drop=case.drop)
    assert case.problems(dropped), (case.name, dropped)  # the check fails without the indexes


def _joined(node: dict) -> set[str]:
    """The tables a plan node reads as its input (its subplans, run per row, left out)."""
    out = {node["Relation Name"]} if "Relation Name" in node else set()
    for child in node.get("Plans", []):
        if child.get("Parent Relationship") not in ("SubPlan", "InitPlan"):
            out |= _joined(child)
    return out


def _joins(node: dict) -> list[str]:
    """The joins of a plan that merge or hash `trials` with another input (not lookups by id)."""
    out = []
    if node["Node Type"] in ("Merge Join", "Hash Join") and "trials" in _joined(node):
        out.append(node["Node Type"])
    for child in node.get("Plans", []):
        out += _joins(child)
    return out


@pytest.mark.parametrize(
    ("name", "read", "marker"),
    [
        ("finish: the claims of trials written", lambda st, jobs: Queue(st, Policy()).finish(set(jobs)),
         "DELETE FROM trial_claims"),
        ("claim: each waiting job's trials running",
         lambda st, _jobs: Queue(st, Policy()).claim_many("plans-pool", None, 2), "FROM job_queue JOIN jobs"),
    ],
)  # fmt: skip
def test_a_claims_trial_is_probed_by_its_id_not_merged_with_every_trial(queue_store, name, read, marker):
    """A claim's trial is looked up by its id for each of the few claims. Written as a join, PostgreSQL
    merged the claims with `trials` in id order, walking the primary key from the store's first trial
    (24 ms a pool's turn at 1/64 of a year with a 10^5-trial job under way; issue 46). Planned as the
    server plans it (sequential scans allowed: the claims table is small)."""
    store, jobs = queue_store
    case = QueueCase(name, read, marker, frozenset(), frozenset(), ())
    statement, parameters = _statement(store, jobs, case)
    with store.engine.connect() as conn, conn.begin() as tx:
        (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).scalar()
        tx.rollback()
    assert _joins(plan["Plan"]) == [], (name, plan)
    probes = [n for n in _nodes(plan["Plan"]) if n.get("Index Name") == "trials_pkey"]
    assert probes and all("trial_claims.trial_id" in n.get("Index Cond", "") for n in probes), (name, plan)


def _nodes(node: dict) -> list[dict]:
    return [node] + [n for child in node.get("Plans", []) for n in _nodes(child)]


def _statements_of_jobs_list(url: str) -> int:
    store = Store(url)
    sent: list[str] = []

    def count(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        sent.append(statement)

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        lines = Queue(store).lines()
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
        store.close()
    assert lines, "the queue is listed"
    assert [s for s in sent if re.search(r"\bjobs\.spec\b", s)] == []  # a large grid's is megabytes
    return len(sent)


def test_farm_jobs_list_sends_as_many_statements_for_12_queued_jobs_as_for_2(store_url):
    store = Store(store_url)
    queue = Queue(store)
    jobs = [queue.submit(loads_spec(SPEC.format(name=f"j{i}", grid=list(range(5)))), owner=f"o{i % 3}")
            for i in range(12)]  # fmt: skip
    for job in jobs[2:]:
        queue.cancel(job)  # the queue holds 2
    queue.claim("p")  # one running, one waiting
    few = _statements_of_jobs_list(store_url)
    for job in jobs[2:]:  # the same 10 back in the queue
        store.set_job_status(job, "queued")
    many = _statements_of_jobs_list(store_url)
    assert (few, many) == (few, few), f"{few} statements for 2 queued jobs, {many} for 12"
    res = CliRunner().invoke(main, ["jobs", "list", "--db", store_url])
    assert res.exit_code == 0, res.output
    assert all(f" {job} " in res.output for job in jobs), res.output  # the 12 listed
    store.close()


def test_farm_jobs_list_counts_each_jobs_trials_once(store_url):
    """`farm jobs list` while a job runs counts its trials once, one grouped (job_id, status) statement
    for every listed job, read by the jobs table, the plan's waiting trials (pending less running) and
    the progress column; the only other read of its trials is the pace of the written ones (the ETA).
    Before, each of the three counted them (0.9-1.9 s a listing with a 10^5-trial job under 64 workers;
    issue 46)."""
    from sqlalchemy.engine import Engine

    store = Store(store_url)
    queue = Queue(store)
    job = queue.submit(loads_spec(SPEC.format(name="big", grid=list(range(20)))), owner="o")
    queue.submit(loads_spec(SPEC.format(name="small", grid=list(range(4)))), owner="p")
    with store.engine.begin() as conn:  # 5 written, as a pool writes them
        conn.execute(
            text("UPDATE trials SET status = 'ok', started_at = :at, finished_at = :at "
                 "WHERE job_id = :j AND seq < 5"),
            {"j": job, "at": datetime(2026, 12, 7, 12, 0)},
        )  # fmt: skip
    queue.claim_many("p", None, 3)
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        sent.append(" ".join(statement.split()))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        res = CliRunner().invoke(main, ["jobs", "list", "--db", store_url])
    finally:
        event.remove(Engine, "before_cursor_execute", record)
    assert res.exit_code == 0, res.output
    of_trials = [s for s in sent if "FROM trials WHERE trials.job_id" in s]  # a job's trials (not a claim's)
    counts = [s for s in of_trials if "GROUP BY trials.job_id, trials.status" in s]
    assert len(counts) == 1, of_trials
    assert [s for s in of_trials if s not in counts] == [
        s for s in of_trials if "trials.started_at" in s and "ORDER BY trials.seq DESC LIMIT" in s
    ], of_trials  # the pace: the newest written trials only
    assert len(of_trials) == 2, of_trials
    assert "5/20" in res.output and "0/4" in res.output, res.output
    store.close()
