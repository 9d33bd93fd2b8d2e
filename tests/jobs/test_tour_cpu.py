"""The README's tour on a CPU: an ambiguous assertion on CPU timings warns by default (a card can
say fail), and `farm sweep resume` of a finished job is a no-op that says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.judge.acceptance import accept
from jobs.run.runner import create_job
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of

CARD = """
name: probe-strict
family: probe
assertions: [completes, stability]
stability: {max_cv: 0.05}
cpu: {max_cv: 0.25, ambiguous: fail}
"""


def _job_with_scattered_samples(store: Store, card: str) -> int:
    """A probe job whose one trial is ok with samples far too scattered to call (cv ~ 0.5): stability
    is ambiguous. No environment is recorded: the trial counts as timed on a CPU."""
    spec = loads_spec(f"""
name: probe-ambiguous
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: [0]}}}}
card: {card}
""")
    job_id = create_job(store, spec)
    [trial] = store.trials(job_id)
    samples = [1_000_000, 3_000_000] * 10
    store.record_results([result_of(trial.id, samples)])
    store.set_job_status(job_id, "completed")
    return job_id


def test_ambiguous_on_cpu_timings_warns_by_default(store):
    job_id = _job_with_scattered_samples(store, "probe")
    acc = accept(store, job_id, ambiguous=None)
    assert any(r.outcome == "ambiguous" for r in acc.results)
    assert acc.ambiguous == "warn" and acc.verdict == "warn" and acc.exit_code == 0
    # said explicitly, the command wins
    assert accept(store, job_id, ambiguous="fail").exit_code == 1


def test_a_card_can_make_ambiguous_fail_on_cpu(store, tmp_path):
    card = tmp_path / "strict.yaml"
    card.write_text(CARD)
    job_id = _job_with_scattered_samples(store, str(card))
    acc = accept(store, job_id, ambiguous=None)
    assert acc.ambiguous == "fail" and acc.verdict == "fail" and acc.exit_code == 1


@pytest.mark.slow  # a farm process
def test_resume_of_a_finished_job_is_a_no_op_that_says_so(store, tmp_path):
    job_id = _job_with_scattered_samples(store, "probe")
    before = store.get_job(job_id)
    counts = store.status_counts(job_id)
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "sweep", "resume", str(job_id), "--db", str(Path(store.url))],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert f"nothing to resume: job {job_id} already finished (completed" in proc.stderr
    after = store.get_job(job_id)
    assert (after.status, after.finished_at, after.message) == (
        before.status,
        before.finished_at,
        before.message,
    )
    assert store.status_counts(job_id) == counts
    assert store.anomalies(job_id) == []  # not judged again
    assert "ray:" not in proc.stderr  # no cluster was started for nothing


def test_farm_accept_follows_the_same_cpu_rule(store, tmp_path):
    """`farm accept` without --ambiguous: warn on CPU timings (exit 0), unless the card says fail."""
    from click.testing import CliRunner

    from jobs.cli import main

    db = str(Path(store.url))
    job_id = _job_with_scattered_samples(store, "probe")
    out = CliRunner().invoke(main, ["accept", str(job_id), "--db", db])
    assert out.exit_code == 0 and "ambiguous -> warn" in out.output, out.output
    out = CliRunner().invoke(main, ["accept", str(job_id), "--ambiguous", "fail", "--db", db])
    assert out.exit_code == 1, out.output
    card = tmp_path / "strict.yaml"
    card.write_text(CARD)
    strict = _job_with_scattered_samples(store, str(card))
    out = CliRunner().invoke(main, ["accept", str(strict), "--db", db])
    assert out.exit_code == 1 and "ambiguous -> fail" in out.output, out.output


def test_accept_lists_only_what_did_not_pass_unless_verbose(store):
    from click.testing import CliRunner

    from jobs.cli import main

    db = str(Path(store.url))
    job_id = _job_with_scattered_samples(store, "probe")
    out = CliRunner().invoke(main, ["accept", str(job_id), "--db", db])
    assert "stability" in out.output and "finished (ok)" not in out.output, out.output
    assert "2 assertions passed or skipped (--verbose lists every assertion)" in out.output
    out = CliRunner().invoke(main, ["accept", str(job_id), "--verbose", "--db", db])
    assert "finished (ok)" in out.output and "passed or skipped" not in out.output, out.output
