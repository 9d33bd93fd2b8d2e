"""The figures of the pages, built in data units (jobs.report.plotting places them and moves what a log
axis needs into its coordinates): a job's time per shape (bar = median, whisker = p10..p90), a shape x
config heatmap per backend with several configs, speedups with their bootstrap interval, every trial's
samples, the roofline on a known GPU, a family's time series and scaling; a point's history across jobs;
the A/B of two jobs.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import plotly.graph_objects as go

from jobs.report.plotting import PlainFigure, hline, log_ticks
from jobs.report.rows import Row, Speedup, point_text
from jobs.report.rows import label as row_label
from kernels.base import TrialStatus
from kernels.hardware import limits_for


def time_per_shape(rows: list[Row]) -> PlainFigure | None:
    """The medians per shape, a bar per backend/config side by side (whisker p10..p90): a PlainFigure,
    the JSON its go.Figure (add_bar, update_layout) gave, keys in its order (20-70 ms a job page)."""
    timed = [r for r in rows if r.median_ms]
    if not timed:
        return None
    by_label: dict[str, list[Row]] = {}
    for r in timed:
        by_label.setdefault(row_label(r), []).append(r)
    traces = [
        {
            "error_y": {
                "array": [max(r.p90_ms - r.median_ms, 0) if r.p90_ms else 0 for r in mine],
                "arrayminus": [max(r.median_ms - r.p10_ms, 0) if r.p10_ms else 0 for r in mine],
                "symmetric": False,
                "type": "data",
            },
            "hovertemplate": "%{x}<br>%{y:.4g} ms<extra>" + html.escape(name) + "</extra>",
            "name": name + (" (baseline)" if mine[0].baseline else ""),
            "x": [r.shape for r in mine],
            "y": [r.median_ms for r in mine],
            "type": "bar",
        }
        for name, mine in by_label.items()
    ]
    layout = {
        "yaxis": {"type": "log", "title": {"text": "median time (ms)"}},
        "title": {"text": "Time per shape (median, whisker p10..p90), log axis"},
        "barmode": "group",
        "xaxis": {"title": {"text": "shape"}},
    }
    return PlainFigure(traces, layout)


def _log_colorbar(log10_ms: list[float]) -> dict[str, Any]:
    """A colour bar over log10(ms) labelled in ms, with log_ticks' values (not in log10 units)."""
    if not log10_ms:
        return {"title": "median ms"}
    values, labels = log_ticks(10 ** min(log10_ms), 10 ** max(log10_ms))
    return {"title": "median ms", "tickvals": [math.log10(v) for v in values], "ticktext": labels}


def heatmaps(rows: list[Row]) -> list[tuple[str, go.Figure]]:
    """A shape x config heatmap of log10(median ms) for every backend with more than one config."""
    out = []
    for backend in dict.fromkeys(r.backend for r in rows):
        mine = [r for r in rows if r.backend == backend]
        configs = list(dict.fromkeys(r.config for r in mine))
        if len(configs) < 2:
            continue
        shapes = list(dict.fromkeys(r.shape for r in mine))
        cell = {(r.shape, r.config): r for r in mine}
        z, text = [], []
        for s in shapes:
            zr, tr = [], []
            for c in configs:
                r = cell.get((s, c))
                ok = r is not None and r.median_ms
                zr.append(math.log10(r.median_ms) if ok else None)
                tr.append(f"{r.median_ms:.4g} ms" if ok else (r.status if r else "-"))
            z.append(zr)
            text.append(tr)
        fig = go.Figure(
            go.Heatmap(
                z=z,
                x=configs,
                y=shapes,
                text=text,
                texttemplate="%{text}",
                colorscale="Viridis",
                colorbar=_log_colorbar([v for zr in z for v in zr if v is not None]),
                hovertemplate="%{y}<br>%{x}<br>%{text}<extra></extra>",
            )
        )
        fig.update_layout(title=f"{backend}: median time per shape x config (blank: not timed)")
        out.append((backend, fig))
    return out


def speedup_figure(items: list[Speedup], against: str = "the baseline") -> PlainFigure | None:
    """The speedups with their intervals, a trace per label (a PlainFigure: a stored baseline's are a
    trace per trial)."""
    if not items:
        return None
    by_label: dict[str, list[Speedup]] = {}
    for s in items:
        by_label.setdefault(s.label, []).append(s)
    traces = [
        {
            "type": "scatter",
            "name": label,
            "mode": "markers",
            "x": [s.shape for s in mine],
            "y": [s.speedup for s in mine],
            "error_y": {
                "type": "data",
                "symmetric": False,
                "array": [max(s.high - s.speedup, 0) for s in mine],
                "arrayminus": [max(s.speedup - s.low, 0) for s in mine],
            },
            "marker": {"size": 10},
        }
        for label, mine in by_label.items()
    ]
    line, note = hline(1.0, "baseline")
    layout = {
        "shapes": [line],
        "annotations": [note],
        "title": {"text": f"Speedup over {against} (95% bootstrap interval; below 1: slower), log axis"},
        "yaxis": {"type": "log", "title": {"text": "baseline median / median"}},
        "xaxis": {"title": {"text": "shape"}},
    }
    return PlainFigure(traces, layout)


def samples_figure(rows: list[Row], ids: dict[int, int], kept: dict[int, list[int]]) -> PlainFigure | None:
    """Every timed trial's kept samples as a box (`ids`: a row's trial seq -> its trial id, `kept`: trial
    id -> its kept samples)."""
    boxes = []
    for r in rows:
        samples = kept.get(ids[r.trial]) if r.median_ms else None
        if not samples:
            continue
        boxes.append(
            {
                "type": "box",
                "name": f"#{r.trial} {row_label(r)} | {r.shape}",
                "y": [v / 1e6 for v in samples],
                "boxpoints": "all",
                "jitter": 0.4,
                "pointpos": 0,
                "marker": {"size": 4},
            }
        )
    if not boxes:
        return None
    layout = {
        "title": {"text": "Every trial's samples (ms), log axis"},
        "yaxis": {"type": "log", "title": {"text": "time (ms)"}},
        "showlegend": False,
        "xaxis": {"tickangle": -30, "automargin": True},
    }
    return PlainFigure(boxes, layout)


def roofline_figure(rows: list[Row], device: str | None) -> go.Figure | None:
    lim = limits_for(device)
    points = [r for r in rows if r.tflops and r.gbps]
    if lim is None or not points:
        return None
    ai = [r.tflops * 1e3 / r.gbps for r in points]  # FLOP per byte
    xs = np.logspace(math.log10(min(ai) / 4), math.log10(max(ai) * 4), 100)
    fig = go.Figure()
    for dtype, peak in lim.dense_tflops.items():
        fig.add_scatter(
            name=f"{lim.name} roof ({dtype} {peak:g} TFLOPS, {lim.hbm_gbps:g} GB/s)",
            x=xs,
            y=np.minimum(peak, lim.hbm_gbps * xs / 1e3),
            mode="lines",
            line={"dash": "dash"},
        )
    for label in dict.fromkeys(row_label(r) for r in points):
        mine = [(a, r) for a, r in zip(ai, points, strict=True) if row_label(r) == label]
        fig.add_scatter(
            name=label,
            x=[a for a, _ in mine],
            y=[r.tflops for _, r in mine],
            text=[r.shape for _, r in mine],
            mode="markers",
            marker={"size": 10},
        )
    fig.update_layout(
        title=f"Roofline on {lim.name}",
        xaxis={"type": "log", "title": "arithmetic intensity (FLOP/byte)"},
        yaxis={"type": "log", "title": "achieved TFLOPS"},
    )
    return fig


def timeseries_figures(trials: list[Any]) -> list[go.Figure]:
    """One figure per trial that recorded metrics["timeseries"] = {title, xlabel, x, series: {name: ys}}."""
    out = []
    for t in trials:
        ts = (t.metrics or {}).get("timeseries")
        if not isinstance(ts, dict):
            continue
        fig = go.Figure()
        for name, ys in (ts.get("series") or {}).items():
            fig.add_scatter(name=name, x=ts.get("x", [])[: len(ys)], y=ys, mode="lines")
        shape = point_text(t.shape)
        fig.update_layout(
            title=f"{ts.get('title', 'Time series')} ({t.backend} {shape})",
            xaxis={"title": ts.get("xlabel", "")},
        )
        out.append(fig)
    return out


def scaling_figures(trials: list[Any], scaling: tuple[tuple[str, str], ...]) -> list[go.Figure]:
    """One figure per (shape key, metric) the family declares: a line per backend/config and other keys."""
    out = []
    for x_key, metric in scaling:
        lines: dict[str, list[tuple[float, float]]] = {}
        for t in trials:
            y = (t.metrics or {}).get(metric)
            if t.status != TrialStatus.OK or x_key not in t.shape or not isinstance(y, int | float):
                continue
            rest = point_text({k: v for k, v in {**t.config, **t.shape}.items() if k != x_key})
            lines.setdefault(f"{t.backend} {rest}".strip(), []).append((t.shape[x_key], y))
        lines = {k: sorted(v) for k, v in lines.items() if len(v) > 1}
        if not lines:
            continue
        fig = go.Figure()
        for label, pts in lines.items():
            fig.add_scatter(name=label, x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers")
        fig.update_layout(
            title=f"{metric} against {x_key}", xaxis={"type": "log", "title": x_key}, yaxis={"title": metric}
        )
        out.append(fig)
    return out


def history_figure(series: Any) -> PlainFigure:
    """A jobs.history.series.Series: median per job (p10..p90 band) in commit order, the level change
    detection reads (with its standard error; contended points crossed), change points marked at the level
    after them, environment changes (a performance component) as dotted lines named at the top. A
    PlainFigure (what go.Figure's add_scatter, add_vline and add_annotation make, without their checks: a
    site's thousands of kernel pages took 40 ms each to build them)."""
    pts = series.points
    x = [f"#{p.job_id} {(p.commit or '?')[:8]}" for p in pts]
    # the band: an invisible line at p90, then p10 filled up to it
    hidden = {"name": "p90", "showlegend": False, "hoverinfo": "skip"}
    band = {"name": "p10..p90", "fill": "tonexty", "fillcolor": "rgba(54,108,204,0.2)"}
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "x": x, "y": [(getattr(p, edge) or p.median_ns) / 1e6 for p in pts],
         "mode": "lines", "line": {"width": 0}, **style}
        for edge, style in (("p90_ns", hidden), ("p10_ns", band))
    ]  # fmt: skip
    traces.append(
        {
            "type": "scatter",
            "name": "median",
            "x": x,
            "y": [p.median_ns / 1e6 for p in pts],
            "mode": "lines+markers",
        }
    )
    # what change detection reads: the level with its standard error; contended points as crosses
    traces.append(
        {
            "type": "scatter",
            "name": "level (x: contended, not used)",
            "x": x,
            "y": [p.level_ns / 1e6 for p in pts],
            "mode": "markers",
            "marker": {
                "symbol": ["x" if p.contended else "circle" for p in pts],
                "size": 8,
                "color": "#2a7d2a",
            },
            "error_y": {
                "type": "data",
                "array": [(p.uncertainty_ns or 0) / 1e6 for p in pts],
                "visible": True,
            },
        }
    )
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for c in series.changes:
        shapes.append(_vline(c.index - 0.5, "dash", "#b00020"))
        notes.append(
            {"x": x[c.index], "y": c.after_ns / 1e6, "text": f"{c.magnitude:+.1%}", "showarrow": True,
             "font": {"color": "#b00020"}}
        )  # fmt: skip
    for m in series.marks:
        shapes.append(_vline(m.index - 0.5, "dot", "#6a3d9a"))
        text = m.text if len(m.text) <= 60 else m.text[:57] + "..."
        notes.append(
            {"x": x[m.index], "y": 1, "yref": "paper", "text": f"env: {text}", "showarrow": False,
             "font": {"color": "#6a3d9a"}}
        )  # fmt: skip
    layout: dict[str, Any] = {
        "title": {"text": f"{series.key.label} on {series.key.env}: median per job (commit order)"},
        "yaxis": {"type": "log", "title": {"text": "median time (ms)"}},
        "xaxis": {"title": {"text": "job / commit"}, "type": "category"},
    }
    if shapes:
        layout["shapes"], layout["annotations"] = shapes, notes
    return PlainFigure(traces, layout)


def _vline(at: float, dash: str, color: str) -> dict[str, Any]:
    """A vertical line across the plot at `at`, as go.Figure.add_vline(at, line_dash, line_color) makes it."""
    return {"type": "line", "x0": at, "x1": at, "xref": "x", "y0": 0, "y1": 1, "yref": "y domain",
            "line": {"color": color, "dash": dash}}  # fmt: skip


def compare_shape(row: Any) -> str:
    """An A/B row's shape and dtype: its category on the A/B figures and its table row."""
    return f"{point_text(row.shape)} {row.dtype}"


def compare_time_figure(result: Any) -> go.Figure:
    """A jobs.report.ab.CompareResult: per shape the medians of A and B side by side."""
    shapes = [compare_shape(r) for r in result.rows]
    fig = go.Figure()
    for side in ("a", "b"):
        sides = [getattr(r, side) for r in result.rows]
        name = f"{side.upper()}: job {getattr(result, 'job_' + side)} {getattr(result, 'select_' + side)}"
        fig.add_bar(name=name, x=shapes, y=[s.median_ns / 1e6 if s and s.median_ns else None for s in sides])
    fig.update_layout(
        title="Median time per shape, A and B (log axis)",
        barmode="group",
        yaxis={"type": "log", "title": "median time (ms)"},
    )
    return fig


def compare_ratio_figure(result: Any) -> go.Figure:
    """B / A per shape with its interval; a shape whose ratio is undefined (a side of one sample) has no
    point: the page's table says why."""
    judged = [(compare_shape(r), r.comparison) for r in result.rows
              if r.comparison is not None and r.comparison.ratio is not None]  # fmt: skip
    ratio = go.Figure()
    if judged:
        ratio.add_scatter(
            name="B / A",
            mode="markers",
            x=[s for s, _ in judged],
            y=[c.ratio for _, c in judged],
            text=[c.verdict for _, c in judged],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [max((c.ci_high or c.ratio) - c.ratio, 0) for _, c in judged],
                "arrayminus": [max(c.ratio - (c.ci_low or c.ratio), 0) for _, c in judged],
            },
            marker={"size": 11},
        )
        ratio.add_hline(y=1.0, line_dash="dash")
    ratio.update_layout(
        title="B / A median ratio with its confidence interval (> 1: B slower), log axis",
        yaxis={"type": "log", "title": "median ratio B / A"},
    )
    return ratio
