"""The kernel page's history figure (issue 46: a plain figure, not go.Figure's checked one, for a site's
thousands of kernel pages) is the figure plotly's own builder makes of the same series: the same traces,
lines and notes, placed on the page the same (jobs.report.plotting.figure_view), with change points,
environment changes (a long one cut), contended points and points without a spread."""

from __future__ import annotations

import json
from datetime import datetime

import plotly.graph_objects as go

from jobs.history.series import Change, EnvMark, HistoryPoint, PointKey, Series
from jobs.judge.environment import Difference
from jobs.report.figures import history_figure
from jobs.report.plotting import figure_view


def _plotly_built(series: Series) -> go.Figure:
    """The figure as go.Figure's methods build it (what the kernel pages drew before)."""
    pts = series.points
    x = [f"#{p.job_id} {(p.commit or '?')[:8]}" for p in pts]
    fig = go.Figure()
    hidden = {"name": "p90", "showlegend": False, "hoverinfo": "skip"}
    band = {"name": "p10..p90", "fill": "tonexty", "fillcolor": "rgba(54,108,204,0.2)"}
    for edge, style in (("p90_ns", hidden), ("p10_ns", band)):
        y = [(getattr(p, edge) or p.median_ns) / 1e6 for p in pts]
        fig.add_scatter(x=x, y=y, mode="lines", line={"width": 0}, **style)
    fig.add_scatter(name="median", x=x, y=[p.median_ns / 1e6 for p in pts], mode="lines+markers")
    fig.add_scatter(
        name="level (x: contended, not used)",
        x=x,
        y=[p.level_ns / 1e6 for p in pts],
        mode="markers",
        marker={"symbol": ["x" if p.contended else "circle" for p in pts], "size": 8, "color": "#2a7d2a"},
        error_y={"type": "data", "array": [(p.uncertainty_ns or 0) / 1e6 for p in pts], "visible": True},
    )
    for c in series.changes:
        fig.add_vline(x=c.index - 0.5, line_dash="dash", line_color="#b00020")
        fig.add_annotation(
            x=x[c.index],
            y=c.after_ns / 1e6,
            text=f"{c.magnitude:+.1%}",
            showarrow=True,
            font={"color": "#b00020"},
        )
    for m in series.marks:
        fig.add_vline(x=m.index - 0.5, line_dash="dot", line_color="#6a3d9a")
        text = m.text if len(m.text) <= 60 else m.text[:57] + "..."
        fig.add_annotation(
            x=x[m.index], y=1, yref="paper", text=f"env: {text}", showarrow=False, font={"color": "#6a3d9a"}
        )
    fig.update_layout(
        title=f"{series.key.label} on {series.key.env}: median per job (commit order)",
        yaxis={"type": "log", "title": "median time (ms)"},
        xaxis={"title": "job / commit", "type": "category"},
    )
    return fig


def _series(marks: bool) -> Series:
    key = PointKey("gemm", "torch_bf16", (("k", 256), ("m", 64)), (), "float32", "NVIDIA H100")
    points = [
        HistoryPoint(
            job_id=10 + i, job_name="nightly", commit=None if i == 3 else f"{i:040x}",
            created_at=datetime(2026, 1, 1),
            trial_id=100 + i, median_ns=1e6 * (1.25 if i >= 6 else 1.0) + 1000 * i,
            p10_ns=None if i == 2 else 9e5, p90_ns=1.3e6, iqr_ns=1e4, n=None if i == 4 else 100,
            mad_ns=5e3, flags=("contended",) if i == 5 else (),
        )
        for i in range(12)
    ]  # fmt: skip
    changes = [Change(16, points[6].commit, 6, 1e6, 1.25e6, 0.25, 0.005)]
    long = [Difference("torch", "2.12.0", "2.13.0"), Difference("driver", "570.1" * 8, "580.65" * 8)]
    env = [EnvMark(16, points[6].commit, 6, long), EnvMark(19, None, 9, long[:1])] if marks else []
    return Series(key, points, changes if marks else [], env)


def _placed(fig) -> tuple:
    view = figure_view(fig, "plot-history", 460)
    return view.title, json.loads(view.data), json.loads(view.layout)


def test_the_kernel_pages_figure_is_plotlys():
    for marks in (True, False):
        series = _series(marks)
        assert _placed(history_figure(series)) == _placed(_plotly_built(series))
    placed = _placed(history_figure(_series(True)))
    assert len(placed[2]["shapes"]) == 3 and any("env: torch" in a["text"] for a in placed[2]["annotations"])
