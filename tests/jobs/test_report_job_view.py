"""A job's report prepared for its template (jobs.report.job_view), from the rows every report shares
(jobs.report.rows), the figures (jobs.report.figures) and the verdict (jobs.report.verdict): what the page
will show, checked before any HTML is written."""

from __future__ import annotations

import math

import pytest
from test_report_html import make_job

from jobs.report.ab import Selector, compare_jobs
from jobs.report.figures import compare_ratio_figure, compare_shape, compare_time_figure
from jobs.report.job_view import job_view
from jobs.report.rows import build_rows, fmt_point, num, sig
from jobs.report.verdict import VerdictView, verdict_view


def test_rows_set_each_trial_against_the_baseline_on_its_shape(store):
    job = make_job(store, failures=False)
    rows = {(r.backend, r.config, r.shape): r for r in build_rows(store, job)}
    assert rows[("spin", "ms=1", "n=0")].speedup == pytest.approx(2.0)
    assert rows[("spin", "ms=1", "n=1")].speedup == pytest.approx(0.5)
    pruned = rows[("spin", "ms=5", "n=0")]
    assert pruned.status == "pruned" and pruned.speedup is None and pruned.median_ms is None
    assert rows[("noop", "-", "n=0")].baseline and rows[("noop", "-", "n=0")].speedup == pytest.approx(1.0)


def test_the_shared_formatting():
    assert fmt_point({}) == "-" and fmt_point({"n": 1, "ms": 2}) == "n=1 ms=2"
    assert num(None, ".2f") == num(math.inf, ".2f") == num(math.nan, ".2f") == "-"
    assert num(1500.0, ".2f", 1e-3) == "1.50" and num(7, "d") == "7"
    assert sig(0.000123) == "0.000123" and sig(2000.0) == "2000"


def test_job_view_holds_the_page_in_its_order(store):
    job = make_job(store, failures=False)
    view = job_view(store, job)
    assert (view.name, view.family, view.commit) == ("report-test", "probe", "c0ffee")
    assert view.timing == "CPU timings (not GPU numbers)" and [e.device_name for e in view.envs] == [
        "Some CPU"
    ]
    assert view.verdict == VerdictView() == verdict_view(store, job)  # nothing stored: not judged yet
    assert [f.div_id for f in view.figures] == [
        "plot-time",
        "plot-heatmap-spin",
        "plot-speedup",
        "plot-samples",
    ]
    assert view.figures[0].title.startswith("Time per shape")
    assert [r[0] for r in view.speedups.rows] == ["spin ms=1", "spin ms=2"]
    assert view.speedups.rows[0][2] == "1.000x"  # 2x and 0.5x: geomean 1
    assert [r[:3] for r in view.pruned.rows] == [["n=0", "spin", "ms=5"], ["n=1", "spin", "ms=5"]]
    assert view.history is None and view.anomalies is None
    assert len(view.trials.rows) == 8 and view.trials.classes.count("bad") == 0


def test_the_ab_figures_of_two_jobs(store):
    a = make_job(store, failures=False)
    b = make_job(store, scale=1.5, failures=False)
    result = compare_jobs(store, a, b, Selector.parse("ms=1"), Selector.parse("ms=1"))
    assert [compare_shape(r) for r in result.rows] == ["n=0 float32", "n=1 float32"]
    time = compare_time_figure(result)
    assert [t.name for t in time.data] == [f"A: job {a} ms=1", f"B: job {b} ms=1"]
    (ratio,) = compare_ratio_figure(result).data
    assert list(ratio.y) == pytest.approx([1.5, 1.5], rel=0.05)
