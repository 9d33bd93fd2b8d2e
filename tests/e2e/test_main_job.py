"""The README's main job, as `make run` starts it: sweep, report, acceptance by the card, drafts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobs.store.repository import Store

ROOT = Path(__file__).resolve().parents[2]


def test_main_job_sweeps_reports_judges_and_drafts(tmp_path):
    db = tmp_path / "farm.db"
    run = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "sweep", "run", str(ROOT / "jobs/specs/gemm_cpu.yaml"),
         "--db", str(db), "--quiet", "--ambiguous", "warn"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert "shape m=64 n=256 k=256" in out and "torch_fp32 (base)" in out  # the report
    assert "assertions:" in out and ("verdict: pass" in out or "verdict: warn" in out)  # the card's verdict
    store = Store(str(db))
    assert store.status_counts(1) == {"ok": 10}
    if store.anomalies(1):  # CPU noise decides whether there is anything to draft
        assert "offline drafter" in out
        run_row, drafts = store.drafts(1)
        assert run_row is not None and run_row.offline and drafts
    else:
        assert "no anomalies to draft" in out
