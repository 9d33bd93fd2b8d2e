"""attention_cpu.yaml end to end on a local Ray with 2 logical GPUs (Triton interpreter on the CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import session
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import load_spec
from jobs.store import Store

SPEC = Path(__file__).resolve().parents[3] / "jobs" / "specs" / "attention_cpu.yaml"


@pytest.fixture(scope="module")
def plan(ray_local):
    return session.connect(gpus=2)


def test_cpu_spec_sweeps_every_trial_correct(plan, tmp_path):
    store = Store(str(tmp_path / "farm.db"))
    try:
        spec = load_spec(SPEC)
        result = run_sweep(spec, store, RunOptions(gpus=2, show_progress=False, echo=lambda _msg: None))
        assert result.status == "completed" and result.exit_code == 0
        trials = store.trials(result.job_id)
        assert len(trials) == len(spec.trials())
        assert all(t.status == "ok" and t.correct for t in trials), [
            (t.backend, t.shape, t.error) for t in trials
        ]
        sweep = sorted(
            (t.shape["batch"], t.metrics["latency_per_token_us"])
            for t in trials
            if t.backend == "triton" and t.shape["mode"] == "decode"
        )
        assert [b for b, _ in sweep] == [1, 2, 4] and all(v > 0 for _, v in sweep)
        assert all(t.metrics["timing"] == "cpu (Triton interpreter)" for t in trials if t.backend == "triton")
    finally:
        store.close()
