"""The compact summary a sweep ends with: per shape, the baseline, the fastest correct trial, its speedup
with a 95% interval, and the shape's worst assertion once judged."""

from __future__ import annotations

from rich.console import Console

from jobs.judge.acceptance import accept
from jobs.report.render import render_summary
from jobs.run.runner import create_job
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary

SPEC = """
name: probe-summary
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {include: [{ms: 1}]}}]
shapes: {grid: {n: [0, 1]}}
card: probe
"""


def _text(store: Store, job_id: int, acc=None) -> str:
    console = Console(record=True, width=160)
    render_summary(store, job_id, console, acc)
    return console.export_text()


def test_summary_names_the_best_trial_its_speedup_interval_and_the_verdict(tmp_path):
    store = Store(str(tmp_path / "farm.db"))
    job_id = create_job(store, loads_spec(SPEC))
    results = []
    for t in store.trials(job_id):  # the baseline ~2 ms, the other ~1 ms: a 2x speedup, tight interval
        base = 2_000_000 if t.baseline else 1_000_000
        samples = [base + 1_000 * (i % 5) for i in range(30)]
        summary = Summary.from_stored({"median": float(sorted(samples)[15]), "n": 30})
        results.append(result_of(t.id, samples, summary=summary))
    store.record_results(results)
    store.set_job_status(job_id, "completed")

    text = _text(store, job_id)
    assert "summary of job" in text and "verdict" not in text  # not judged: no verdict column
    lines = [line for line in text.splitlines() if line.startswith("│ n=")]
    assert len(lines) == 2, text
    for line in lines:
        assert "spin ms=1" in line, line
        speed = line.split("│")[5]
        value, interval = speed.split("x [")
        low, high = (float(v) for v in interval.rstrip("] ").split(","))
        assert low <= float(value) <= high and 1.9 < low and high < 2.1, line

    acc = accept(store, job_id, ambiguous="warn")
    judged = _text(store, job_id, acc)
    assert "verdict" in judged and all(
        ("pass" in line or "ambiguous" in line or "fail" in line)
        for line in judged.splitlines()
        if line.startswith("│ n=")
    ), judged
    store.close()
