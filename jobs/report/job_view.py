"""A job's report, prepared for its template (templates/job.html.j2): the view of the job with its verdict,
its speedups over the baseline backend and over the stored baseline, the geometric-mean speedup and fast_p
(KernelBench: the fraction of shapes faster than the baseline by more than p), the figures, the pruned
configs with their reason, each point's recent history, the anomalies and the trials.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import plotly.graph_objects as go

from jobs.report import figures
from jobs.report.plotting import PlainFigure, figure_view
from jobs.report.recent import recent_history
from jobs.report.rows import JobReads, Row, Speedup, baseline_for, family_view, label, num, speedup_cis
from jobs.report.verdict import VerdictView, verdict_view
from jobs.report.views import FigureView, Table
from jobs.store import Store
from kernels.base import NOT_FAILED, TrialStatus

FAST_P = (0.0, 0.1, 0.5)  # the fast_p thresholds shown


@dataclass
class Environment:
    host: str
    device_name: str
    device_kind: str


@dataclass
class JobView:
    """What the job's page shows, in its order."""

    id: int
    name: str
    family: str
    status: str
    commit: str
    timing: str  # GPU timings, or CPU timings (not GPU numbers)
    envs: list[Environment]
    verdict: VerdictView
    speedups: Table | None = None
    figures: list[FigureView] = field(default_factory=list)
    pruned: Table | None = None
    history: Table | None = None
    anomalies: Table | None = None
    trials: Table | None = None


def _speedups(reads: JobReads, pairs: list[tuple[str, str, int, int]]) -> list[Speedup]:
    """(shape, label, baseline trial id, trial id) -> the speedups with their intervals."""
    samples = reads.kept(i for _s, _l, a, b in pairs for i in (a, b))
    found = speedup_cis(reads.store, [(a, b) for _s, _l, a, b in pairs], samples)
    return [
        Speedup(shape, name, *ratio)
        for (shape, name, _a, _b), ratio in zip(pairs, found, strict=True)
        if ratio
    ]


def speedups(reads: JobReads, rows: list[Row]) -> list[Speedup]:
    """Each timed non-baseline trial against the baseline on its shape (same config when the baseline
    has it), with a 95% bootstrap interval over both trials' kept samples."""
    ids = reads.ids()
    base: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        if r.baseline and r.status == TrialStatus.OK and r.median_ms:
            base.setdefault((r.shape, r.dtype), {})[r.config] = r.trial
    pairs = []
    for r in rows:
        if r.baseline or r.status != TrialStatus.OK or not r.median_ms:
            continue
        ref = baseline_for(base.get((r.shape, r.dtype), {}), r.config)
        if ref is not None:
            pairs.append((r.shape, label(r), ids[ref], ids[r.trial]))
    return _speedups(reads, pairs)


def stored_baseline(reads: JobReads) -> tuple[str, int, dict[int, int]] | None:
    """The stored baseline (`farm baseline set`) the job is judged against: the one `farm accept` used
    when its failures name a baseline job, else the newest one matching the job's points as the baselines
    stood when the job ended (all of them now while it runs; a move since changes no report). Returns
    (name, its job, trial id of the job -> the matching baseline trial id), or None."""
    from jobs.judge.baselines import point_key

    store, job = reads.store, reads.job
    used = {(f.evidence or {}).get("baseline_job") for f in reads.failures} - {None}
    named = (
        [b for b, _ in store.list_baselines() if b.job_id in used and b.family == job.family] if used else []
    )
    # the named baseline's matches, else the newest baseline that matches (as Store.judging finds it)
    found, matched = store.baseline_matches(
        job,
        reads.trials,
        reads.environments,
        key=point_key,
        baseline=named[0].name if named else None,
        as_of=job.finished_at,  # where the baselines stood when it ended: a page that stays as it is
    )
    return (found.name, found.job_id, matched) if found is not None and matched else None


def baseline_job_speedups(reads: JobReads, rows: list[Row]) -> tuple[str, list[Speedup]]:
    """Each timed trial against its point in the stored baseline's job: how a regression `farm accept`
    caught shows (below 1). Returns (the baseline's description, the speedups); none without a baseline."""
    found = stored_baseline(reads)
    if found is None:
        return "", []
    name, base_job, matched = found
    ids = reads.ids()
    pairs = [
        (r.shape, f"#{r.trial} {label(r)}", matched[ids[r.trial]], ids[r.trial])
        for r in rows
        if r.status == TrialStatus.OK and r.median_ms and ids[r.trial] in matched
    ]
    return f"baseline {name} (job {base_job})", _speedups(reads, pairs)


def speedup_summary(items: list[Speedup]) -> Table | None:
    """Per backend/config: shapes, geometric-mean speedup, and fast_p for each p in FAST_P."""
    if not items:
        return None
    out = []
    for name in dict.fromkeys(s.label for s in items):
        mine = [s.speedup for s in items if s.label == name]
        geo = math.exp(sum(math.log(v) for v in mine) / len(mine))
        fast = [sum(v > 1 + p for v in mine) / len(mine) for p in FAST_P]
        out.append([name, len(mine), f"{geo:.3f}x", *(f"{f:.0%}" for f in fast)])
    head = ["backend / config", "shapes", "geomean speedup"] + [f"fast_{p:g}" for p in FAST_P]
    return Table(head, out)


def anomalies_table(reads: JobReads) -> Table | None:
    found = reads.anomalies
    if not found:
        return None
    return Table(["severity", "kind", "message"], [[a.severity, a.kind, a.message] for a in found], left=3)


def pruned_table(rows: list[Row]) -> Table | None:
    pruned = [r for r in rows if r.status == TrialStatus.PRUNED]
    if not pruned:
        return None
    body = [[r.shape, r.backend, r.config, r.error or "-"] for r in pruned]
    return Table(["shape", "backend", "config", "reason"], body, left=4)


def trials_table(rows: list[Row]) -> Table:
    head = ["trial", "shape", "backend", "config", "dtype", "status", "median ms", "spread %", "n", "stop"]
    head += ["speedup", "TFLOPS", "GB/s", "correct", "node"]
    body = [
        [
            r.trial,
            r.shape,
            r.backend + (" (baseline)" if r.baseline else ""),
            r.config,
            r.dtype,
            r.status,
            num(r.median_ms, ".4f"),
            num(r.spread_pct, ".1f"),
            num(r.n, "d"),
            (r.stop_reason or "-") + (f" ({r.flags})" if r.flags else ""),
            num(r.speedup, ".3f"),
            num(r.tflops, ".3f"),
            num(r.gbps, ".2f"),
            {True: "pass", False: "FAIL", None: "-"}[r.correct],
            r.node or "-",
        ]
        for r in rows
    ]
    classes = ["" if r.status in NOT_FAILED else "bad" for r in rows]
    return Table(head, body, classes, left=6)


def job_figures(
    reads: JobReads, family: str, rows: list[Row], items: list[Speedup], device: str | None
) -> list[FigureView]:
    """The job's figures in their order, each placed (those without data left out)."""
    trials = reads.trials
    figs: list[tuple[str, go.Figure | PlainFigure | None, int | None]] = [
        ("time", figures.time_per_shape(rows), None)
    ]
    figs += [(f"heatmap-{b}", f, 150 + 45 * len(f.data[0].y)) for b, f in figures.heatmaps(rows)]
    figs.append(("speedup", figures.speedup_figure(items, "the baseline backend"), None))
    against, stored = baseline_job_speedups(reads, rows)
    figs.append(("speedup-stored-baseline", figures.speedup_figure(stored, against), None))
    figs.append(("samples", figures.samples_figure(rows, reads.ids(), reads.samples), 520))
    figs.append(("roofline", figures.roofline_figure(rows, device), 520))
    figs += [(f"series-{i}", f, None) for i, f in enumerate(figures.timeseries_figures(trials))]
    scaling = family_view(family)[1]
    figs += [(f"scaling-{i}", f, None) for i, f in enumerate(figures.scaling_figures(trials, scaling))]
    return [figure_view(fig, f"plot-{name}", height) for name, fig, height in figs if fig is not None]


def job_view(store: Store, job_id: int, reads: JobReads | None = None) -> JobView:
    """The job's page; `reads`: what was read of it already (the terminal table's)."""
    reads = reads or JobReads(store, job_id)
    job = reads.job
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    reads.timed()  # the job's timed trials' samples in one read: the speedups' and the samples figure's
    rows = reads.rows
    envs = reads.environments
    device = next((e.device_name for e in envs if e.device_kind == "gpu"), None)
    items = speedups(reads, rows)
    return JobView(
        id=job.id,
        name=job.name,
        family=job.family,
        status=job.status,
        commit=job.git_commit or "unknown commit",
        timing="GPU timings" if device else "CPU timings (not GPU numbers)",
        envs=[Environment(e.host, e.device_name, e.device_kind) for e in envs],
        verdict=verdict_view(store, job_id, reads),
        speedups=speedup_summary(items),
        figures=job_figures(reads, job.family, rows, items, device),
        pruned=pruned_table(rows),
        history=recent_history(store, job_id, job.family, reads=reads.recent),
        anomalies=anomalies_table(reads),
        trials=trials_table(rows),
    )
