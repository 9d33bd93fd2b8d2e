"""The reads a report, a comparison and a job page make at a team's scale (issue 46): the kept samples of
many trials in one read, the same as one trial's at a time; a report's recent history bounded to the
family's newest jobs up to the job; the failure bank of one job without reading the others'."""

from __future__ import annotations

import dataclasses

from jobs.history.series import Selection, collect
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: reads
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1]}}
"""


def _job(store) -> int:
    job = spec_job(store, SPEC)
    results = []
    for t in store.trials(job):
        values = [1000 + 10 * i + t.seq for i in range(6)]
        summary = dataclasses.replace(Summary.from_samples(values), discarded=(0, 3) if t.seq % 2 else ())
        results.append(result_of(t.id, values, summary=summary))
    store.record_results(results)
    return job


def test_kept_samples_of_many_trials_are_each_trials_kept_samples(store_url):
    """On SQLite and PostgreSQL: the many-trial read takes only the summary's discarded list (a JSON path
    in the statement), the single read the whole summary; both keep the same samples."""
    store = Store(store_url)
    ids = [t.id for j in (_job(store), _job(store)) for t in store.trials(j)]
    many = store.kept_samples_of([*ids, ids[0], 10_000])  # a repeat, and a trial with no samples
    assert many == {i: store.kept_samples(i) for i in ids} | {10_000: []}
    assert any(len(v) == 4 for v in many.values()) and any(len(v) == 6 for v in many.values())
    store.close()


def test_recent_jobs_are_the_familys_newest_up_to_the_job(store):
    def other() -> int:  # a job of another family, created in between
        return store.create_job(
            name="o", family="gemm", spec_yaml="{}", spec_hash="o", trials=[], git_commit=None
        )

    made = [_job(store) if i % 3 else other() for i in range(9)]
    probe = [j for i, j in enumerate(made) if i % 3]
    assert store.recent_jobs("probe", probe[3], 2) == [probe[3], probe[2]]
    assert store.recent_jobs("probe", probe[-1], 100) == probe[::-1]
    assert store.recent_jobs("probe", probe[0], 5) == [probe[0]]
    series = collect(store, Selection(family="probe", jobs=frozenset(probe[:2])))
    assert {p.job_id for s in series for p in s.points} == set(probe[:2])


def test_the_failures_of_one_job(store):
    from jobs.store import FailureRecord

    a, b = _job(store), _job(store)
    for job in (a, b):
        rec = FailureRecord(None, "probe", "correct", "fail", "f" * 32, "x", f"job {job}", {})
        store.replace_failures(job, [rec])
    assert [f.message for f in store.failures(job_id=b)] == [f"job {b}"]
    assert [f.message for f in store.failures("f" * 32, job_id=a)] == [f"job {a}"]
    assert len(store.failures()) == 2


def _bank_selects(store) -> tuple[list[str], list]:
    """The SELECTs `farm failures list` (recurring) sends, and what it returned."""
    from sqlalchemy import event

    from jobs.judge.acceptance import recurring

    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        if statement.lstrip().upper().startswith("SELECT"):
            seen.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        out = recurring(store, by_environment=True)
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return seen, out


def test_the_failure_banks_listing_reads_its_shown_columns_in_three_statements_whatever_its_size(store):
    """`farm failures list` reads the bank's entries without their evidence or cards, each environment
    once (not one per entry), streamed, in as many statements at 2 as at 40 entries (issue 46)."""
    from jobs.store import FailureRecord

    def bank(job: int, n: int) -> None:
        trials = store.trials(job)
        store.replace_failures(
            job,
            [
                FailureRecord(trials[i % len(trials)].id, "probe", "correct", "fail", f"{i % 3}" * 32, "x",
                              f"job {job} {i}", {"big": "e" * 1000}, git_commit=f"c{job}", tag=None)
                for i in range(n)
            ],
        )  # fmt: skip

    a, b = _job(store), _job(store)
    bank(a, 1), bank(b, 1)
    small, _ = _bank_selects(store)
    bank(a, 20), bank(b, 20)
    big, groups = _bank_selects(store)
    assert len(small) == len(big) == 2  # the environments' ids, the entries (no environment recorded here)
    for statement in big:
        assert "evidence" not in statement and "failures.card" not in statement
    assert sorted((g.fingerprint[0], g.jobs, g.commits) for g in groups) == [
        (str(i), [a, b], [f"c{a}", f"c{b}"]) for i in range(3)
    ]
    assert {g.last_message for g in groups} == {f"job {b} 17", f"job {b} 18", f"job {b} 19"}


def test_a_recurring_failure_lists_each_job_commit_and_tag_once_in_the_order_first_seen(store):
    """recurring's groups keep their jobs, commits and tags as first seen, each once, however often an
    entry repeats them (a membership test an entry, not a scan of the group: issue 46)."""
    from jobs.judge.acceptance import recurring
    from jobs.store import FailureRecord

    def rec(commit: str | None, tag: str | None, message: str) -> FailureRecord:
        return FailureRecord(None, "probe", "correct", "fail", "r" * 32, "x", message, {}, commit, tag)

    a, b, c = _job(store), _job(store), _job(store)
    store.replace_failures(b, [rec("c2", "t2", "b1"), rec("c1", None, "b2"), rec("c2", "t2", "b3")])
    store.replace_failures(a, [rec("c1", "t1", "a1"), rec(None, "t2", "a2")])
    store.replace_failures(c, [rec("c3", "t1", "c1")])
    (g,) = recurring(store)
    assert (g.jobs, g.commits, g.tags, g.last_message) == ([b, a, c], ["c2", "c1", "c3"], ["t2", "t1"], "c1")
    assert recurring(store, min_jobs=3) == [g] and recurring(store, min_jobs=4) == []
