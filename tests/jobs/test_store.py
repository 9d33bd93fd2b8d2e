"""The results store on a real SQLite file: one row per trial, first result wins, samples kept raw."""

from __future__ import annotations

import dataclasses

from jobs.report import render as report
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import TrialResult, result_of
from kernels.base import Summary

SPEC = """
name: store-test
family: probe
backends: [{name: noop, baseline: true}, {name: spin, configs: {grid: {ms: [1]}}}]
shapes: {grid: {n: [0, 1, 2]}}
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU", "torch": "x"}


def _job(store: Store) -> int:
    spec = loads_spec(SPEC)
    return store.create_job(
        name=spec.name,
        family=spec.family,
        spec_yaml=SPEC,
        spec_hash=spec.spec_hash(),
        trials=spec.trials(),
        git_commit="abc",
    )


def _result(trial_id: int, samples: list[int], **extra) -> TrialResult:
    return result_of(trial_id, samples, worker="w0", node="n", environment=ENV, **extra)


def test_job_rows_results_and_resume_set(tmp_path):
    store = Store(str(tmp_path / "f.db"))
    job = _job(store)
    trials = store.trials(job)
    assert len(trials) == 6 and {t.status for t in trials} == {"pending"}
    first, second = trials[0], trials[1]
    store.record_results([_result(first.id, [5, 3, 4]), _result(second.id, [9])])
    # a late duplicate result for a finished trial changes nothing and adds no samples
    store.record_results([_result(first.id, [100, 100], error="late")])
    # the same trial twice in one flush: the first wins
    third = trials[2]
    store.record_results([_result(third.id, [1]), _result(third.id, [2, 2])])
    assert store.samples(first.id) == [5, 3, 4]
    assert store.samples(third.id) == [1]
    rows = {t.id: t for t in store.trials(job)}
    assert rows[first.id].median_ns == 4 and rows[first.id].error is None
    assert rows[first.id].environment_id == rows[second.id].environment_id is not None
    assert len(store.environments(job)) == 1
    assert [t.id for t in store.unfinished_trials(job)] == [t.id for t in trials[3:]]
    store.mark_attempt(trials[3].id, 1, "worker died")
    t3 = next(t for t in store.trials(job) if t.id == trials[3].id)
    assert (t3.status, t3.attempt, t3.error) == ("pending", 1, "worker died")
    assert store.status_counts(job) == {"ok": 3, "pending": 3}
    # a second store on the same file (another process would do the same) sees it all
    assert Store(str(tmp_path / "f.db")).status_counts(job) == {"ok": 3, "pending": 3}


def test_html_report_plots_a_recorded_time_series(tmp_path):
    store = Store(str(tmp_path / "f.db"))
    job = _job(store)
    trial = store.trials(job)[0]
    series = {
        "title": "cache over the trace",
        "xlabel": "event",
        "x": [0, 1, 2],
        "series": {"hit rate": [0.0, 0.5, 0.7], "evictions": [0, 0, 3]},
    }
    store.record_results([_result(trial.id, [10, 11, 12], metrics={"timeseries": series})])
    page = report.render_html(store, job)
    assert "cache over the trace (noop n=0)" in page
    # interactive plots (Plotly): the time per shape, the trial's samples, and the series
    assert all(f'id="{d}"' in page for d in ("plot-time", "plot-samples", "plot-series-0"))
    assert page.count("Plotly.newPlot(") == 3


def test_family_report_columns_and_scaling_plot(tmp_path):
    from rich.console import Console

    from jobs.spec.sweep import load_spec

    store = Store(str(tmp_path / "f.db"))
    spec = load_spec("jobs/specs/attention_cpu.yaml")
    job = store.create_job(
        name=spec.name,
        family=spec.family,
        spec_yaml="",
        spec_hash=spec.spec_hash(),
        trials=spec.trials(),
        git_commit=None,
    )
    decode = [t for t in store.trials(job) if t.shape["mode"] == "decode"]
    store.record_results(
        [
            _result(
                t.id, [1000 * t.shape["batch"]], metrics={"latency_per_token_us": 10.0 / t.shape["batch"]}
            )
            for t in decode
        ]
    )
    console = Console(record=True, width=250)
    report.render_terminal(store, job, console)
    text = console.export_text()
    assert "us/token" in text and "2.50" in text  # 10 / batch 4
    page = report.render_html(store, job)
    assert "latency_per_token_us against batch" in page


def test_kept_samples_leave_out_what_the_measurement_discarded(tmp_path):
    store = Store(str(tmp_path / "f.db"))
    trial = store.trials(_job(store))[0]
    samples = [10, 11, 900, 12]
    throttled = dataclasses.replace(Summary.from_samples(samples), discarded=(2,))  # taken while throttled
    row = _result(trial.id, samples, summary=throttled)
    store.record_results([row])
    assert store.samples(trial.id) == [10, 11, 900, 12]  # every raw sample is kept in the store
    assert store.kept_samples(trial.id) == [10, 11, 12]


def test_results_are_typed_from_the_worker_to_the_row(tmp_path):
    """Issue 30: record_results took list[dict], so a result lost its type after the worker. It takes
    TrialResults (a TrialOutcome and where it ran) and refuses anything else, naming it."""
    import pytest

    store = Store(str(tmp_path / "f.db"))
    trial = store.trials(_job(store))[0]
    with pytest.raises(TypeError, match="TrialResult items \\(got dict\\)"):
        store.record_results([{"trial_id": trial.id, "status": "ok", "samples_ns": [1]}])
    with pytest.raises(TypeError, match="outcome must be a TrialOutcome"):
        TrialResult(trial.id, {"status": "ok"})  # type: ignore[arg-type]
    store.record_results([_result(trial.id, [3, 1, 2])])
    (row,) = [t for t in store.trials(trial.job_id) if t.id == trial.id]
    assert row.stats.median == row.median_ns == 2 and row.stats.n == row.stats.n_kept == 3


def test_kept_reads_the_summary_only_when_it_discarded_samples():
    """trial_store.kept: every sample for a summary that discarded none (none stored, an empty or missing
    list: no Summary read back), all but the discarded ones otherwise; what a malformed summary keeps is
    what Summary.from_stored reads of it."""
    from jobs.store.trial_store import kept

    samples = [10, 11, 12, 13]
    for summary in (None, {}, {"n": 4}, {"discarded": []}, {"discarded": None}, "not a mapping"):
        assert kept(samples, summary) == samples, summary  # type: ignore[arg-type]
    assert kept(samples, {"discarded": [1, 3]}) == [10, 12]
    assert kept(samples, {"discarded": [0, "x", True, 9]}) == [12, 13]  # True is an int: index 1
    assert kept(samples, Summary.from_samples([1, 2, 3]).to_dict()) == samples
