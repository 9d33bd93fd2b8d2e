"""The acceptance verdict on a job's report: what `farm accept` stored for the job, in its words.

FAIL (an assertion failed, or was ambiguous under `--ambiguous fail`), WARN (only ambiguous ones, accepted
as a warning) or PASS, with each assertion that did not pass. A pass with nothing to note stores nothing:
then the box says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.report.rows import JobReads
from jobs.report.templating import render
from jobs.report.views import Table
from jobs.store import Store

# An assertion `farm accept` left undecided stores an anomaly of its own (jobs.judge.checks): `ambiguous`
# for a regression noise left open, `noisy` with the card's max_cv in its evidence for a stability check
# over its limit. Under `--ambiguous warn` (the default on CPU timings) they are not in the failure bank:
# these anomalies are how the page knows the verdict was a warning.
UNDECIDED = {"ambiguous": "regression", "noisy": "stability"}


@dataclass
class Judged:
    """One assertion `farm accept` did not pass, as the report shows it."""

    outcome: str  # fail | ambiguous
    assertion: str
    label: str
    message: str


@dataclass
class VerdictView:
    """The verdict box: its class (fail, ambiguous, pass or none), its words after "Acceptance: " (None:
    nothing stored) and the table of the assertions that did not pass."""

    cls: str = ""
    text: str | None = None
    table: Table | None = None


def _undecided(anomaly: Any) -> str | None:
    """The assertion an anomaly records as undecided; None for other kinds and for a contended trial's
    `noisy`, which is no assertion."""
    check = UNDECIDED.get(anomaly.kind)
    if check == "stability" and "max_cv" not in (anomaly.evidence or {}):
        return None
    return check


def _judged(failures: list[Any], anomalies: list[Any], reads: JobReads) -> list[Judged]:
    """The failure bank's entries of the job, then the undecided assertions not in it."""
    from jobs.judge.acceptance import trial_label

    banked = {(f.trial_id, f.assertion) for f in failures}
    judged = [Judged(f.outcome, f.assertion, f.label, f.message) for f in failures]
    by_id = {t.id: t for t in reads.trials} if anomalies else {}
    for a in anomalies:
        check = _undecided(a)
        if check is None or (a.trial_id, check) in banked:
            continue
        t = by_id.get(a.trial_id)
        judged.append(Judged("ambiguous", check, trial_label(t) if t else "-", a.message))
    return judged


def verdict_view(store: Store, job_id: int, reads: JobReads | None = None) -> VerdictView:
    """The verdict box of the job (`reads`: what was read of it already, its page's)."""
    reads = reads or JobReads(store, job_id)
    failures, anomalies = reads.failures, reads.anomalies
    judged = _judged(failures, anomalies, reads)
    n_fail = sum(j.outcome == "fail" for j in judged)
    counts = f"{n_fail} failed, {len(judged) - n_fail} ambiguous"
    if failures:  # a failure bank entry: the verdict was fail (ambiguous ones too under --ambiguous fail)
        verdict, cls = "FAIL", "fail"
        counts += "" if n_fail else ", counted as failed (--ambiguous fail)"
        counts += f"; card {failures[0].card}"
    elif judged:
        verdict, cls = "WARN", "ambiguous"
        counts += ", accepted as a warning (--ambiguous warn)"
    elif anomalies:
        return VerdictView(
            "pass", f"PASS (no failed or ambiguous assertion; {len(anomalies)} anomalies below)"
        )
    else:
        return VerdictView()
    judged.sort(key=lambda j: j.outcome != "fail")
    table = Table(
        ["outcome", "assertion", "point", "message"],
        [[j.outcome.upper(), j.assertion, j.label, j.message] for j in judged],
        ["bad" if j.outcome == "fail" else "" for j in judged],
        left=4,
    )
    return VerdictView(cls, f"{verdict} ({counts})", table)


def verdict_html(store: Store, job_id: int) -> str:
    """The verdict box alone (the job's report places it under the job's header)."""
    return render("verdict.html.j2", verdict=verdict_view(store, job_id))
