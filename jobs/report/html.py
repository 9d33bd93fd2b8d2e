"""Interactive HTML pages with Plotly: a job's report (`farm report --html`, the site's job pages) and the
A/B view (`farm compare --html`). Each is rendered from its template in jobs/report/templates/ (Jinja2,
autoescape on) with the data prepared in Python: the job's view (jobs.report.job_view), the figures'
JSON (jobs.report.figures, placed by jobs.report.plotting).

Every page is one file that opens offline: plotly.js is written into it (`plotly_src=None`), or, on the
site, loaded once from a file beside the pages (`plotly_src="plotly.min.js"`). Times are on log axes
(a 0.03 ms baseline next to a 100 ms candidate stays visible); every timed trial's raw samples are
plotted, so the page shows the data, not only a summary of it.

A job's report holds: the acceptance verdict with each failed or ambiguous assertion (as `farm accept`
stored them), the table of jobs.report.rows.build_rows, time per shape with the backends side by side
(bar = median, whisker = p10..p90), a shape x config heatmap for every backend with several configs
(tile sweeps), the speedup against the baseline with a bootstrap confidence interval, the geometric-mean
speedup and fast_p (KernelBench: the fraction of shapes faster than the baseline by more than p), the
pruned configs with their reason, the samples of every trial, and on a known GPU a roofline chart.
"""

from __future__ import annotations

from typing import Any

from jobs.report.figures import compare_ratio_figure, compare_shape, compare_time_figure
from jobs.report.job_view import job_view
from jobs.report.plotting import figure_view
from jobs.report.rows import JobReads, num
from jobs.report.templating import render_page
from jobs.report.verdict import verdict_html
from jobs.report.views import Link, Table
from jobs.store import Store

__all__ = ["render_compare", "render_job", "verdict_html"]


def render_job(
    store: Store,
    job_id: int,
    plotly_src: str | None = None,
    nav: tuple[Link, ...] = (),
    reads: JobReads | None = None,
) -> str:
    """The job's report as one page; `nav`: links above it (the site's index); `reads`: what was read of
    the job already (jobs.report.rows.JobReads: the terminal table's)."""
    job = job_view(store, job_id, reads)
    return render_page("job.html.j2", f"KernelFarm job {job_id}", plotly_src, nav=nav, job=job)


def _compare_cells(row: Any) -> list[Any]:
    """One shape of the A/B: A and B's medians, B/A with its interval, p, verdict and note."""
    c = row.comparison
    a_ms = num(row.a.median_ns / 1e6 if row.a and row.a.median_ns else None, ".4f")
    b_ms = num(row.b.median_ns / 1e6 if row.b and row.b.median_ns else None, ".4f")
    if c is None:
        return [compare_shape(row), a_ms, b_ms, "-", "-..-", "-", "n/a", row.note]
    return [
        compare_shape(row), a_ms, b_ms,
        "undefined" if c.ratio is None else num(c.ratio, ".3f"),
        f"{num(c.ci_low, '.3f')}..{num(c.ci_high, '.3f')}",
        num(c.p_value, ".2g"),
        row.verdict,
        "; ".join(n for n in (row.ambiguous, row.note or c.reason) if n),
    ]  # fmt: skip


def render_compare(result: Any, plotly_src: str | None = None) -> str:
    """A jobs.report.ab.CompareResult: per shape A and B side by side, and B/A with its interval."""
    head = ["shape", "A ms", "B ms", "B/A", "interval", "p", "verdict", "note"]
    return render_page(
        "compare.html.j2",
        f"KernelFarm A/B {result.job_a} vs {result.job_b}",
        plotly_src,
        result=result,
        verdicts=", ".join(f"{k}: {v}" for k, v in result.verdicts().items()),
        environment=result.environment_lines(),
        table=Table(head, [_compare_cells(r) for r in result.rows]),
        figures=[
            figure_view(compare_time_figure(result), "plot-ab-time"),
            figure_view(compare_ratio_figure(result), "plot-ab-ratio"),
        ],
    )
