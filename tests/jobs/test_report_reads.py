"""What a job's page reads (jobs.report.rows.JobReads): the job's trials once, the kept samples in one
read for the job and one for the stored baseline's matched trials, the baseline found in one read of its
matches (Store.baseline_matches, on the trials read already), whatever the number of trials (issue 46: a
job of 500 trials read its trials 6 times and its samples 3); `farm report JOB --html` prints the table and
writes the page from one read, the same table and page as each made on its own."""

from __future__ import annotations

import io
from collections import Counter

from click.testing import CliRunner
from rich.console import Console
from test_report_html import make_job

from jobs.cli import main
from jobs.report.job_view import job_view
from jobs.report.render import render_html, render_terminal
from jobs.report.rows import JobReads
from jobs.store import Store


def _counted(store: Store, monkeypatch, names: tuple[str, ...]) -> Counter:
    calls: Counter = Counter()
    for name in names:
        method = getattr(store, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(store, name, counted)
    return calls


def test_a_job_page_reads_its_trials_once_and_its_samples_twice(store, monkeypatch):
    base = make_job(store, failures=False)
    out = CliRunner().invoke(main, ["baseline", "set", str(base), "--name", "main", "--db", store.url])
    assert out.exit_code == 0, out.output
    job = make_job(store, scale=1.5, failures=False)
    names = ("trials", "kept_samples_of", "kept_samples", "samples", "judging", "baseline_matches")
    calls = _counted(store, monkeypatch, (*names, "anomalies", "failures"))
    view = job_view(store, job)
    assert calls == Counter(trials=1, kept_samples_of=2, baseline_matches=1, anomalies=1, failures=1), calls
    ids = [f.div_id for f in view.figures]
    assert "plot-speedup-stored-baseline" in ids and "plot-samples" in ids


def test_farm_report_html_reads_the_trials_once_for_the_same_table_and_page(store, monkeypatch, tmp_path):
    base = make_job(store, failures=False)
    out = CliRunner().invoke(main, ["baseline", "set", str(base), "--name", "main", "--db", store.url])
    assert out.exit_code == 0, out.output
    job = make_job(store, scale=1.5)  # failures and anomalies: the verdict's table names their trials
    # each on its own, as before: the table's read, then the page's
    console = Console(file=io.StringIO(), width=200, color_system=None)
    render_terminal(store, job, console)
    alone = render_html(store, job)
    table = console.file.getvalue()
    # one read for both: the same table, the same page (the rows are not changed by either)
    reads = JobReads(store, job)
    console = Console(file=io.StringIO(), width=200, color_system=None)
    calls = _counted(store, monkeypatch, ("trials", "get_job", "environments", "failures"))
    render_terminal(store, job, console, reads)
    assert render_html(store, job, reads) == alone
    assert console.file.getvalue() == table
    assert calls == Counter(trials=1, get_job=1, environments=1, failures=1), calls
    # through the command: the page it writes is the same page
    page = tmp_path / "job.html"
    out = CliRunner().invoke(main, ["report", str(job), "--html", str(page), "--db", store.url])
    assert out.exit_code == 0, out.output
    assert page.read_text() == alone


def test_the_speedups_taken_together_are_each_ones_interval(store):
    """speedup_cis (a page's intervals in one numpy call a size pair) gives, for every pair, the values
    bootstrap_ratio_ci gives that pair alone: sides of different sizes, shared trials, an empty side."""
    import numpy as np

    from jobs.report.rows import speedup_cis
    from kernels.measure.stats import bootstrap_ratio_ci

    rng = np.random.default_rng(7)
    kept = {i: [int(v) for v in rng.lognormal(13, 0.1, size)] for i, size in enumerate([100, 97, 100, 3, 64])}
    kept[5] = []
    pairs = [(0, 1), (0, 2), (1, 2), (2, 0), (3, 4), (4, 3), (0, 5), (5, 1), (0, 0), (2, 1)]
    got = speedup_cis(store, pairs, kept)
    for (a, b), found in zip(pairs, got, strict=True):
        if not kept[a] or not kept[b]:
            assert found is None
            continue
        base, cand = np.asarray(kept[a], dtype=float), np.asarray(kept[b], dtype=float)
        lo, hi = bootstrap_ratio_ci(base, cand, n_boot=400, confidence=0.95, seed=0)
        assert found == (float(np.median(base) / np.median(cand)), 1 / hi, 1 / lo), (a, b)
