"""Sweeps on a local Ray with 4 logical GPUs (one Ray for the whole module)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from rich.console import Console

from jobs.report import render as report
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec


@pytest.fixture(scope="module")
def plan(ray_local):
    return ray_local  # the session's Ray: 4 logical GPUs, more than its 2 cores


def _quiet(**kw) -> RunOptions:
    return RunOptions(show_progress=False, echo=lambda _msg: None, oversubscribe=True, **kw)


def _probe(backends: str, shapes: int, timeout_s: float = 30, max_attempts: int = 3) -> str:
    return f"""
name: probe-test
family: probe
backends: {backends}
shapes: {{grid: {{n: {list(range(shapes))}}}}}
measure: {{warmup_ms: 0, min_samples: 1, max_samples: 2, max_time_s: 0.5}}
timeout_s: {timeout_s}
max_attempts: {max_attempts}
"""


def test_plan_has_one_worker_per_logical_gpu(plan):
    assert plan.gpu and plan.workers == 4 and not plan.cuda
    assert "logical GPU" in plan.note


@pytest.mark.slow  # 16 trials on 4 workers started for it
def test_every_trial_stored_once_each_actor_on_its_own_device(plan, store):
    spec = loads_spec(_probe("[{name: spin, baseline: true, configs: {grid: {ms: [150]}}}]", 16))
    result = run_sweep(spec, store, _quiet())
    assert result.status == "completed" and result.exit_code == 0
    trials = store.trials(result.job_id)
    assert len(trials) == 16 and len({t.key for t in trials}) == 16
    assert all(t.status == "ok" and t.attempt == 1 for t in trials)
    for t in trials:
        assert len(store.samples(t.id)) == t.summary["n"] >= 1
        # the device Ray pinned the actor to is the one the trial saw
        assert t.gpu_id is not None and t.metrics["cuda_visible_devices"] == t.gpu_id
    by_worker = {}
    for t in trials:
        by_worker.setdefault(t.worker, set()).add(t.gpu_id)
    assert len(by_worker) >= 2, by_worker
    assert all(len(ids) == 1 for ids in by_worker.values())
    devices = [next(iter(ids)) for ids in by_worker.values()]
    assert len(set(devices)) == len(devices), by_worker
    env = store.environments(result.job_id)
    assert env and all(e.device_kind == "cpu" for e in env)


@pytest.mark.slow  # workers killed and started again
def test_killing_a_worker_mid_sweep_finishes_every_trial_once(plan, store):
    spec = loads_spec(_probe("[{name: spin, baseline: true, configs: {grid: {ms: [20]}}}]", 24))
    killed: list[int] = []

    def observe(result, worker):
        # SIGKILL the worker that just finished a trial, as the OOM killer would; it holds the next one
        if not killed and result.status == "ok":
            os.kill(worker["pid"], signal.SIGKILL)
            killed.append(worker["pid"])

    result = run_sweep(spec, store, _quiet(observer=observe))
    assert killed
    trials = store.trials(result.job_id)
    assert result.status == "completed" and result.exit_code == 0
    assert len(trials) == 24 and all(t.status == "ok" for t in trials)
    assert sum(len(store.samples(t.id)) for t in trials) == sum(t.summary["n"] for t in trials)
    # the trial that was running on the killed actor was retried and its attempt counted
    assert any(t.attempt == 2 for t in trials), [t.attempt for t in trials]


@pytest.mark.slow  # workers killed and started again
def test_hung_trial_is_stopped_at_its_timeout_and_the_sweep_goes_on(plan, store):
    # 5 s: the noop trials share the timeout, and must finish inside it on a loaded machine too
    spec = loads_spec(
        _probe("[{name: noop, baseline: true}, {name: sleep, configs: {grid: {s: [600]}}}]", 3, 5)
    )
    started = time.monotonic()
    result = run_sweep(spec, store, _quiet())
    elapsed = time.monotonic() - started
    trials = store.trials(result.job_id)
    statuses = {(t.backend, t.shape["n"]): t.status for t in trials}
    assert statuses == {
        **{("noop", n): "ok" for n in range(3)},
        **{("sleep", n): "timeout" for n in range(3)},
    }
    assert all("timeout_s" in t.error for t in trials if t.status == "timeout")
    assert result.status == "completed" and result.exit_code == 1
    assert elapsed < 120


@pytest.mark.slow  # workers killed and started again
def test_crashing_trial_is_retried_then_stored_as_crashed(plan, store):
    spec = loads_spec(
        _probe("[{name: noop, baseline: true}, {name: crash}]", 2, timeout_s=120, max_attempts=2)
    )
    result = run_sweep(spec, store, _quiet())
    trials = store.trials(result.job_id)
    crashed = [t for t in trials if t.backend == "crash"]
    assert all(t.status == "crashed" and t.attempt == 2 for t in crashed)
    assert all("worker died on all 2 attempts" in t.error for t in crashed)
    assert all(t.status == "ok" for t in trials if t.backend == "noop"), [(t.status, t.error) for t in trials]


@pytest.mark.slow  # a real gemm sweep
def test_report_renders_for_a_finished_gemm_job(plan, store, tmp_path):
    spec = loads_spec("""
name: gemm-tiny
family: gemm
backends: [{name: torch_fp32, baseline: true}, {name: torch_bf16}]
shapes: {grid: {m: [8, 16], n: [16], k: [32]}}
measure: {warmup_ms: 1, min_samples: 5, max_samples: 20, max_time_s: 0.5}
timeout_s: 60
""")
    result = run_sweep(spec, store, _quiet())
    assert result.exit_code == 0, store.trials(result.job_id)
    console = Console(record=True, width=200)
    report.render_terminal(store, result.job_id, console)
    text = console.export_text()
    assert "shape m=8 n=16 k=32" in text and "torch_fp32 (base)" in text and "torch_bf16" in text
    # each row says the dtype that ran: bf16 for the bf16 backend, though the spec's inputs are fp32
    bf16_rows = [line for line in text.splitlines() if "torch_bf16" in line]
    assert bf16_rows and all("bfloat16" in line for line in bf16_rows), text
    assert "CPU timings" in text and text.count("pass") == 4
    rows = json.loads(report.to_json(store, result.job_id))
    assert len(rows) == 4 and all(r["median_ms"] > 0 and r["tflops"] > 0 for r in rows)
    assert all(r["speedup"] == pytest.approx(1.0) for r in rows if r["baseline"])
    assert report.to_csv(store, result.job_id).splitlines()[0].startswith("trial,shape,backend")
    page = report.render_html(store, result.job_id)
    assert page.count("Plotly.newPlot(") >= 2 and "CPU timings" in page and "torch_bf16" in page


@pytest.mark.slow  # workers killed and started again
def test_one_worker_survives_trials_that_keep_crashing_it(plan, store):
    # The crashing trials, not the worker slot, are to blame: the slot must not retire before they
    # have used up their attempts, or the job would end with trials never run.
    spec = loads_spec(
        _probe("[{name: noop, baseline: true}, {name: crash}]", 2, timeout_s=120, max_attempts=3)
    )
    result = run_sweep(spec, store, _quiet(gpus=1))
    trials = store.trials(result.job_id)
    assert result.status == "completed" and result.exit_code == 1, result
    assert sorted((t.backend, t.status, t.attempt) for t in trials) == [
        ("crash", "crashed", 3), ("crash", "crashed", 3), ("noop", "ok", 1), ("noop", "ok", 1)
    ]  # fmt: skip
