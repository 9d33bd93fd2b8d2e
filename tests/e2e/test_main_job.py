"""The README's main job, as `make run` starts it: sweep, report, acceptance by the card, drafts.

The shipped spec's anomalies come from CPU noise (none on a quiet run), so the drafting step is also run
on the same spec with one fault that is there on every machine: a bf16 trial whose result is wrong (the
gemm `_perturb` knob). Its `correctness` anomaly must reach the offline drafter and come back as drafts
stored with the job."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from jobs.cli import main
from jobs.store import Store

pytestmark = pytest.mark.slow  # CPU sweeps of the main spec, the first in a fresh farm process

ROOT = Path(__file__).resolve().parents[2]
MAIN_SPEC = ROOT / "jobs/specs/gemm_cpu.yaml"


def _sweep(spec: Path, db: Path, cwd: Path) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "sweep", "run", str(spec),
         "--db", str(db), "--quiet", "--ambiguous", "warn"],
        capture_output=True, text=True, timeout=600, cwd=cwd,
    )  # fmt: skip
    return run.returncode, run.stdout + run.stderr


def _check_drafts_match_anomalies(store: Store, job: int, out: str) -> None:
    """Drafting ran exactly when there was something to draft, and what it stored says where it came from."""
    run_row, drafts = store.drafts(job)
    if store.anomalies(job):
        assert "offline drafter" in out, out
        assert run_row is not None and run_row.offline and drafts, (run_row, drafts)
        assert all(d.offline and d.assertion and d.fingerprints for d in drafts)
    else:
        assert "no anomalies to draft" in out, out
        assert not drafts


def test_main_job_sweeps_reports_judges_and_drafts(tmp_path):
    db = tmp_path / "farm.db"
    code, out = _sweep(MAIN_SPEC, db, tmp_path)
    assert code == 0, out
    assert "shape m=64 n=256 k=256" in out and "torch_fp32 (base)" in out  # the report
    assert "assertions:" in out and ("verdict: pass" in out or "verdict: warn" in out)  # the card's verdict
    store = Store(str(db))
    try:
        assert store.status_counts(1) == {"ok": 10}
        _check_drafts_match_anomalies(store, 1, out)
    finally:
        store.close()


def test_the_main_job_drafts_a_checklist_for_a_wrong_result(tmp_path, ray_local, monkeypatch):
    """The same command in this process (on the session's Ray: the process and Ray starts are the test
    above's), on the main spec with one wrong result."""
    spec = yaml.safe_load(MAIN_SPEC.read_text())
    spec["shapes"] = {"grid": {"m": [64], "n": [256], "k": [256]}}  # one shape is enough for the fault
    spec["backends"][1]["configs"] = {"include": [{"_perturb": 1.0}]}  # bf16's first element off by 1
    faulty = tmp_path / "gemm_cpu_wrong.yaml"
    faulty.write_text(yaml.safe_dump(spec))
    db = tmp_path / "farm.db"
    monkeypatch.delenv("FARM_GATEWAY_KEY", raising=False)  # the built-in offline drafter, as `make run`
    run = CliRunner().invoke(
        main, ["sweep", "run", str(faulty), "--db", str(db), "--quiet", "--ambiguous", "warn"]
    )
    code, out = run.exit_code, run.output
    assert code == 1, out  # a wrong result fails the card's verdict
    store = Store(str(db))
    try:
        kinds = {a.kind for a in store.anomalies(1)}
        assert "correctness" in kinds, kinds
        _check_drafts_match_anomalies(store, 1, out)
        _run, drafts = store.drafts(1)
        assert any("torch_bf16" in (d.assertion + d.failure_signature) for d in drafts), drafts
    finally:
        store.close()
