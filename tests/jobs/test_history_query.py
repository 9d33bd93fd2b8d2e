"""`farm history` reads only the series it shows (issue 46): `jobs.history.series.collect` filters family,
backend, shape (by the trials' stored, indexed shape key), dtype and spec in SQL and reads only the columns
a point needs. Its series are the same as the old read's, which took every `ok` trial of the store and
filtered in Python (kept here as the reference), for every selection over a store of two families,
several backends, shapes (one stored as 64.0, matched by 64), configs with and without variant keys,
dtypes, specs, environments and failed trials."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field, replace

import pytest
from sqlalchemy import event, select
from sqlalchemy.orm import Session

from jobs.history.series import PointKey, Selection, _key, collect
from jobs.store import Environment, Job, Store, TrialRow
from jobs.store.results import result_of
from kernels.base import TrialStatus
from testkit.jobs import spec_job

SPECS = {
    "probe-a": """
name: probe-a
family: probe
backends:
  - {name: wait, baseline: true, configs: {grid: {ms: [1, 2]}}}
  - {name: spin, configs: {grid: {ms: [1], _slowdown: [0.5]}}}
shapes: {grid: {n: [0, 1, 64]}}
dtypes: [float32, bfloat16]
""",
    "probe-b": """
name: probe-b
family: probe
backends: [{name: wait, baseline: true, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 64]}}
""",
    "gemm-a": """
name: gemm-a
family: gemm
backends: [{name: torch_fp32, baseline: true}, {name: torch_bf16}]
shapes: {grid: {m: [64], n: [256], k: [256, 512]}}
""",
}
ENVS = [
    {"host": "h1", "device_kind": "cpu", "device_name": "CPU A", "torch": "1"},
    {"host": "h2", "device_kind": "gpu", "device_name": "GPU B", "torch": "1"},
]


def _old_collect(store: Store, selection: Selection) -> dict[PointKey, list[int]]:
    """The read before issue 46: every ok trial of the family (whole rows, joined to job and environment),
    the series filtered in Python; point key -> trial ids in commit order."""
    q = (
        select(TrialRow, Job, Environment)
        .join(Job, Job.id == TrialRow.job_id)
        .outerjoin(Environment, Environment.id == TrialRow.environment_id)
        .where(TrialRow.status == TrialStatus.OK, TrialRow.median_ns.is_not(None))
        .order_by(Job.created_at, Job.id, TrialRow.seq)
    )
    if selection.family is not None:
        q = q.where(TrialRow.family == selection.family)
    if selection.backend is not None:
        q = q.where(TrialRow.backend == selection.backend)
    if selection.spec is not None:
        q = q.where(Job.name == selection.spec)
    out: dict[PointKey, list[tuple[int, int]]] = {}
    with Session(store.engine) as s:
        for t, job, env in s.execute(q):
            key = _key(t, env)
            if not selection.matches(key):
                continue
            points = out.setdefault(key, [])
            if points and points[-1][0] == job.id:
                continue
            points.append((job.id, t.id))
    return {k: [tid for _job, tid in v] for k, v in out.items()}


@dataclass(frozen=True)
class Point:
    """A trial point as an importer might write it (jobs.store.TrialPoint): its shape's 64 a float."""

    key: str
    family: str = "probe"
    backend: str = "wait"
    baseline: bool = True
    shape: dict = field(default_factory=lambda: {"n": 64.0})
    config: dict = field(default_factory=lambda: {"ms": 1})
    dtype: str = "float32"


def _float_shape_job(store: Store, round_: int) -> int:
    return store.create_job(
        name="probe-c", family="probe", spec_yaml="{}", spec_hash="c" * 32, trials=[Point("k0")],
        git_commit=f"c{round_}probe-c",
    )  # fmt: skip


@pytest.fixture(scope="module")
def history_store(tmp_path_factory):
    store = Store(str(tmp_path_factory.mktemp("hq") / "farm.db"))
    for round_, name in itertools.product(range(3), [*SPECS, "probe-c"]):
        job = spec_job(store, SPECS[name], git_commit=f"c{round_}{name}") if name in SPECS else None
        job = job or _float_shape_job(store, round_)
        results = []
        for t in store.trials(job):
            if t.seq % 7 == 3:  # some trials fail: never a point
                results.append(result_of(t.id, status="error", error="boom"))
                continue
            env = ENVS[(t.seq + round_) % 2]
            results.append(result_of(t.id, [1000 + t.seq, 1010 + t.seq, 1020 + t.seq], environment=env))
        store.record_results(results)
    yield store
    store.close()


SELECTIONS = [
    Selection(family="probe"),
    Selection(family="probe", backend="wait"),
    Selection(family="probe", backend="wait", shape={"n": 64}),  # stored 64.0 in probe-c, 64 in probe-b
    Selection(family="probe", backend="wait", shape={"n": 0}, config={"ms": 1}),
    Selection(family="probe", backend="spin", shape={"n": 1}, config={"ms": 1}),  # `_slowdown` ignored
    Selection(family="probe", shape={"n": 1}, dtype="bfloat16"),
    Selection(family="probe", backend="wait", shape={"n": 2}),  # no such shape
    Selection(family="gemm", backend="torch_bf16", shape={"m": 64, "n": 256, "k": 256}),
    Selection(family="gemm", shape={"k": 256, "m": 64, "n": 256}),  # key order does not matter
    Selection(family="gemm", backend="torch_fp32", shape={"m": 64}),  # part of a shape: no point
    Selection(spec="probe-b"),
    Selection(spec="probe-a", backend="spin"),
    Selection(),
]


@pytest.mark.parametrize("selection", SELECTIONS, ids=repr)
def test_the_series_are_the_old_reads_series(history_store, selection):
    found = {s.key: [p.trial_id for p in s.points] for s in collect(history_store, selection)}
    assert found == _old_collect(history_store, selection)


def test_the_store_has_series_of_every_kind_the_selections_ask_about(history_store):
    """The comparison above is not vacuous: the selections find points, of both environments."""
    probe_64 = collect(history_store, Selection(family="probe", backend="wait", shape={"n": 64}))
    assert {s.key.env for s in probe_64} == {"cpu:CPU A", "GPU B"}
    assert max(len(s.points) for s in probe_64) >= 3
    jobs = {p.job_id for s in probe_64 for p in s.points}
    names = {j.id: j.name for j, _ in history_store.list_jobs()}
    assert {names[j] for j in jobs} == {"probe-a", "probe-b", "probe-c"}  # 64.0 and 64 are one shape
    assert collect(history_store, Selection(family="gemm", backend="torch_fp32", shape={"m": 64})) == []


def test_one_series_reads_only_its_own_trials(history_store):
    """The statement reads by the shape's key and never selects the trial's metrics, correctness, memory
    or resources: what a point does not need is not read."""
    seen: list[str] = []

    def statements(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        seen.append(statement)

    event.listen(history_store.engine, "before_cursor_execute", statements)
    try:
        collect(
            history_store, Selection(family="gemm", backend="torch_bf16", shape={"m": 64, "n": 256, "k": 256})
        )
    finally:
        event.remove(history_store.engine, "before_cursor_execute", statements)
    (series_sql,) = [q for q in seen if "FROM trials" in q]
    assert "trials.shape_key = " in series_sql
    for unread in ("trials.metrics", "trials.correctness", "trials.memory", "trials.resources"):
        assert unread not in series_sql


def _newest(store: Store, jobs: set[int], last: int) -> set[int]:
    """The newest `last` of `jobs`, in the order the series take them (created, then id)."""
    with Session(store.engine) as s:
        order = [j for (j,) in s.execute(select(Job.id).order_by(Job.created_at.desc(), Job.id.desc()))]
    return set([j for j in order if j in jobs][:last])


@pytest.mark.parametrize("last", [1, 2, 5])
@pytest.mark.parametrize("selection", SELECTIONS[:-1], ids=repr)
def test_the_newest_jobs_are_the_old_reads_newest(history_store, selection, last):
    """`last`: each series' points of the newest `last` jobs that ran a selected point (the config, matched
    in Python, aside); the rest of the old read's series as they were."""
    window = replace(selection, last=last)
    found = {s.key: [p.trial_id for p in s.points] for s in collect(history_store, window)}
    ran = _old_collect(history_store, replace(selection, config=None))
    trial_job = {t.id: t.job_id for t in _trials(history_store)}
    jobs = _newest(history_store, {trial_job[t] for ids in ran.values() for t in ids}, last)
    expected = {
        k: [t for t in ids if trial_job[t] in jobs]
        for k, ids in _old_collect(history_store, selection).items()
    }
    assert found == {k: v for k, v in expected.items() if v}
    if ran:
        assert 0 < len({trial_job[t] for ids in found.values() for t in ids}) <= last


def _trials(store: Store) -> list[TrialRow]:
    with Session(store.engine) as s:
        return list(s.scalars(select(TrialRow)))


def test_farm_history_shows_the_newest_jobs_unless_told_all(history_store):
    from click.testing import CliRunner

    from jobs.cli import main

    db = ["--db", history_store.url]
    point = ["--family", "probe", "--backend", "wait", "--shape", "n=64", *db]
    run = CliRunner().invoke
    every = json.loads(run(main, ["history", *point, "--json", "--all"]).output)
    two = json.loads(run(main, ["history", *point, "--json", "--last", "2"]).output)
    default = json.loads(run(main, ["history", *point, "--json"]).output)
    assert default == every and max(len(s["jobs"]) for s in every) > 2  # fewer jobs than the default 100
    newest = sorted({j["job"] for s in every for j in s["jobs"]})[-2:]
    assert sorted({j["job"] for s in two for j in s["jobs"]}) == newest
    assert "the newest 100 jobs" in run(main, ["history", *point]).output
    for bad, says in ((["--last", "0"], "--last"), (["--all", "--last", "3"], "--all and --last")):
        res = run(main, ["history", *point, *bad])
        assert res.exit_code == 2 and says in res.output


# Summaries as a writer might have stored them (JSON text): the database reads each point's p10, p90,
# iqr, mad, n and flags out of them (jobs.history.series._SummaryValue), as Summary.from_stored does.
STORED_SUMMARIES = [
    '{"n": 100, "median": 2, "p10": 1.5, "p90": 3, "iqr": 0.25, "mad": 0.1, "flags": ["contended"]}',
    '{"n": true, "p10": "1.5", "p90": null, "iqr": false, "mad": [1], "flags": []}',  # wrong types: absent
    '{"n": -3, "p10": 1e308, "p90": -2.5e-300, "flags": [1, "drift", null, {"a": 1}]}',
    '{"n": 7.0, "mad": 2, "clocks": {"sm": 1410}, "step": null}',  # a count written as a float: none
    "null",  # no summary: n 0, no statistic
    "{}",
    '{"n": 0, "p10": 0, "iqr": 0.0, "flags": ["throttled", "noisy"]}',
]
NOT_JSON = '{"n": 5, "p10": NaN, "p90": 2.0, "mad": Infinity, "flags": ["throttled"]}'  # Python writes these


def test_a_points_statistics_are_read_as_the_stored_summary_reads(store_url):
    """Every stored summary's values as Summary.from_stored reads them (a value of the wrong type or not
    finite absent, no summary n 0), on SQLite and PostgreSQL; on SQLite also a summary with NaN and
    Infinity, which its json functions cannot read (read in Python)."""
    from sqlalchemy import text

    from kernels.base import Summary

    store = Store(store_url)
    sqlite = store.engine.dialect.name == "sqlite"
    stored = STORED_SUMMARIES + ([NOT_JSON] if sqlite else [])
    trials = []
    for i in range(-(-len(stored) // 2)):  # probe-b: two trials a job
        job = spec_job(store, SPECS["probe-b"], git_commit=f"c{i}")
        store.record_results([result_of(t.id, [1000, 1010, 1020]) for t in store.trials(job)])
        trials += [t.id for t in store.trials(job)]
    value = ":s" if sqlite else "CAST(:s AS json)"
    with store.engine.begin() as conn:
        for tid, summary in zip(trials, stored, strict=False):
            conn.execute(
                text(f"UPDATE trials SET summary = {value} WHERE id = :id"), {"s": summary, "id": tid}
            )
    points = {p.trial_id: p for s in collect(store, Selection(family="probe")) for p in s.points}
    store.close()
    for tid, summary in zip(trials, stored, strict=False):
        want = Summary.from_stored(json.loads(summary))
        p = points[tid]
        assert (p.p10_ns, p.p90_ns, p.iqr_ns, p.mad_ns, p.n, p.flags) == (
            want.p10,
            want.p90,
            want.iqr,
            want.mad,
            want.n,
            want.flags,
        ), summary
    assert points[trials[0]].contended and points[trials[2]].flags == ("drift",)


def test_jobs_created_out_of_the_order_of_their_ids_are_taken_in_the_order_they_were_created(store_url):
    """The database returns a job's trials by job id; the series take the jobs in the order they were
    created (then id), as the old read did: a job created before one of a lower id (a clock set back, an
    import) comes first, on SQLite and PostgreSQL, in a family's series and in its newest jobs."""
    from datetime import timedelta

    from sqlalchemy import update

    store = Store(store_url)
    jobs = [spec_job(store, SPECS["probe-b"], git_commit=f"c{i}") for i in range(4)]
    for job in jobs:
        store.record_results([result_of(t.id, [1000 + job, 1010, 1020]) for t in store.trials(job)])
    with store.engine.begin() as conn:
        first = conn.scalar(select(Job.created_at).where(Job.id == jobs[0]))
        conn.execute(update(Job).where(Job.id == jobs[2]).values(created_at=first - timedelta(hours=1)))
    created = [jobs[2], jobs[0], jobs[1], jobs[3]]
    try:
        every = collect(store, Selection(family="probe"))
        assert every and all([p.job_id for p in s.points] == created for s in every)
        found = {s.key: [p.trial_id for p in s.points] for s in every}
        assert found == _old_collect(store, Selection(family="probe"))
        newest = collect(store, Selection(family="probe", last=3))
        assert newest and all([p.job_id for p in s.points] == created[1:] for s in newest)
        one = collect(store, Selection(family="probe", backend="wait", shape={"n": 64}, last=3))
        assert [[p.job_id for p in s.points] for s in one] == [created[1:]]
    finally:
        store.close()
