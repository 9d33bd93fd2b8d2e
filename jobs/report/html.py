"""Interactive HTML: a job's report, the A/B view and the pieces of the static site, with Plotly.

Every page is one file that opens offline: plotly.js is written into it (`plotly_src=None`), or, on the
site, loaded once from a file beside the pages (`plotly_src="plotly.min.js"`). Times are on log axes
(a 0.03 ms baseline next to a 100 ms candidate stays visible); every timed trial's raw samples are
plotted, so the page shows the data, not only a summary of it.

A job's report holds: the acceptance verdict with each failed or ambiguous assertion (as `farm accept`
stored them), the table of jobs.report.render.build_rows, time per shape with the backends side by side
(bar = median, whisker = p10..p90), a shape x config heatmap for every backend with several configs
(tile sweeps), the speedup against the baseline with a bootstrap confidence interval, the geometric-mean
speedup and fast_p (KernelBench: the fraction of shapes faster than the baseline by more than p), the
pruned configs with their reason, the samples of every trial, and on a known GPU a roofline chart.
"""

from __future__ import annotations

import html
import json
import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.utils import PlotlyJSONEncoder

from jobs.report.render import Row, build_rows, speedup_ci
from jobs.store import Store
from kernels.base import NOT_FAILED, TrialStatus
from kernels.hardware import limits_for

esc = html.escape
FAST_P = (0.0, 0.1, 0.5)  # the fast_p thresholds shown
TICK_CHAR_PX = 7.5  # about one character of a 13 px tick label
SLANT_ABOVE_PX = 900  # category labels longer than this all together are slanted
LEGEND_ROW_PX = 1100  # a legend row on a 1400 px page, less the margins (a narrower page wraps sooner)
LEGEND_SYMBOL_PX = 50  # a legend entry's symbol and gaps
LEGEND_LINE_PX = 22  # one more legend row

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1360px;color:#222}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f4f4f4}
td.l,th.l{text-align:left}tr.bad{background:#fdd}.pass{color:#176f2c;font-weight:bold}
.fail{color:#b00020;font-weight:bold}.ambiguous{color:#a65e00;font-weight:bold}
.verdict{font-size:1.3em;padding:.4em .8em;border:2px solid;display:inline-block;margin:.3em 0}
nav a{margin-right:1em}.spark{display:inline-block}h3.fig{font-size:15px;margin:1.2em 0 0}"""


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def page(title: str, body: str, plotly_src: str | None = None) -> str:
    """A whole HTML page; plotly.js inline when `plotly_src` is None, else a <script src> to it."""
    script = (
        f"<script>{plotly_js()}</script>"
        if plotly_src is None
        else f'<script src="{esc(plotly_src)}"></script>'
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>'
        f"<style>{STYLE}</style>{script}</head><body>\n{body}\n</body></html>\n"
    )


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
            values = [_round(m * 10.0**d) for d in range(d0, d1 + 1) for m in mantissas]
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
    out = []
    for v in values if values is not None else ():
        if isinstance(v, int | float | np.number) and not isinstance(v, bool) and math.isfinite(v) and v > 0:
            out.append(float(v))
    return out


def _on_axis(data: list[dict], layout: dict, axis: str) -> list[float]:
    """Every positive value the figure puts on `axis` ("xaxis", "yaxis2"): its traces' values with their
    error bars, its shapes and its annotations (all in data units)."""
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
            nums = [float(v) if isinstance(v, int | float | np.number) else None for v in vs]
            for v, p, m in zip(nums, plus, minus, strict=False):
                if v is not None:
                    values += _positive([v + (p or 0), v - (m or 0)])
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


def figure(fig: go.Figure, div_id: str, height: int | None = None) -> str:
    """The figure as a <div> and the script that draws it (plotly.js must be on the page). The page's
    look is set here as plain layout keys: a Plotly template is merged on every figure, which is slow."""
    spec = fig.to_plotly_json()
    layout = spec["layout"]
    layout.pop("template", None)
    layout.pop("width", None)  # responsive: as wide as the page (a 1400 px window, or a phone)
    # long category labels (a shape's every key) are slanted, and the figure grows by the room they take,
    # so that the plot area keeps its height; the legend sits at the right, clear of labels and data
    labels = {str(v) for d in spec["data"] if d.get("type") in ("bar", "scatter") for v in d.get("x") or ()}
    labels |= {str(d.get("name")) for d in spec["data"] if d.get("type") == "box"}
    longest = max((len(v) for v in labels), default=0)
    slanted = len(labels) * longest * TICK_CHAR_PX > SLANT_ABOVE_PX
    if slanted:
        layout["xaxis"] = {"tickangle": -30, **layout.get("xaxis", {})}
    layout.update(
        autosize=True,
        height=(height or layout.get("height") or 420)
        + (int(longest * TICK_CHAR_PX / 2) if slanted else 0)
        + legend_room(spec["data"], layout),
        font={"size": 13},
        margin={"l": 70, "r": 30, "t": 20, "b": 60},
        plot_bgcolor="white",
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": 1.02, "yanchor": "bottom"},
    )
    title = layout.pop("title", None) or ""  # above the figure, where the legend cannot cover it
    title = title.get("text", "") if isinstance(title, dict) else str(title)
    for axis in ("xaxis", "yaxis"):
        layout[axis] = {
            "gridcolor": "#e5e5e5",
            "zerolinecolor": "#ccc",
            "automargin": True,
            **layout.get(axis, {}),
        }
        layout[axis].setdefault("tickfont", {"size": 13})
    log_axes(spec["data"], layout)
    data = json.dumps(spec["data"], cls=PlotlyJSONEncoder)
    return (
        (f'<h3 class="fig">{esc(title)}</h3>' if title else "")
        + f'<div id="{div_id}" class="plot"></div><script>Plotly.newPlot("{div_id}", {data}, '
        f"{json.dumps(layout, cls=PlotlyJSONEncoder)}, {{responsive: true}});</script>"
    )


def table(head: list[str], rows: list[list[Any]], classes: list[str] | None = None, left: int = 1) -> str:
    th = "".join(
        f'<th class="l">{esc(h)}</th>' if i < left else f"<th>{esc(h)}</th>" for i, h in enumerate(head)
    )
    body = []
    for n, r in enumerate(rows):
        cls = f' class="{classes[n]}"' if classes and classes[n] else ""
        tds = "".join(
            f'<td class="l">{esc(str(v))}</td>' if i < left else f"<td>{esc(str(v))}</td>"
            for i, v in enumerate(r)
        )
        body.append(f"<tr{cls}>{tds}</tr>")
    return f"<table><tr>{th}</tr>{''.join(body)}</table>"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _label(r: Row) -> str:
    return r.backend + ("" if r.config == "-" else f" {r.config}")


# ---- the pieces of a job's report ----------------------------------------------------------------------


@dataclass
class Speedup:
    shape: str
    label: str
    speedup: float
    low: float
    high: float


def speedups(store: Store, job_id: int, rows: list[Row]) -> list[Speedup]:
    """Each timed non-baseline trial against the baseline on its shape (same config when the baseline
    has it), with a 95% bootstrap interval over both trials' kept samples."""
    trials = {t.seq: t for t in store.trials(job_id)}
    base: dict[tuple[str, str], dict[str, int]] = {}
    for r in rows:
        if r.baseline and r.status == TrialStatus.OK and r.median_ms:
            base.setdefault((r.shape, r.dtype), {})[r.config] = r.trial
    out = []
    for r in rows:
        if r.baseline or r.status != TrialStatus.OK or not r.median_ms:
            continue
        cands = base.get((r.shape, r.dtype), {})
        ref = (
            cands.get(r.config)
            if r.config in cands
            else (next(iter(cands.values())) if len(cands) == 1 else None)
        )
        if ref is None:
            continue
        ratio = speedup_ci(store, trials[ref].id, trials[r.trial].id)
        if ratio is not None:
            out.append(Speedup(r.shape, _label(r), *ratio))
    return out


def stored_baseline(store: Store, job_id: int) -> tuple[str, int, dict[int, int]] | None:
    """The stored baseline (`farm baseline set`) the job is judged against: the one `farm accept` used
    when its failures name a baseline job, else the newest one matching the job's points. Returns
    (name, its job, trial id of the job -> the matching baseline trial id), or None."""
    from jobs.judge import baselines

    used = {(f.evidence or {}).get("baseline_job") for f in store.failures() if f.job_id == job_id}
    family = store.get_job(job_id).family
    named = [b for b, _ in store.list_baselines() if b.job_id in used and b.family == family]
    base = named[0] if named else baselines.resolve(store, job_id)
    if base is None:
        return None
    found = baselines.matches(store, base, job_id)
    return (base.name, base.job_id, found) if found else None


def baseline_job_speedups(store: Store, job_id: int, rows: list[Row]) -> tuple[str, list[Speedup]]:
    """Each timed trial against its point in the stored baseline's job: how a regression `farm accept`
    caught shows (below 1). Returns (the baseline's description, the speedups); none without a baseline."""
    found = stored_baseline(store, job_id)
    if found is None:
        return "", []
    name, base_job, matched = found
    by_seq = {t.seq: t for t in store.trials(job_id)}
    out = []
    for r in rows:
        t = by_seq[r.trial]
        if r.status != TrialStatus.OK or not r.median_ms or t.id not in matched:
            continue
        ratio = speedup_ci(store, matched[t.id], t.id)
        if ratio is not None:
            out.append(Speedup(r.shape, f"#{r.trial} {_label(r)}", *ratio))
    return f"baseline {name} (job {base_job})", out


def speedup_summary(items: list[Speedup]) -> list[list[Any]]:
    """Per backend/config: shapes, geometric-mean speedup, and fast_p for each p in FAST_P."""
    out = []
    for label in dict.fromkeys(s.label for s in items):
        mine = [s.speedup for s in items if s.label == label]
        geo = math.exp(sum(math.log(v) for v in mine) / len(mine))
        fast = [sum(v > 1 + p for v in mine) / len(mine) for p in FAST_P]
        out.append([label, len(mine), f"{geo:.3f}x", *(f"{f:.0%}" for f in fast)])
    return out


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


def _undecided(anomaly: Any) -> str | None:
    """The assertion an anomaly records as undecided; None for other kinds and for a contended trial's
    `noisy`, which is no assertion."""
    check = UNDECIDED.get(anomaly.kind)
    if check == "stability" and "max_cv" not in (anomaly.evidence or {}):
        return None
    return check


def verdict_html(store: Store, job_id: int) -> str:
    """The acceptance verdict `farm accept` stored for the job, in its words: FAIL (an assertion failed, or
    was ambiguous under `--ambiguous fail`), WARN (only ambiguous ones, accepted as a warning) or PASS, with
    each assertion that did not pass. A pass with nothing to note stores nothing: then the box says so."""
    from jobs.judge.acceptance import trial_label

    failures = [f for f in store.failures() if f.job_id == job_id]
    anomalies = store.anomalies(job_id)
    banked = {(f.trial_id, f.assertion) for f in failures}
    judged = [Judged(f.outcome, f.assertion, f.label, f.message) for f in failures]
    trials = {t.id: t for t in store.trials(job_id)} if anomalies else {}
    for a in anomalies:
        check = _undecided(a)
        if check is None or (a.trial_id, check) in banked:
            continue
        t = trials.get(a.trial_id)
        judged.append(Judged("ambiguous", check, trial_label(t) if t else "-", a.message))
    n_fail = sum(j.outcome == "fail" for j in judged)
    n_ambiguous = len(judged) - n_fail
    counts = f"{n_fail} failed, {n_ambiguous} ambiguous"
    if failures:  # a failure bank entry: the verdict was fail (ambiguous ones too under --ambiguous fail)
        verdict, cls = "FAIL", "fail"
        counts += "" if n_fail else ", counted as failed (--ambiguous fail)"
        counts += f"; card {failures[0].card}"
    elif judged:
        verdict, cls = "WARN", "ambiguous"
        counts += ", accepted as a warning (--ambiguous warn)"
    elif anomalies:
        text = f"PASS (no failed or ambiguous assertion; {len(anomalies)} anomalies below)"
        return f'<p class="verdict pass">Acceptance: {esc(text)}</p>'
    else:
        return (
            '<p class="verdict">Acceptance: nothing stored (not judged yet, or passed with nothing to note:'
            " run <code>farm accept JOB</code>)</p>"
        )
    judged.sort(key=lambda j: j.outcome != "fail")
    rows = [[j.outcome.upper(), j.assertion, j.label, j.message] for j in judged]
    classes = ["bad" if j.outcome == "fail" else "" for j in judged]
    return f'<p class="verdict {cls}">Acceptance: {verdict} ({esc(counts)})</p>' + table(
        ["outcome", "assertion", "point", "message"], rows, classes, left=4
    )


HISTORY_JOBS = 20  # how many recent jobs a point's history in a job's report shows


def recent_history_html(store: Store, job_id: int, family: str, last: int = HISTORY_JOBS) -> str:
    """For each point of the job that earlier jobs also measured: its median over the last `last` jobs
    up to this one (a sparkline, this job the last dot) and the change from the previous job."""
    from jobs.history.series import Selection, collect

    rows, lines = [], []
    for series in collect(store, Selection(family=family), detect=False):
        at = next((i for i, p in enumerate(series.points) if p.job_id == job_id), None)
        if at is None or at == 0:
            continue
        window = series.points[max(0, at - last + 1) : at + 1]
        prev, this = window[-2], window[-1]
        rows.append(
            (
                this.trial_id,
                [
                    series.key.label,
                    len(window),
                    f"@@h{len(lines)}@@",
                    f"{this.median_ns / 1e6:.4f}",
                    f"{this.median_ns / prev.median_ns - 1:+.1%} (job {prev.job_id})",
                ],
            )
        )
        lines.append(sparkline([p.median_ns for p in window], marks=(len(window) - 1,)))
    if not rows:
        return ""
    rows.sort(key=lambda r: r[0])
    listing = table(
        ["point", "jobs", f"median, last {last} jobs (red: this job)", "median ms", "vs previous job"],
        [r for _, r in rows],
        left=1,
    )
    for i, line in enumerate(lines):
        listing = listing.replace(f"@@h{i}@@", line, 1)
    return "<h2>Recent history of these points</h2>" + listing


def anomalies_html(store: Store, job_id: int) -> str:
    found = store.anomalies(job_id)
    if not found:
        return ""
    rows = [[a.severity, a.kind, a.message] for a in found]
    return "<h2>Anomalies</h2>" + table(["severity", "kind", "message"], rows, left=3)


def trials_table(rows: list[Row]) -> str:
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
            _num(r.median_ms, ".4f"),
            _num(r.spread_pct, ".1f"),
            _num(r.n, "d"),
            (r.stop_reason or "-") + (f" ({r.flags})" if r.flags else ""),
            _num(r.speedup, ".3f"),
            _num(r.tflops, ".3f"),
            _num(r.gbps, ".2f"),
            {True: "pass", False: "FAIL", None: "-"}[r.correct],
            r.node or "-",
        ]
        for r in rows
    ]
    classes = ["" if r.status in NOT_FAILED else "bad" for r in rows]
    return table(head, body, classes, left=6)


def time_per_shape(rows: list[Row]) -> go.Figure | None:
    timed = [r for r in rows if r.median_ms]
    if not timed:
        return None
    fig = go.Figure()
    for label in dict.fromkeys(_label(r) for r in timed):
        mine = [r for r in timed if _label(r) == label]
        fig.add_bar(
            name=label + (" (baseline)" if mine[0].baseline else ""),
            x=[r.shape for r in mine],
            y=[r.median_ms for r in mine],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [max(r.p90_ms - r.median_ms, 0) if r.p90_ms else 0 for r in mine],
                "arrayminus": [max(r.median_ms - r.p10_ms, 0) if r.p10_ms else 0 for r in mine],
            },
            hovertemplate="%{x}<br>%{y:.4g} ms<extra>" + esc(label) + "</extra>",
        )
    fig.update_layout(
        title="Time per shape (median, whisker p10..p90), log axis",
        barmode="group",
        yaxis={"type": "log", "title": "median time (ms)"},
        xaxis={"title": "shape"},
    )
    return fig


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


def speedup_figure(items: list[Speedup], against: str = "the baseline") -> go.Figure | None:
    if not items:
        return None
    fig = go.Figure()
    for label in dict.fromkeys(s.label for s in items):
        mine = [s for s in items if s.label == label]
        fig.add_scatter(
            name=label,
            mode="markers",
            x=[s.shape for s in mine],
            y=[s.speedup for s in mine],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [max(s.high - s.speedup, 0) for s in mine],
                "arrayminus": [max(s.speedup - s.low, 0) for s in mine],
            },
            marker={"size": 10},
        )
    fig.add_hline(y=1.0, line_dash="dash", annotation_text="baseline")
    fig.update_layout(
        title=f"Speedup over {against} (95% bootstrap interval; below 1: slower), log axis",
        yaxis={"type": "log", "title": "baseline median / median"},
        xaxis={"title": "shape"},
    )
    return fig


def samples_figure(store: Store, job_id: int, rows: list[Row]) -> go.Figure | None:
    trials = {t.seq: t for t in store.trials(job_id)}
    fig = go.Figure()
    for r in rows:
        if not r.median_ms:
            continue
        samples = store.kept_samples(trials[r.trial].id)
        if not samples:
            continue
        fig.add_box(
            name=f"#{r.trial} {_label(r)} | {r.shape}",
            y=[v / 1e6 for v in samples],
            boxpoints="all",
            jitter=0.4,
            pointpos=0,
            marker={"size": 4},
        )
    if not fig.data:
        return None
    fig.update_layout(
        title="Every trial's samples (ms), log axis",
        yaxis={"type": "log", "title": "time (ms)"},
        showlegend=False,
        xaxis={"tickangle": -30, "automargin": True},
    )
    return fig


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
    for label in dict.fromkeys(_label(r) for r in points):
        mine = [(a, r) for a, r in zip(ai, points, strict=True) if _label(r) == label]
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
        shape = " ".join(f"{k}={v}" for k, v in t.shape.items())
        fig.update_layout(
            title=f"{ts.get('title', 'Time series')} ({t.backend} {shape})",
            xaxis={"title": ts.get("xlabel", "")},
        )
        out.append(fig)
    return out


def _family_scaling(family: str) -> tuple[tuple[str, str], ...]:
    from jobs.report.render import _family_view

    return _family_view(family)[1]


def scaling_figures(trials: list[Any], scaling: tuple[tuple[str, str], ...]) -> list[go.Figure]:
    """One figure per (shape key, metric) the family declares: a line per backend/config and other keys."""
    out = []
    for x_key, metric in scaling:
        lines: dict[str, list[tuple[float, float]]] = {}
        for t in trials:
            y = (t.metrics or {}).get(metric)
            if t.status != TrialStatus.OK or x_key not in t.shape or not isinstance(y, int | float):
                continue
            rest = " ".join(f"{k}={v}" for k, v in {**t.config, **t.shape}.items() if k != x_key)
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


def job_body(store: Store, job_id: int, *, links: str = "") -> str:
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    rows = build_rows(store, job_id)
    trials = store.trials(job_id)
    envs = store.environments(job_id)
    device = next((e.device_name for e in envs if e.device_kind == "gpu"), None)
    timing = "GPU timings" if device else "CPU timings (not GPU numbers)"
    parts = [
        links,
        f"<h1>Job {job.id}: {esc(job.name)} ({esc(job.family)})</h1>",
        f"<p>Status {esc(job.status)}; kernels at {esc(job.git_commit or 'unknown commit')}; {timing}.</p>",
        "<ul>"
        + "".join(f"<li>{esc(e.host)}: {esc(e.device_name)} ({esc(e.device_kind)})</li>" for e in envs)
        + "</ul>",
        verdict_html(store, job_id),
    ]
    figs: list[tuple[str, go.Figure | None, int | None]] = [("time", time_per_shape(rows), None)]
    figs += [(f"heatmap-{b}", f, 150 + 45 * len(f.data[0].y)) for b, f in heatmaps(rows)]
    items = speedups(store, job_id, rows)
    figs.append(("speedup", speedup_figure(items, "the baseline backend"), None))
    against, stored = baseline_job_speedups(store, job_id, rows)
    figs.append(("speedup-stored-baseline", speedup_figure(stored, against), None))
    figs.append(("samples", samples_figure(store, job_id, rows), 520))
    figs.append(("roofline", roofline_figure(rows, device), 520))
    figs += [(f"series-{i}", f, None) for i, f in enumerate(timeseries_figures(trials))]
    scaling = _family_scaling(job.family)
    figs += [(f"scaling-{i}", f, None) for i, f in enumerate(scaling_figures(trials, scaling))]
    if items:
        head = ["backend / config", "shapes", "geomean speedup"] + [f"fast_{p:g}" for p in FAST_P]
        parts.append("<h2>Speedup over the baseline</h2>" + table(head, speedup_summary(items)))
        parts.append(
            "<p>fast_p: the fraction of shapes faster than the baseline by more than p"
            " (fast_0.1: more than 10% faster).</p>"
        )
    for name, fig, height in figs:
        if fig is not None:
            parts.append(figure(fig, f"plot-{name}", height))
    pruned = [r for r in rows if r.status == TrialStatus.PRUNED]
    if pruned:
        parts.append("<h2>Pruned configs</h2>")
        parts.append(
            table(
                ["shape", "backend", "config", "reason"],
                [[r.shape, r.backend, r.config, r.error or "-"] for r in pruned],
                left=4,
            )
        )
    parts.append(recent_history_html(store, job_id, job.family))
    parts.append(anomalies_html(store, job_id))
    parts.append("<h2>Trials</h2>" + trials_table(rows))
    return "\n".join(p for p in parts if p)


def render_job(store: Store, job_id: int, plotly_src: str | None = None, links: str = "") -> str:
    job = store.get_job(job_id)
    if job is None:
        raise LookupError(f"no job {job_id} in {store.url}")
    return page(f"KernelFarm job {job_id}", job_body(store, job_id, links=links), plotly_src)


# ---- history (farm history --html, the site's kernel pages) -------------------------------------------


def history_figure(series: Any) -> go.Figure:
    """A jobs.history.series.Series: median per job (p10..p90 band) in commit order, the level change
    detection reads (with its standard error; contended points crossed), change points marked at the level
    after them."""
    pts = series.points
    x = [f"#{p.job_id} {(p.commit or '?')[:8]}" for p in pts]
    fig = go.Figure()
    fig.add_scatter(
        name="p90",
        x=x,
        y=[(p.p90_ns or p.median_ns) / 1e6 for p in pts],
        mode="lines",
        line={"width": 0},
        showlegend=False,
        hoverinfo="skip",
    )
    fig.add_scatter(
        name="p10..p90",
        x=x,
        y=[(p.p10_ns or p.median_ns) / 1e6 for p in pts],
        mode="lines",
        line={"width": 0},
        fill="tonexty",
        fillcolor="rgba(54,108,204,0.2)",
    )
    fig.add_scatter(name="median", x=x, y=[p.median_ns / 1e6 for p in pts], mode="lines+markers")
    # what change detection reads: the level with its standard error; contended points as crosses
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
    fig.update_layout(
        title=f"{series.key.label} on {series.key.env}: median per job (commit order)",
        yaxis={"type": "log", "title": "median time (ms)"},
        xaxis={"title": "job / commit", "type": "category"},
    )
    return fig


def sparkline(values: list[float], width: int = 160, height: int = 32, marks: tuple[int, ...] = ()) -> str:
    """An inline SVG line of `values` (no script), with change points as red dots."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    step = width / max(len(values) - 1, 1)
    xy = [(i * step, height - 2 - (v - lo) / span * (height - 4)) for i, v in enumerate(values)]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
    dots = "".join(f'<circle cx="{xy[i][0]:.1f}" cy="{xy[i][1]:.1f}" r="2.5" fill="#b00020"/>' for i in marks)
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<polyline points="{line}" fill="none" stroke="#366ccc" stroke-width="1.5"/>{dots}</svg>'
    )


# ---- the A/B view (farm compare A B --html) ------------------------------------------------------------


def render_compare(result: Any, plotly_src: str | None = None) -> str:
    """A jobs.report.ab.CompareResult: per shape A and B side by side, and B/A with its interval."""
    shapes = [" ".join(f"{k}={v}" for k, v in r.shape.items()) + f" {r.dtype}" for r in result.rows]
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
    # a shape whose ratio is undefined (a side of one sample) has no point: the table says why
    judged = [(s, r.comparison) for s, r in zip(shapes, result.rows, strict=True)
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
    rows = []
    for s, r in zip(shapes, result.rows, strict=True):
        c = r.comparison
        a_ms = _num(r.a.median_ns / 1e6 if r.a and r.a.median_ns else None, ".4f")
        b_ms = _num(r.b.median_ns / 1e6 if r.b and r.b.median_ns else None, ".4f")
        if c is None:
            rows.append([s, a_ms, b_ms, _num(None, ".3f"), f"{_num(None, '.3f')}..{_num(None, '.3f')}",
                         _num(None, ".2g"), "n/a", r.note])  # fmt: skip
            continue
        rows.append(
            [
                s, a_ms, b_ms,
                "undefined" if c.ratio is None else _num(c.ratio, ".3f"),
                f"{_num(c.ci_low, '.3f')}..{_num(c.ci_high, '.3f')}",
                _num(c.p_value, ".2g"),
                c.verdict,
                r.note or c.reason,
            ]
        )  # fmt: skip
    verdicts = ", ".join(f"{k}: {v}" for k, v in result.verdicts().items())
    body = (
        f"<h1>A/B: job {result.job_a} {esc(result.select_a)} vs "
        f"job {result.job_b} {esc(result.select_b)}</h1>"
        f'<p class="verdict">Verdicts per shape: {esc(verdicts)}</p>'
        + table(["shape", "A ms", "B ms", "B/A", "interval", "p", "verdict", "note"], rows)
        + figure(fig, "plot-ab-time")
        + figure(ratio, "plot-ab-ratio")
    )
    return page(f"KernelFarm A/B {result.job_a} vs {result.job_b}", body, plotly_src)
