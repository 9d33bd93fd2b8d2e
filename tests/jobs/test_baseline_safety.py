"""Baselines are safe (issue 18): `farm baseline set` silently moved the team's baseline `main` to a job
of another family ("baseline main moved to job 3"). A named baseline now moves only with --force, never
to another family or spec, and every setting is kept in its history (`farm baseline list --history`);
on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: {name}
family: {family}
backends: [{{name: {backend}, baseline: true}}]
shapes: {{grid: {shapes}}}
"""
PROBE = SPEC.format(name="probe-main", family="probe", backend="noop", shapes="{n: [0, 1]}")
OTHER_SPEC = SPEC.format(name="probe-other", family="probe", backend="noop", shapes="{n: [0, 1]}")
GEMM = SPEC.format(name="gemm-main", family="gemm", backend="torch_fp32", shapes="{m: [8], n: [8], k: [8]}")
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU"}


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request, tmp_path) -> str:
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres")
        return server.url(server.create_database("farm"))
    return str(tmp_path / "farm.db")


def _job(db: str, text: str) -> str:
    store = Store(db)
    job = spec_job(store, text)
    store.record_results(
        [
            result_of(t.id, [10], summary=Summary.from_stored({"median": 10.0}), environment=ENV)
            for t in store.trials(job)
        ]
    )  # fmt: skip
    store.close()
    return str(job)


def farm(*args: str):
    return CliRunner().invoke(main, list(args))


def _on(db: str, name: str) -> int:
    store = Store(db)
    try:
        return store.get_baseline(name).job_id
    finally:
        store.close()


def test_a_named_baseline_moves_only_with_force_and_within_its_family_and_spec(db):
    first, second = _job(db, PROBE), _job(db, PROBE)
    gemm, other = _job(db, GEMM), _job(db, OTHER_SPEC)
    res = farm("baseline", "set", first, "--name", "main", "--db", db)
    assert res.exit_code == 0 and "set to job" in res.output, res.output
    # the mistyped id: another family is refused, naming both, even with --force
    for force in ([], ["--force"]):
        res = farm("baseline", "set", gemm, "--name", "main", *force, "--db", db)
        assert res.exit_code == 2, res.output
        assert "family probe" in res.output and "family gemm" in res.output, res.output
        assert _on(db, "main") == int(first)
    # another spec of the same family: refused too
    res = farm("baseline", "set", other, "--name", "main", "--force", "--db", db)
    assert res.exit_code == 2 and "spec probe-main" in res.output and "spec probe-other" in res.output
    # a newer job of the same spec: needs --force
    res = farm("baseline", "set", second, "--name", "main", "--db", db)
    assert res.exit_code == 2 and "--force" in res.output and _on(db, "main") == int(first), res.output
    res = farm("baseline", "set", second, "--name", "main", "--force", "--db", db)
    assert res.exit_code == 0 and f"moved from job {first} to job {second}" in res.output, res.output
    assert _on(db, "main") == int(second)
    # setting it again on the job it is on needs nothing
    res = farm("baseline", "set", second, "--name", "main", "--db", db)
    assert res.exit_code == 0 and "refreshed" in res.output, res.output


def test_every_move_is_kept_in_the_history(db):
    first, second = _job(db, PROBE), _job(db, PROBE)
    assert farm("baseline", "set", first, "--name", "main", "--db", db).exit_code == 0
    assert farm("baseline", "set", second, "--name", "main", "--force", "--db", db).exit_code == 0
    assert farm("baseline", "set", first, "--name", "main", "--force", "--db", db).exit_code == 0
    store = Store(db)
    moves = [(m.job_id, m.previous_job_id, m.forced) for m in store.baseline_history("main")]
    store.close()
    a, b = int(first), int(second)
    assert moves == [(a, None, False), (b, a, True), (a, b, True)]
    res = farm("baseline", "list", "--history", "--db", db)
    assert res.exit_code == 0, res.output
    rows = [line for line in res.output.splitlines() if "main" in line]
    assert len(rows) == 3 and "yes" in rows[1] and "probe-main" in rows[0], res.output
