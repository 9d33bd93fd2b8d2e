"""Plotly figures placed on a page: log axes whose ticks say their values, a legend that wraps without
shrinking the plot, slanted long category labels, and the figure's JSON made safe for a <script>.

Every page's figures pass through `figure_view()` (or `figure()`, the same placed alone); the figures
themselves are built in jobs.report.figures. Times are on log axes (a 0.03 ms baseline next to a 100 ms
candidate stays visible).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup
from plotly.utils import PlotlyJSONEncoder

from jobs.report.templating import render
from jobs.report.views import FigureView

TICK_CHAR_PX = 7.5  # about one character of a 13 px tick label
SLANT_ABOVE_PX = 900  # category labels longer than this all together are slanted
LEGEND_ROW_PX = 1100  # a legend row on a 1400 px page, less the margins (a narrower page wraps sooner)
LEGEND_SYMBOL_PX = 50  # a legend entry's symbol and gaps
LEGEND_LINE_PX = 22  # one more legend row


# ---- log axes ---------------------------------------------------------------------------------------
# Figures are built in data units everywhere: a trace's values, an annotation's x and y, a shape, an axis
# range. plotly.js reads a trace and a shape in data units on a log axis too, but an annotation's position
# and an axis range in the axis' own coordinates, log10 of the value (an annotation at y=69 on a log axis
# is drawn at 10^69). `figure()` is where every page's figures pass: log_axes() moves annotations and
# ranges there into log10, and gives each log axis its ticks (log_ticks).

LOG_MANTISSAS = (  # the ticks of one decade, sparsest first
    (1.0,),
    (1.0, 2.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0),
)
MIN_LOG_TICKS = 3  # tick labels inside the data's span
MAX_LOG_TICKS = 8  # decades labelled at most: a wider span labels every 2nd, 3rd, ... decade
_AXIS_REF = re.compile(r"([xy])(\d*)")


def _round(v: float) -> float:
    return float(f"{v:.12g}")


@functools.lru_cache(maxsize=256)
def _decades(mantissas: tuple[float, ...], d0: int, d1: int) -> tuple[float, ...]:
    """The ticks `mantissas` make in decades d0..d1 (the same few spans on a site's thousands of axes)."""
    return tuple(_round(m * 10.0**d) for d in range(d0, d1 + 1) for m in mantissas)


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Ticks for a log axis that shows the data from `lo` to `hi` (> 0): values and their labels. The
    sparsest of decades, 1-2-5, 1-1.5-2-3-5-7 and a finer set per decade that puts MIN_LOG_TICKS ticks
    between lo and hi, or round linear steps on a narrower span; each label is the value itself (0.02, 50,
    1e+06), never a digit whose decade the reader must guess. The ticks run on past lo and hi: plotly.js
    pads its range and draws the ticks inside it. One value (lo == hi) is shown a decade either side, as
    plotly.js does."""
    if not 0 < lo <= hi:
        raise ValueError(f"a log axis needs 0 < lo <= hi (got {lo}, {hi})")
    if lo == hi:
        lo, hi = lo / 10, hi * 10
    d0, d1 = math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1
    decades = math.log10(hi / lo)
    if decades > MAX_LOG_TICKS:
        k = math.ceil(decades / MAX_LOG_TICKS)
        values = [_round(10.0**d) for d in range(d0 - d0 % k, d1 + 1, k)]
    else:
        for mantissas in LOG_MANTISSAS:
            values = list(_decades(mantissas, d0, d1))
            if sum(lo <= v <= hi for v in values) >= MIN_LOG_TICKS:
                break
        else:  # a narrow span: the longest linear step of 1, 2 or 5 times a power of ten that fits
            most = (hi - lo) / MIN_LOG_TICKS
            base = 10.0 ** math.floor(math.log10(most))
            step = max(base * m for m in (1, 2, 5) if base * m <= most * (1 + 1e-9))
            first, last = math.floor(lo / step) - 1, math.ceil(hi / step) + 1
            values = [_round(i * step) for i in range(max(first, 1), last + 1)]
    return values, [f"{v:.10g}" for v in values]


def _positive(values: Any) -> list[float]:
    """The positive finite numbers of `values` (booleans aside), as floats."""
    if values is None:
        return []
    if isinstance(values, list) and set(map(type, values)) <= {float}:  # most: checked in C
        return [v for v in values if 0 < v < math.inf]
    out = []
    for v in values:
        if type(v) is float:  # most values (a samples figure's 50,000): the checks below in one comparison
            if 0 < v < math.inf:
                out.append(v)
        elif isinstance(v, int | float | np.number) and not isinstance(v, bool):
            if math.isfinite(v) and v > 0:
                out.append(float(v))
    return out


def _whisker_ends(values: Any, plus: list, minus: list) -> list[float]:
    """Each value's error bar ends, v + plus and v - minus (a missing bar: 0; a value that is no number:
    none): only the least and the greatest are used."""
    if set(map(type, values)) | set(map(type, plus)) | set(map(type, minus)) <= {float}:  # most: in C
        n = min(len(values), len(plus), len(minus))
        vs = values[:n]
        return [v + p for v, p in zip(vs, plus[:n], strict=True)] + [
            v - m for v, m in zip(vs, minus[:n], strict=True)
        ]
    nums = [float(v) if isinstance(v, int | float | np.number) else None for v in values]
    ends = []
    for v, p, m in zip(nums, plus, minus, strict=False):
        if v is not None:
            ends += (v + (p or 0), v - (m or 0))
    return ends


def _on_axis(data: list[dict], layout: dict, axis: str) -> list[float]:
    """Every positive value the figure puts on `axis` ("xaxis", "yaxis2"): its traces' values with their
    error bars, its shapes and its annotations (all in data units), in no particular order."""
    letter, n = axis[0], axis[5:]
    ref = letter + n
    values: list[float] = []
    for trace in data:
        if (
            trace.get("type") not in (None, "scatter", "scattergl", "bar", "box")
            or trace.get(f"{letter}axis", letter) != ref
        ):
            continue
        vs = trace.get(letter)
        pos = _positive(vs)
        values += pos
        err = trace.get(f"error_{letter}") or {}
        if pos and err.get("array") is not None:
            plus = list(err["array"])
            minus = list(err["arrayminus"]) if err.get("arrayminus") is not None else plus
            values += _positive(_whisker_ends(vs, plus, minus))
    for shape in layout.get("shapes", ()):
        if shape.get(f"{letter}ref", letter) == ref:
            values += _positive([shape.get(f"{letter}0"), shape.get(f"{letter}1")])
    for ann in layout.get("annotations", ()):
        if ann.get(f"{letter}ref", letter) == ref:
            values += _positive([ann.get(letter)])
    return values


def log_axes(data: list[dict], layout: dict) -> None:
    """Put a figure's annotations and ranges on log axes into the axis' coordinates (log10 of the value)
    and give every log axis readable ticks (log_ticks over what it shows), in place."""
    logs = {k for k, v in layout.items() if re.fullmatch(r"[xy]axis\d*", k) and v.get("type") == "log"}
    for axis in sorted(logs):
        ax = layout[axis]
        shown = _on_axis(data, layout, axis)
        if shown and "tickvals" not in ax and ax.get("tickmode") in (None, "auto"):
            ax["tickvals"], ax["ticktext"] = log_ticks(min(shown), max(shown))
            ax["tickmode"] = "array"
        if ax.get("range") is not None:
            ax["range"] = [math.log10(v) if v is not None and v > 0 else None for v in ax["range"]]
    kept = []
    for ann in layout.get("annotations", ()):
        for letter in "xy":
            ref = _AXIS_REF.fullmatch(str(ann.get(f"{letter}ref", letter)))
            if ref is None or f"{letter}axis{ref[2]}" not in logs or ann.get(letter) is None:
                continue  # paper, domain, or a linear or category axis: plotly.js reads data units there
            value = ann[letter]
            if not isinstance(value, int | float) or value <= 0:
                break  # nowhere on a log axis: not drawn
            ann[letter] = math.log10(value)
        else:
            kept.append(ann)
    if "annotations" in layout:
        layout["annotations"] = kept


def legend_room(data: list[dict[str, Any]], layout: dict[str, Any]) -> int:
    """The height a horizontal legend above the plot takes beyond its first row: entries (a symbol and
    the name) wrap onto rows of a page's width, and the figure grows by them so the plot area does not
    shrink as a spec gains configs."""
    if layout.get("showlegend") is False:
        return 0
    names = [str(d.get("name") or "") for d in data if d.get("showlegend", True) and d.get("name")]
    if len(names) < 2:
        return 0
    widths = [LEGEND_SYMBOL_PX + len(n) * TICK_CHAR_PX for n in names]
    rows, used = 1, 0.0
    for w in widths:
        if used and used + w > LEGEND_ROW_PX:
            rows, used = rows + 1, 0.0
        used += w
    return (rows - 1) * LEGEND_LINE_PX


def script_json(value: Any) -> Markup:
    """`value` as JSON that can stand inside a <script> (`<`, `>`, `&` and `'` as \\u escapes), numpy and
    Plotly values included."""
    return htmlsafe_json_dumps(value, dumps=json.dumps, cls=PlotlyJSONEncoder)


def _fit_layout(data: list[dict[str, Any]], layout: dict[str, Any], height: int | None) -> None:
    """The page's look as plain layout keys, in place: a Plotly template is merged on every figure, which
    is slow. Responsive width; long category labels (a shape's every key) slanted, the figure grown by the
    room they take and by the legend's extra rows, so that the plot area keeps its height; the legend
    above the plot, clear of labels and data."""
    layout.pop("template", None)
    layout.pop("width", None)  # responsive: as wide as the page (a 1400 px window, or a phone)
    labels = {str(v) for d in data if d.get("type") in ("bar", "scatter") for v in d.get("x") or ()}
    labels |= {str(d.get("name")) for d in data if d.get("type") == "box"}
    longest = max((len(v) for v in labels), default=0)
    slanted = len(labels) * longest * TICK_CHAR_PX > SLANT_ABOVE_PX
    if slanted:
        layout["xaxis"] = {"tickangle": -30, **layout.get("xaxis", {})}
    layout.update(
        autosize=True,
        height=(height or layout.get("height") or 420)
        + (int(longest * TICK_CHAR_PX / 2) if slanted else 0)
        + legend_room(data, layout),
        font={"size": 13},
        margin={"l": 70, "r": 30, "t": 20, "b": 60},
        plot_bgcolor="white",
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"},
    )
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {
            "gridcolor": "#e5e5e5",
            "zerolinecolor": "#ccc",
            "automargin": True,
            **layout.get(axis, {}),
        }
        layout[axis].setdefault("tickfont", {"size": 13})


@dataclass
class PlainFigure:
    """A figure as the JSON plotly.js draws: traces (each with its "type") and layout as plain dicts. For
    figures of hundreds of traces: go.Figure validates and deep-copies every property of every trace
    (2-3 ms a trace: a job of 500 trials' samples and speedups took 1.5 s). Placed by figure_view() as a
    go.Figure is."""

    data: list[dict[str, Any]]
    layout: dict[str, Any] = field(default_factory=dict)

    def to_plotly_json(self) -> dict[str, Any]:
        """A copy that placing may change (the traces are read, never changed; placing changes the
        layout's dicts and lists only)."""
        return {"data": list(self.data), "layout": _copied(self.layout)}


def _copied(value: Any) -> Any:
    """`value` with its dicts and lists copied all the way down (copy.deepcopy of a kernel page's layout
    was 0.1 ms, 2,000 pages a site's night)."""
    if type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    if type(value) is list:
        return [_copied(v) for v in value]
    return copy.deepcopy(value) if isinstance(value, dict | list | set) else value


def hline(y: float, text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A dashed line across the plot at `y`, named at its right end: (its shape, its annotation), as
    go.Figure.add_hline(y, line_dash="dash", annotation_text=text) makes them."""
    line = {"type": "line", "x0": 0, "x1": 1, "xref": "x domain", "y0": y, "y1": y, "yref": "y",
            "line": {"dash": "dash"}}  # fmt: skip
    note = {"showarrow": False, "text": text, "x": 1, "xanchor": "right", "xref": "x domain", "y": y,
            "yanchor": "bottom", "yref": "y"}  # fmt: skip
    return line, note


def figure_view(fig: go.Figure | PlainFigure, div_id: str, height: int | None = None) -> FigureView:
    """The figure ready for a page: its title (drawn above it, where the legend cannot cover it), its data
    and its layout as JSON, log axes in their own coordinates (log_axes)."""
    spec = fig.to_plotly_json()
    layout = spec["layout"]
    _fit_layout(spec["data"], layout, height)
    title = layout.pop("title", None) or ""
    title = title.get("text", "") if isinstance(title, dict) else str(title)
    log_axes(spec["data"], layout)
    return FigureView(div_id, title, script_json(div_id), script_json(spec["data"]), script_json(layout))


def figure(fig: go.Figure, div_id: str, height: int | None = None) -> str:
    """The figure as a <div> and the script that draws it (plotly.js must be on the page)."""
    return render("figure.html.j2", fig=figure_view(fig, div_id, height))
