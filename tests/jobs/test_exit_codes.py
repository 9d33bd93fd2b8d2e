"""Errors CI can trust (issue 18): infrastructure errors (store, cluster, file system) exit 4 with one
line naming the problem and the fix, never a traceback (that only with `farm --debug`); "no such job"
exits 2 with the same message from every command; reading commands work on a read-only store."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine

from jobs.cli import main
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from testkit.jobs import spec_job

SPEC = """
name: codes
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1]}}
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU"}


def _store_with_a_job(path: Path) -> int:
    store = Store(str(path))
    job = spec_job(store, SPEC)
    store.record_results(
        [
            result_of(t.id, [10, 11], summary=Summary.from_stored({"median": 10.0 + t.seq}), correct=True,
                      environment=ENV)
            for t in store.trials(job)
        ]
    )  # fmt: skip
    store.set_job_status(job, "completed")
    store.close()
    return job


def farm(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_line_4(res, *words: str) -> None:
    assert res.exit_code == 4, res.output
    assert "Traceback" not in res.output, res.output
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    for w in words:
        assert w in lines[0], res.output


def test_a_corrupt_sqlite_file_is_one_line_and_exit_4(tmp_path):
    db = tmp_path / "farm.db"
    db.write_bytes(b"this is not a database, it is a text file of sixty-four bytes.....")
    for args in (["jobs", "list"], ["report", "1"], ["baseline", "list"]):
        _one_line_4(farm(*args, "--db", str(db)), str(db), "not a readable SQLite database", "--db")
    # the traceback only with --debug; the code stays 4
    res = farm("--debug", "jobs", "list", "--db", str(db))
    assert res.exit_code == 4 and "Traceback" in res.output, res.output


def test_an_unknown_url_scheme_is_one_line_and_exit_4():
    _one_line_4(farm("jobs", "list", "--db", "mysqlx://farm/db"), "unknown database URL scheme 'mysqlx'")


def test_a_missing_output_folder_is_one_line_and_exit_4(tmp_path):
    db = str(tmp_path / "farm.db")
    job = str(_store_with_a_job(tmp_path / "farm.db"))
    missing = tmp_path / "no" / "such"
    cases = [
        ["report", job, "--format", "csv", "-o", str(missing / "job.csv")],
        ["report", job, "--html", str(missing / "job.html")],
        ["export", "best-configs", job, "--backend", "spin", "-o", str(missing / "best.json")],
    ]
    for args in cases:
        _one_line_4(farm(*args, "--db", db), str(missing), "does not exist")
    assert not missing.exists()


def test_no_such_job_is_exit_2_with_one_message_everywhere(tmp_path):
    db = str(tmp_path / "farm.db")
    job = str(_store_with_a_job(tmp_path / "farm.db"))
    cases = [
        ["jobs", "show", "999"],
        ["report", "999"],
        ["compare", "999", job],
        ["compare", job, "999"],
        ["export", "best-configs", "999"],
        ["baseline", "set", "999", "--name", "main"],
        ["accept", "999"],
        ["sweep", "resume", "999"],
    ]
    for args in cases:
        res = farm(*args, "--db", db)
        assert res.exit_code == 2, (args, res.output)
        assert "no job 999 in the farm store" in res.output and "Traceback" not in res.output, (
            args,
            res.output,
        )


def _read_only(share: Path) -> list[str] | None:
    """A command prefix under which ``share`` is read-only for the command: a read-only bind mount in a
    mount namespace of its own when we are root (root writes any file whatever its mode), else the
    folder's and file's modes; None when neither is possible here."""
    if os.geteuid() != 0:
        for path in (*share.iterdir(), share):
            path.chmod(0o555 if path.is_dir() else 0o444)
        return []
    prefix = ["unshare", "-m", "--propagation", "private", "sh", "-c",
              'mount --bind -o ro "$0" "$0" && exec "$@"', str(share)]  # fmt: skip
    probe = subprocess.run([*prefix, "touch", str(share / "probe")], capture_output=True, text=True)
    if probe.returncode == 0 or "Read-only" not in probe.stderr:
        return None
    return prefix


@pytest.mark.slow  # farm processes in a read-only mount
def test_reading_commands_work_on_a_read_only_store():
    share = Path(tempfile.mkdtemp(prefix="kf-ro-", dir="/tmp"))
    try:
        db = share / "farm.db"
        job = str(_store_with_a_job(db))
        assert not Path(f"{db}-wal").exists()  # the last connection folded the WAL back into the file
        prefix = _read_only(share)
        if prefix is None:
            pytest.skip(
                "cannot make a folder read-only for a child process here (root without unshare/mount)"
            )
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        env.pop("FARM_DB", None)

        def run(*args: str) -> subprocess.CompletedProcess:
            cmd = [*prefix, sys.executable, "-m", "jobs.cli", *args, "--db", str(db)]
            return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)

        for args in (["jobs", "list"], ["report", job], ["baseline", "list"], ["compare", job, job]):
            res = run(*args)
            assert res.returncode == 0, (args, res.stderr[-2000:])
        # compare answers, and says in one line why its comparison is not kept
        assert "not kept: the farm store" in res.stderr and "is read-only" in res.stderr  # (the last run)
        # writing is refused in one line naming the problem, and the file is unchanged
        before = db.read_bytes()
        res = run("baseline", "set", job, "--name", "main")
        assert res.returncode == 4, res.stderr[-2000:]
        assert "read-only" in res.stderr and "Traceback" not in res.stderr, res.stderr
        assert db.read_bytes() == before
        assert sorted(p.name for p in share.iterdir()) == ["farm.db"]
    finally:
        for path in (share, *share.iterdir()):
            path.chmod(0o755)
        shutil.rmtree(share, ignore_errors=True)


def test_a_family_without_its_own_export_gets_the_fastest_config_per_shape(tmp_path):
    """`farm export best-configs` is the family's export (KernelFamily.best_configs): fp8_gemm writes Triton
    ports' keys; any other family the fastest correct config of the backend per shape."""
    db = str(tmp_path / "farm.db")
    job = str(_store_with_a_job(tmp_path / "farm.db"))
    res = farm("export", "best-configs", job, "--backend", "spin", "--db", db)
    assert res.exit_code == 0, res.output
    table = json.loads(res.stdout)
    assert table and all(
        set(v) == {"config", "median_ns"} and v["config"] == {"ms": 1} for v in table.values()
    )
    assert all(key.startswith("n=") for key in table)


def test_errors_name_the_store_as_it_was_given(tmp_path, monkeypatch):
    """Issue 32: every "no job N" on a store given as a file path said "in the farm store (unparsable
    URL)". The store is named as the user gave it: a path (relative, absolute, the default) or a URL."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FARM_DB", raising=False)
    _store_with_a_job(tmp_path / ".farm" / "farm.db")
    _store_with_a_job(tmp_path / "other.db")
    given = {
        None: ".farm/farm.db",  # the default
        ".farm/farm.db": ".farm/farm.db",
        "other.db": "other.db",
        str(tmp_path / "other.db"): str(tmp_path / "other.db"),
        f"sqlite:///{tmp_path / 'other.db'}": f"sqlite:///{tmp_path / 'other.db'}",
    }
    for db, shown in given.items():
        for args in (["jobs", "show", "999"], ["report", "999"], ["compare", "999", "1"]):
            res = farm(*args, *(["--db", db] if db else []))
            assert res.exit_code == 2, (db, args, res.output)
            assert f"no job 999 in the farm store {shown} (" in res.output, (db, args, res.output)
            assert "unparsable" not in res.output


def test_a_store_error_names_the_path_as_given_not_a_rewritten_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("bad.db").write_bytes(b"this is not a database, it is a text file of sixty-four bytes.....")
    res = farm("jobs", "list", "--db", "bad.db")
    _one_line_4(res, "the farm store bad.db is not a readable SQLite database")
    assert "sqlite://" not in res.output


def test_a_schema_problem_names_the_store_as_given(tmp_path, monkeypatch):
    """The schema checks (schemakit) named the engine's URL (sqlite:///..., or the file: URI of a store
    opened read-only): they name the store as the user gave it, here a relative path."""
    from sqlalchemy import text

    monkeypatch.chdir(tmp_path)
    Store("newer.db").close()
    engine = create_engine("sqlite:///newer.db")
    with engine.begin() as conn:
        conn.execute(text("UPDATE farm_alembic_version SET version_num = 'ffff0000'"))
    engine.dispose()
    for args in (["jobs", "list"], ["db", "upgrade"]):
        res = farm(*args, "--db", "newer.db")
        _one_line_4(res, "the farm store newer.db is at schema revision ffff0000")
        assert "sqlite://" not in res.output, res.output


READ_COMMANDS = [
    ["jobs", "list"],
    ["jobs", "show", "1"],
    ["report", "1"],
    ["history", "--family", "probe"],
    ["compare", "1", "2"],
    ["export", "best-configs", "1"],
    ["baseline", "list"],
    ["failures", "list"],
    ["accept", "1"],
    ["site", "-o", "site"],
]


def test_a_reading_command_on_a_store_that_does_not_exist_says_so_and_creates_nothing(tmp_path, monkeypatch):
    """Issue 32: `farm jobs list` in an empty folder created .farm/farm.db, so a mistyped --db looked like
    an empty store. A command that only reads refuses a store that does not exist: one line, exit 2."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FARM_DB", raising=False)
    for db, shown in (
        (None, ".farm/farm.db"),
        ("typo.db", "typo.db"),
        ("sub/typo.db", "sub/typo.db"),
        (f"sqlite:///{tmp_path / 'typo.db'}", f"sqlite:///{tmp_path / 'typo.db'}"),
    ):
        for args in READ_COMMANDS:
            res = farm(*args, *(["--db", db] if db else []))
            assert res.exit_code == 2, (db, args, res.output)
            lines = [line for line in res.output.splitlines() if line.strip()]
            assert len(lines) == 1 and "Traceback" not in res.output, (db, args, res.output)
            assert f"no farm store at {shown}" in lines[0], (db, args, res.output)
        assert sorted(p.name for p in tmp_path.iterdir()) == [], (db, list(tmp_path.iterdir()))
    # FARM_DB is named as the place it came from
    monkeypatch.setenv("FARM_DB", "from-env.db")
    res = farm("jobs", "list")
    assert res.exit_code == 2 and "no farm store at from-env.db" in res.output and "FARM_DB" in res.output


def test_only_commands_that_write_create_a_store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FARM_DB", raising=False)
    res = farm("db", "upgrade", "--db", "a.db")
    assert res.exit_code == 0 and Path("a.db").is_file(), res.output
    res = farm("baseline", "set", "1", "--name", "main", "--db", "b.db")
    assert res.exit_code == 2 and "no job 1 in the farm store b.db" in res.output and Path("b.db").is_file()
    res = farm("sweep", "resume", "1")
    assert res.exit_code == 2 and Path(".farm/farm.db").is_file(), res.output
    assert farm("jobs", "list").exit_code == 0  # the store now exists: reading it works


_RAY_START_FAILS = """
import sys

import ray

def start_times_out(*_args, **_kwargs):
    raise {error}

ray.init = start_times_out  # what ray.init raises when its processes do not come up in time
from jobs.cli import main

main(sys.argv[1:])
"""


@pytest.mark.parametrize(
    "error",
    [
        'Exception("The current node timed out during startup. This could happen because some of the Ray '
        'processes failed to startup.")',
        'TimeoutError("Timed out after 30 seconds waiting for the GCS to start")',
        'RuntimeError("Failed to start the raylet")',
        'ConnectionError("GCS did not answer")',
    ],
)
def test_a_local_ray_that_does_not_start_is_one_line_and_exit_4(tmp_path, error):
    """Issue 32: a local Ray that timed out starting (a loaded machine) gave a raw traceback and exit 1.
    The start is made to fail here (ray.init replaced in a farm process of its own, no Ray started)."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    db = tmp_path / "farm.db"
    env = {k: v for k, v in os.environ.items() if k not in ("FARM_DB", "FARM_RAY_ADDRESS")}
    for args in (["sweep", "run", str(spec), "--quiet"], ["sweep", "resume", "1", "--quiet"]):
        out = subprocess.run(
            [sys.executable, "-c", _RAY_START_FAILS.format(error=error), *args, "--db", str(db)],
            capture_output=True, text=True, env=env, timeout=120,
        )  # fmt: skip
        if args[1] == "run":  # the job is created only after Ray started: none to resume
            store = Store(str(db))
            assert store.list_jobs() == [], out.stderr
            spec_ = loads_spec(SPEC)
            store.create_job(
                name=spec_.name, family=spec_.family, spec_yaml=SPEC, spec_hash=spec_.spec_hash(),
                trials=spec_.trials(), git_commit=None,
            )  # fmt: skip
            store.close()
        assert out.returncode == 4, (args, out.stdout, out.stderr[-3000:])
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in out.stderr, (args, out.stderr[-3000:])
        assert "cannot start a local Ray" in lines[0] and "--address" in lines[0], lines[0]
