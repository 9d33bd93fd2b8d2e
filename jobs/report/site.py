"""`farm site -o DIR`: a static site of the store that a team can publish from CI, as asv's.

index.html            families and kernels (one row per point: family, backend, shape, config, dtype,
                      environment) with a sparkline of its history and its change points
kernels/<point>.html  one point's history across jobs, with the change points and a table of the jobs
jobs/<id>.html        one job's report (jobs.report.html)
account.html          the token account of the drafts and its four questions (jobs.report.account_page)
plotly.min.js         plotly.js, once for the whole site: every page opens offline
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from jobs.drafts.account import Account, build_account
from jobs.history.series import Series, collect
from jobs.report.account_page import render_account
from jobs.report.html import figure, history_figure, page, plotly_js, render_job, sparkline, table
from jobs.store import Store

esc = html.escape


@dataclass
class SiteResult:
    pages: int
    kernels: int
    jobs: int


def _kernel_page(series: Series) -> str:
    changes = {c.job_id: c for c in series.changes}
    rows = []
    for p in series.points:
        c = changes.get(p.job_id)
        rows.append(
            [
                f"@@{p.job_id}@@",
                p.commit or "-",
                p.created_at.strftime("%Y-%m-%d %H:%M"),
                f"{p.median_ns / 1e6:.4f}",
                f"{p.spread_pct:.1f}%" if p.spread_pct is not None else "-",
                f"{c.magnitude:+.1%}" if c else "",
            ]
        )
    listing = table(["job", "commit", "created", "median ms", "spread", "change"], rows, left=3)
    for p in series.points:  # the job column links to the job's page
        listing = listing.replace(f"@@{p.job_id}@@", f'<a href="../jobs/{p.job_id}.html">{p.job_id}</a>', 1)
    if series.changes:
        found = "".join(
            f"<li>job {c.job_id} (commit {esc(c.commit or 'unknown')}): {c.before_ns / 1e6:.4f} -> "
            f"{c.after_ns / 1e6:.4f} ms, <b>{c.magnitude:+.1%}</b></li>"
            for c in series.changes
        )
        found = f"<h2>Change points (E-divisive means)</h2><ul>{found}</ul>"
    else:
        found = "<p>No change point (E-divisive means).</p>"
    body = (
        '<nav><a href="../index.html">index</a></nav>'
        f"<h1>{esc(series.key.label)}</h1><p>on {esc(series.key.env)}</p>"
        + found
        + figure(history_figure(series), "plot-history", 460)
        + listing
    )
    return page(series.key.label, body, "../plotly.min.js")


def _index(all_series: list[Series], job_ids: list[tuple[int, str, str | None]], account: Account) -> str:
    parts = ["<h1>KernelFarm</h1>"]
    total = account.totals()
    parts.append(
        '<p><a href="account.html">Token account of the drafts</a>: '
        f"{total.runs} draft runs, {total.calls} model calls, {total.total_tokens:,} tokens; "
        f"{esc(total.conclusion)}</p>"
    )
    for family in sorted({s.key.family for s in all_series}):
        rows, marks = [], []
        for s in (s for s in all_series if s.key.family == family):
            last = s.points[-1]
            change = s.changes[-1] if s.changes else None
            rows.append(
                [
                    f"@@k{len(marks)}@@",
                    s.key.env,
                    len(s.points),
                    f"{last.median_ns / 1e6:.4f}",
                    f"job {change.job_id}: {change.magnitude:+.1%}" if change else "-",
                    f"@@s{len(marks)}@@",
                ]
            )
            marks.append(s)
        listing = table(
            ["kernel", "environment", "jobs", "last median ms", "last change", "history"], rows, left=2
        )
        for i, s in enumerate(marks):
            link = f'<a href="kernels/{esc(s.key.slug)}.html">{esc(s.key.label)}</a>'
            spark = sparkline([p.median_ns for p in s.points], marks=tuple(c.index for c in s.changes))
            listing = listing.replace(f"@@k{i}@@", link, 1).replace(f"@@s{i}@@", spark, 1)
        parts.append(f"<h2>{esc(family)}</h2>{listing}")
    jobs = "".join(
        f'<li><a href="jobs/{j}.html">job {j}</a> {esc(name)} ({esc((commit or "unknown commit")[:12])})</li>'
        for j, name, commit in job_ids
    )
    parts.append(f"<h2>Jobs</h2><ul>{jobs}</ul>")
    return page("KernelFarm", "\n".join(parts), "plotly.min.js")


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
        (out / "jobs" / f"{job.id}.html").write_text(
            render_job(
                store, job.id, "../plotly.min.js", links='<nav><a href="../index.html">index</a></nav>'
            )
        )
    if account is None:
        account = build_account(store, use_env=False)
    (out / "account.html").write_text(render_account(account, '<nav><a href="index.html">index</a></nav>'))
    index = _index(all_series, [(j.id, j.name, j.git_commit) for j, _ in jobs], account)
    (out / "index.html").write_text(index)
    return SiteResult(pages=2 + len(all_series) + len(jobs), kernels=len(all_series), jobs=len(jobs))
