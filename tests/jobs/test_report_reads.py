"""What a job's page reads (jobs.report.job_view.JobReads): the job's trials once, the kept samples in one
read for the job and one for the stored baseline's matched trials, the baseline found in one judging read,
whatever the number of trials (issue 46: a job of 500 trials read its trials 6 times and its samples 3)."""

from __future__ import annotations

from collections import Counter

from click.testing import CliRunner
from test_report_html import make_job

from jobs.cli import main
from jobs.report.job_view import job_view
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
    calls = _counted(store, monkeypatch, ("trials", "kept_samples_of", "kept_samples", "samples", "judging"))
    view = job_view(store, job)
    assert calls == Counter(trials=1, kept_samples_of=2, judging=1), calls
    ids = [f.div_id for f in view.figures]
    assert "plot-speedup-stored-baseline" in ids and "plot-samples" in ids
