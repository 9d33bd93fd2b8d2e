"""A job page's figures of a trace per trial (jobs.report.figures' speedups and samples) are plain dicts
(jobs.report.plotting.PlainFigure), not go.Figure's validated objects (2-3 ms a trace): placed on the page
they are the JSON the go.Figure they replace gave (issue 46)."""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go

from jobs.report.figures import samples_figure, speedup_figure, time_per_shape
from jobs.report.plotting import figure_view
from jobs.report.rows import Row, Speedup
from jobs.report.rows import label as row_label

ITEMS = [
    Speedup("m=1 n=256", "torch_bf16", 1.25, 1.2, 1.3),
    Speedup("m=1 n=512", "torch_bf16", 0.8, 0.7, 0.9),
    Speedup("m=1 n=256", "triton block_m=64", 2.0, 1.9, 2.2),
]


def _row(seq: int, backend: str, config: str, median_ms: float | None) -> Row:
    return Row(
        trial=seq, shape="n=0", backend=backend, baseline=False, config=config, dtype="float32", status="ok",
        attempt=1, median_ms=median_ms, spread_pct=None, cv_pct=None, n=3, stop_reason=None, flags="",
        speedup=None, tflops=None, gbps=None, correct=None, max_abs_err=None, node=None, gpu_id=None,
        timer=None, error=None,
    )  # fmt: skip


def _placed(fig) -> tuple[str, object, object]:
    view = figure_view(fig, "plot-x")
    return view.title, json.loads(view.data), json.loads(view.layout)


def _speedup_as_go(items: list[Speedup], against: str) -> go.Figure:
    """The figure as it was built before (go.Figure, a trace per label, add_hline)."""
    fig = go.Figure()
    for label in dict.fromkeys(s.label for s in items):
        mine = [s for s in items if s.label == label]
        fig.add_scatter(
            name=label, mode="markers", x=[s.shape for s in mine], y=[s.speedup for s in mine],
            error_y={"type": "data", "symmetric": False, "array": [max(s.high - s.speedup, 0) for s in mine],
                     "arrayminus": [max(s.speedup - s.low, 0) for s in mine]},
            marker={"size": 10},
        )  # fmt: skip
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="baseline")
    fig.update_layout(
        title=f"Speedup over {against} (95% bootstrap interval; below 1: slower), log axis",
        yaxis={"type": "log", "title": "baseline median / median"},
        xaxis={"title": "shape"},
    )
    return fig


def test_the_speedup_figure_places_as_its_go_figure_did():
    assert _placed(speedup_figure(ITEMS, "the baseline backend")) == _placed(
        _speedup_as_go(ITEMS, "the baseline backend")
    )
    assert speedup_figure([]) is None


def test_the_samples_figure_places_as_its_go_figure_did():
    rows = [_row(0, "noop", "-", 1.0), _row(1, "spin", "ms=1", 2.0), _row(2, "spin", "ms=2", None)]
    ids = {0: 10, 1: 11, 2: 12}
    kept = {10: [1_000_000, 1_100_000, 900_000], 11: [2_000_000, 2_100_000], 12: [5]}
    fig = go.Figure()
    for r in rows[:2]:
        fig.add_box(
            name=f"#{r.trial} {row_label(r)} | {r.shape}", y=[v / 1e6 for v in kept[ids[r.trial]]],
            boxpoints="all", jitter=0.4, pointpos=0, marker={"size": 4},
        )  # fmt: skip
    fig.update_layout(
        title="Every trial's samples (ms), log axis",
        yaxis={"type": "log", "title": "time (ms)"},
        showlegend=False,
        xaxis={"tickangle": -30, "automargin": True},
    )
    plain = samples_figure(rows, ids, kept)
    assert _placed(plain) == _placed(fig)
    assert _placed(plain) == _placed(plain)  # placing it does not change it
    assert samples_figure(rows[2:], ids, kept) is None


def _time_per_shape_as_go(rows: list[Row]) -> go.Figure:
    """The figure as it was built before (go.Figure, add_bar a backend/config, update_layout)."""
    timed = [r for r in rows if r.median_ms]
    fig = go.Figure()
    for name in dict.fromkeys(row_label(r) for r in timed):
        mine = [r for r in timed if row_label(r) == name]
        fig.add_bar(
            name=name + (" (baseline)" if mine[0].baseline else ""),
            x=[r.shape for r in mine], y=[r.median_ms for r in mine],
            error_y={"type": "data", "symmetric": False,
                     "array": [max(r.p90_ms - r.median_ms, 0) if r.p90_ms else 0 for r in mine],
                     "arrayminus": [max(r.median_ms - r.p10_ms, 0) if r.p10_ms else 0 for r in mine]},
            hovertemplate="%{x}<br>%{y:.4g} ms<extra>" + html.escape(name) + "</extra>",
        )  # fmt: skip
    fig.update_layout(
        title="Time per shape (median, whisker p10..p90), log axis",
        barmode="group",
        yaxis={"type": "log", "title": "median time (ms)"},
        xaxis={"title": "shape"},
    )
    return fig


def test_the_time_per_shape_figure_places_as_its_go_figure_did_byte_for_byte():
    rows = [_row(0, "noop", "-", 1.0), _row(1, "spin", "ms=1", 2.0), _row(2, "spin", "ms=2", None)]
    rows += [_row(3, "spin", "ms=1", 3.5), _row(4, "w<a>&'", "-", 0.25), _row(5, "noop", "-", 4)]
    rows[0].baseline, rows[5].shape = True, "n=1"
    rows[1].p10_ms, rows[1].p90_ms, rows[3].p90_ms = 1.5, 2.5, 3.0  # a p90 below its median: whisker 0
    plain = time_per_shape(rows)
    placed, before = figure_view(plain, "plot-time"), figure_view(_time_per_shape_as_go(rows), "plot-time")
    assert placed == before  # the same JSON text: the page the same byte for byte
    assert figure_view(plain, "plot-time") == placed  # placing it does not change it
    assert time_per_shape(rows[2:3]) is None
