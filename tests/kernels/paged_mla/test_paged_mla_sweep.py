"""One small end-to-end sweep of the CPU spec (trimmed to one shape) on a local Ray with 2 logical GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import session
from jobs.report import render as report
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import parse_spec
from jobs.store import Store

CPU_SPEC = Path(__file__).resolve().parents[3] / "jobs" / "specs" / "paged_mla_cpu.yaml"


@pytest.fixture(scope="module")
def plan(ray_local):
    return session.connect(gpus=2)


@pytest.mark.slow
def test_cpu_spec_sweep_stores_metrics_and_the_trace_plot(plan, tmp_path):
    data = yaml.safe_load(CPU_SPEC.read_text())
    data["shapes"]["grid"]["page_size"] = [16]
    data["shapes"].pop("include")
    for b in data["backends"]:
        if b["name"] == "triton":
            b["configs"] = {"grid": {"num_splits": [2]}}
    spec = parse_spec(data, str(CPU_SPEC))
    store = Store(str(tmp_path / "farm.db"))
    try:
        result = run_sweep(spec, store, RunOptions(gpus=2, show_progress=False, echo=lambda _msg: None))
        trials = store.trials(result.job_id)
        assert result.exit_code == 0 and result.status == "completed", [(t.backend, t.error) for t in trials]
        by_backend = {t.backend: t for t in trials}
        assert set(by_backend) == {"torch_ref", "triton", "cache_trace"}
        for name in ("torch_ref", "triton"):
            t = by_backend[name]
            assert t.correct and t.median_ns > 0 and t.metrics["gbps"] > 0 and "page_hit_rate" in t.metrics
        trace = by_backend["cache_trace"]
        assert trace.correct and trace.metrics["evictions"] > 0 and trace.metrics["timeseries"]["x"]
        page = report.render_html(store, result.job_id)
        assert "KV cache trace, page 16" in page
    finally:
        store.close()
