"""The driver dies (SIGKILL) or is interrupted (Ctrl-C) mid-sweep; `farm sweep resume` finishes the job.

Each run is a real `farm` process with its own local Ray, as a user would start it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.store import Store

pytestmark = pytest.mark.slow  # real farm processes interrupted and resumed

N_TRIALS = 20
SPEC = f"""
name: resume-me
family: probe
backends: [{{name: spin, baseline: true, configs: {{grid: {{ms: [150]}}}}}}]
shapes: {{grid: {{n: {list(range(N_TRIALS))}}}}}
measure: {{warmup_ms: 0, min_samples: 1, max_samples: 1, max_time_s: 1}}
timeout_s: 60
"""


def _farm(*args: str) -> subprocess.Popen:
    # A session of its own, so the test can clean up every process the driver left behind.
    # SIGINT back to its default in the child: a test run started in the background by a non-interactive
    # shell inherits SIGINT ignored, and Python then installs no KeyboardInterrupt handler (CI saw the
    # Ctrl-C test's sweep run to the end).
    return subprocess.Popen(
        [sys.executable, "-m", "jobs.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for_ok(
    store: Store, job_id: int, at_least: int, proc: subprocess.Popen, limit_s: float = 180
) -> None:
    """Poll the store (the only signal another process gives) until enough trials have finished."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if store.status_counts(job_id).get("ok", 0) >= at_least:
            return
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    raise AssertionError(f"fewer than {at_least} trials finished in {limit_s} s")


def _cleanup(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.fixture
def spec_and_db(tmp_path: Path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(SPEC)
    return spec, tmp_path / "farm.db"


def _finished(store: Store, job_id: int) -> dict[int, tuple]:
    return {t.id: (t.finished_at, t.attempt, t.median_ns) for t in store.trials(job_id) if t.status == "ok"}


def _resume_and_check(store: Store, db: Path, job_id: int, before: dict[int, tuple]) -> None:
    resume = _farm("sweep", "resume", str(job_id), "--db", str(db), "--quiet", "--gpus", "2", "--no-report")
    try:
        out, _ = resume.communicate(timeout=300)
    finally:
        _cleanup(resume)
    assert resume.returncode == 0, out
    trials = store.trials(job_id)
    assert len(trials) == N_TRIALS and all(t.status == "ok" for t in trials)
    after = _finished(store, job_id)
    # nothing finished before was run again: same finish time, attempt and result
    assert {k: after[k] for k in before} == before
    assert all(len(store.samples(t.id)) == 1 for t in trials)
    assert store.get_job(job_id).status == "completed"


@contextlib.contextmanager
def _sweep_run(spec: Path, db: Path, store: Store, ok: int) -> Iterator[subprocess.Popen]:
    """`farm sweep run` of the spec on 2 workers (job 1), once `ok` of its trials are done; every process
    it left behind is cleaned up after."""
    run = _farm("sweep", "run", str(spec), "--db", str(db), "--quiet", "--gpus", "2")
    try:
        _wait_for_ok(store, 1, ok, run)
        yield run
    finally:
        _cleanup(run)


def test_sigkill_driver_then_resume(spec_and_db):
    spec, db = spec_and_db
    store = Store(str(db))
    with _sweep_run(spec, db, store, 3) as run:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    before = _finished(store, 1)
    assert 3 <= len(before) < N_TRIALS
    _resume_and_check(store, db, 1, before)


def test_ctrl_c_stops_cleanly_and_leaves_the_job_resumable(spec_and_db):
    spec, db = spec_and_db
    store = Store(str(db))
    with _sweep_run(spec, db, store, 2) as run:
        os.kill(run.pid, signal.SIGINT)
        out, _ = run.communicate(timeout=60)
    assert run.returncode == 130, out
    assert "farm sweep resume 1" in out
    job = store.get_job(1)
    assert job.status == "interrupted"
    before = _finished(store, 1)
    assert len(before) < N_TRIALS
    _resume_and_check(store, db, 1, before)
