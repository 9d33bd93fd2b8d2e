"""`farm site -o DIR`: a static site of the store that a team can publish from CI, as asv's.

index.html            families and kernels (one row per point: family, backend, shape, config, dtype,
                      environment) with a sparkline of its history and its change points
kernels/<point>.html  one point's history across jobs, with the change points, the environment changes
                      (a performance component: torch, driver, ...) and a table of the jobs
jobs/<id>.html        one job's report (jobs.report.html)
account.html          the token account of the drafts and its four questions (jobs.report.account_page)
plotly.min.js         plotly.js, once for the whole site: every page opens offline

Every page is rendered from its template (jobs/report/templates/); this module prepares their data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from jobs.drafts.account import Account, build_account
from jobs.history.series import Series, collect
from jobs.judge.environment import changed_text
from jobs.report.account_page import render_account
from jobs.report.figures import history_figure
from jobs.report.html import render_job
from jobs.report.plotting import figure_view
from jobs.report.templating import plotly_js, render_page
from jobs.report.views import NAV_INDEX, Link, Table, spark
from jobs.store import Store


@dataclass
class SiteResult:
    pages: int
    kernels: int
    jobs: int


@dataclass
class ChangeLine:
    """A change point as the kernel page lists it."""

    job_id: int
    commit: str
    before: str  # ms
    after: str
    magnitude: str  # +20.0%
    environment: str = ""  # what changed in the environment at the same job (performance components)


@dataclass
class SiteJob:
    """A job in the index's list."""

    id: int
    name: str
    commit: str


def _kernel_page(series: Series) -> str:
    """One point's history: its change points, the figure and the table of its jobs (each linked)."""
    changes = {c.job_id: c for c in series.changes}
    marks = {m.job_id: m.text for m in series.marks}
    rows = []
    for p in series.points:
        c = changes.get(p.job_id)
        rows.append(
            [
                Link(f"../jobs/{p.job_id}.html", str(p.job_id)),
                p.commit or "-",
                p.created_at.strftime("%Y-%m-%d %H:%M"),
                f"{p.median_ns / 1e6:.4f}",
                f"{p.spread_pct:.1f}%" if p.spread_pct is not None else "-",
                f"{c.magnitude:+.1%}" if c else "",
                marks.get(p.job_id, ""),
            ]
        )
    return render_page(
        "kernel.html.j2",
        series.key.label,
        "../plotly.min.js",
        nav=NAV_INDEX,
        series=series,
        changes=[
            ChangeLine(
                c.job_id,
                c.commit or "unknown",
                f"{c.before_ns / 1e6:.4f}",
                f"{c.after_ns / 1e6:.4f}",
                f"{c.magnitude:+.1%}",
                changed_text(c.environment),
            )
            for c in series.changes
        ],  # fmt: skip
        marks=series.marks,
        figure=figure_view(history_figure(series), "plot-history", 460),
        listing=Table(
            ["job", "commit", "created", "median ms", "spread", "change", "environment"], rows, left=3
        ),
    )


def _family_table(all_series: list[Series], family: str) -> Table:
    """The index's table of a family: a row per point, linked to its page, with its sparkline."""
    rows = []
    for s in (s for s in all_series if s.key.family == family):
        change = s.changes[-1] if s.changes else None
        rows.append(
            [
                Link(f"kernels/{s.key.slug}.html", s.key.label),
                s.key.env,
                len(s.points),
                f"{s.points[-1].median_ns / 1e6:.4f}",
                f"job {change.job_id}: {change.magnitude:+.1%}" if change else "-",
                spark([p.median_ns for p in s.points], marks=tuple(c.index for c in s.changes)),
            ]
        )
    head = ["kernel", "environment", "jobs", "last median ms", "last change", "history"]
    return Table(head, rows, left=2)


def _index(all_series: list[Series], jobs: list[SiteJob], account: Account) -> str:
    families = sorted({s.key.family for s in all_series})
    total = account.totals()
    return render_page(
        "index.html.j2",
        "KernelFarm",
        "plotly.min.js",
        total=total,
        tokens=f"{total.total_tokens:,}",
        families=[(family, _family_table(all_series, family)) for family in families],
        jobs=jobs,
    )


def build_site(store: Store, out: Path, account: Account | None = None) -> SiteResult:
    """The site of ``store`` in ``out``. ``account``: the token account to show (`farm site` reads the
    gateway's ledger for it); None: the farm's own, without asking any gateway."""
    out = Path(out)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    (out / "jobs").mkdir(parents=True, exist_ok=True)
    (out / "plotly.min.js").write_text(plotly_js())
    all_series = collect(store)
    for s in all_series:
        (out / "kernels" / f"{s.key.slug}.html").write_text(_kernel_page(s))
    jobs = sorted(store.list_jobs(limit=1_000_000), key=lambda jc: jc[0].id)
    for job, _counts in jobs:
        (out / "jobs" / f"{job.id}.html").write_text(render_job(store, job.id, "../plotly.min.js", NAV_INDEX))
    if account is None:
        account = build_account(store, use_env=False)
    (out / "account.html").write_text(render_account(account, (Link("index.html", "index"),)))
    listed = [SiteJob(j.id, j.name, (j.git_commit or "unknown commit")[:12]) for j, _ in jobs]
    (out / "index.html").write_text(_index(all_series, listed, account))
    return SiteResult(pages=2 + len(all_series) + len(jobs), kernels=len(all_series), jobs=len(jobs))
