"""Pages that show what the data says (issue 32): on every log axis of every page, each annotation sits at
its value, the axis spans the data (not 10^72), and every tick label says the value at its place; the
verdict box says what `farm accept` decided (warn, with its ambiguous assertions, is not a green box).

The pages are drawn in one headless chromium for the session (tests/jobs/chromium_cdp.py) and read back
from the drawn figures: the axes' ranges, the pixel boxes of tick labels, annotations and shapes. What
they are checked against is the data the page was made from.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_report_html import _plot_data, gpu_job, make_job

from benchmarks.history_store import build_history_store
from jobs.cli import main
from jobs.history.series import collect
from jobs.judge.acceptance import accept
from jobs.report.ab import Selector, compare_jobs
from jobs.report.html import render_compare, verdict_html
from jobs.report.plotting import figure
from jobs.report.render import render_html
from jobs.report.site import _kernel_page
from jobs.store import Store

STRICT_CARD = (  # no measurement is this quiet: every timed trial's stability is ambiguous
    "name: strict\nfamily: probe\nassertions: [completes, stability]\nstability: {max_cv: 0.000001}\n"
)
STEP = 0.6  # the history's slowdown: 1.6x, as the 20 -> 32 ms


# ---- the pages --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Any]:
    """Every kind of page, written to files: a job report with a stored baseline, a job `farm accept`
    judged `warn`, a GPU job (roofline), the A/B page, and a kernel's history page with a 1.6x step."""
    root = tmp_path_factory.mktemp("pages")
    store = Store(str(root / "farm.db"))
    base = make_job(store, failures=False)
    out = CliRunner().invoke(main, ["baseline", "set", str(base), "--name", "main", "--db", store.url])
    assert out.exit_code == 0, out.output
    slower = make_job(store, scale=1.5)
    warned = make_job(store, failures=False)
    card = root / "strict.yaml"
    card.write_text(STRICT_CARD)
    acc = accept(store, warned, card=str(card), ambiguous="warn")
    assert acc.verdict == "warn" and acc.counts() == {"pass": 6, "skip": 4, "ambiguous": 6}, acc.counts()
    gpu = gpu_job(store)
    written = {}
    for name, job in (("report", slower), ("warn", warned), ("gpu", gpu)):
        written[name] = root / f"{name}.html"
        written[name].write_text(render_html(store, job))
    result = compare_jobs(store, base, slower, Selector.parse("ms=1"), Selector.parse("ms=1"))
    written["compare"] = root / "compare.html"
    written["compare"].write_text(render_compare(result))
    store.close()

    history_store = Store(str(root / "history.db"))
    built = build_history_store(history_store, jobs=16, slow_from=9, slowdown=STEP)
    series = [s for s in collect(history_store) if s.changes]
    assert series, "no change point found in the history"
    written["history"] = root / "history.html"
    written["history"].write_text(_kernel_page(series[0]).replace("../plotly.min.js", "plotly.min.js"))
    from jobs.report.templating import plotly_js

    (root / "plotly.min.js").write_text(plotly_js())
    history_store.close()
    return {"paths": written, "series": series[0], "slow_job": built.slow_job, "warned": warned, "acc": acc}


# ---- what chromium drew -----------------------------------------------------------------------------

PROBE = r"""(() => {
  const box = e => { const r = e.getBoundingClientRect();
                     return {left: r.left, top: r.top, right: r.right, bottom: r.bottom}; };
  const plots = {};
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const axes = {};
    for (const name of ['xaxis', 'yaxis']) {
      const ax = gd._fullLayout[name];
      axes[name] = {type: ax.type, range: ax.range.slice(),
        ticks: [...gd.querySelectorAll(`g.${ax._id}tick text`)].map(t => ({
          text: t.textContent, box: box(t), size: parseFloat(getComputedStyle(t).fontSize)}))};
    }
    plots[gd.id] = {
      data: gd.data, axes, area: box(gd.querySelector('.nsewdrag')),
      annotations: [...gd.querySelectorAll('g.annotation')].map(a => {
        const arrow = a.querySelector('.annotation-arrow-g path');
        return {index: +a.dataset.index, text: a.querySelector('.annotation-text').textContent,
                text_box: box(a.querySelector('.annotation-text-g')), arrow: arrow ? box(arrow) : null};
      }),
      shapes: [...gd.querySelectorAll('.shapelayer path')].map(box),
      colorbars: [...gd.querySelectorAll('g.colorbar')].map(c => ({fill: box(c.querySelector('rect.cbfill')),
        ticks: [...c.querySelectorAll('.cbaxis text')].map(t => ({text: t.textContent, box: box(t)}))})),
      layout_annotations: (gd.layout.annotations || []).map(a => ({text: a.text, showarrow: a.showarrow})),
    };
  }
  return plots;
})()"""


WINDOW = (1400, 1000)


def drawn(browser, path: Path) -> dict[str, Any]:
    browser.load(path, *WINDOW)
    assert browser.console == [], browser.console  # no JavaScript error, no warning
    plots = browser.evaluate(PROBE)
    assert plots, f"no figure drawn on {path.name}"
    return plots


def to_px(plot: dict, axis: str, value: float) -> float:
    """Where `value` (data units; a category's index on a category axis) is drawn on `axis`."""
    ax, area = plot["axes"][axis], plot["area"]
    r0, r1 = ax["range"]
    v = math.log10(value) if ax["type"] == "log" else value
    if axis == "yaxis":
        return area["bottom"] - (v - r0) / (r1 - r0) * (area["bottom"] - area["top"])
    return area["left"] + (v - r0) / (r1 - r0) * (area["right"] - area["left"])


def extent(plot: dict, letter: str) -> tuple[float, float]:
    """The smallest and largest positive value the plot's traces put on its `letter` axis (with error
    bars), and its shapes' lines."""
    values = []
    for trace in plot["data"]:
        if trace.get("type") == "heatmap":
            continue
        vs = [v for v in trace.get(letter) or () if isinstance(v, int | float)]
        values += vs
        err = trace.get(f"error_{letter}") or {}
        if err.get("array"):
            minus = err.get("arrayminus") or err["array"]
            values += [v + e for v, e in zip(vs, err["array"], strict=False)]
            values += [v - e for v, e in zip(vs, minus, strict=False)]
    values = [v for v in values if v > 0]
    assert values, f"nothing on the {letter} axis"
    return min(values), max(values)


SUFFIX = {"k": 1e3, "M": 1e6, "G": 1e9, "B": 1e9, "m": 1e-3, "µ": 1e-6, "μ": 1e-6, "n": 1e-9}


def tick_value(text: str) -> float:
    """A tick label's number (plotly's SI suffixes and unicode minus read too); a label that is not a
    number fails the test."""
    t = text.replace("\u2212", "-").replace(",", "").strip()
    scale = SUFFIX.get(t[-1:], 1.0) if t else 1.0
    if scale != 1.0:
        t = t[:-1]
    try:
        return float(t) * scale
    except ValueError:
        pytest.fail(f"tick label {text!r} is not a number")


def check_log_axes(plot: dict, name: str) -> int:
    """Every log axis of a drawn figure: it spans the data and not far more, and each tick label is a
    number drawn at the place of that number, without overlapping the next. Returns the log axes seen."""
    seen = 0
    for axis, ax in plot["axes"].items():
        if ax["type"] != "log":
            continue
        seen += 1
        where = f"{name} {axis}"
        lo, hi = extent(plot, axis[0])
        r0, r1 = sorted(ax["range"])
        span = math.log10(hi / lo)
        assert r0 <= math.log10(lo) + 1e-9 and r1 >= math.log10(hi) - 1e-9, (where, ax["range"], lo, hi)
        # one value is shown a decade either side (plotly.js); more, with a few percent of padding
        assert r1 - r0 <= max(1.3 * span + 0.4, 2.0 + 1e-9), (
            f"{where}: range 10^{r0:.2f}..10^{r1:.2f} for data {lo}..{hi}"
        )
        labels = [t for t in ax["ticks"] if t["text"].strip()]
        assert len(labels) >= 3, (where, [t["text"] for t in labels], ax["range"])
        along = ("top", "bottom") if axis == "yaxis" else ("left", "right")
        for t in labels:
            value = tick_value(t["text"])
            centre = (t["box"][along[0]] + t["box"][along[1]]) / 2
            assert abs(centre - to_px(plot, axis, value)) <= 3, (where, t["text"], centre, ax["range"])
            assert t["size"] >= 11, (where, t["text"], t["size"])
        spans = sorted((t["box"][along[0]], t["box"][along[1]], t["text"]) for t in labels)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            assert start >= end - 0.5, f"{where}: tick labels {a!r} and {b!r} overlap"
    return seen


def check_colorbars(plot: dict, name: str) -> None:
    """A heatmap's colours are log10(ms): its colour bar labels ms values at their colour (not log10)."""
    for trace, bar in zip(
        [t for t in plot["data"] if t["type"] == "heatmap"], plot["colorbars"], strict=True
    ):
        z = [v for row in trace["z"] for v in row if v is not None]
        z0, z1, fill = min(z), max(z), bar["fill"]
        labels = [t for t in bar["ticks"] if t["text"].strip()]
        assert len(labels) >= 2, (name, labels)
        for t in labels:
            value = tick_value(t["text"])
            assert value > 0, (name, t["text"])  # a time in ms, not its log10
            at = fill["bottom"] - (math.log10(value) - z0) / (z1 - z0) * (fill["bottom"] - fill["top"])
            centre = (t["box"]["top"] + t["box"]["bottom"]) / 2
            assert abs(centre - at) <= 3, (name, t["text"], centre, at)


def check_every_annotation_inside(plot: dict, name: str) -> None:
    """Every annotation is drawn inside its figure's plot area (an annotation at 10^69 is not)."""
    area = plot["area"]
    for a in plot["annotations"]:
        y = a["arrow"]["bottom"] if a["arrow"] else a["text_box"]["bottom"]
        assert area["top"] - 1 <= y <= area["bottom"] + 1, (name, a, area)


# ---- the history page -------------------------------------------------------------------------------


@pytest.mark.service("chromium")
def test_history_page_marks_the_change_at_its_value(pages, browser):
    """The change's label ("+60.0%") points at the series' level after the step, at the first slowed job;
    the axis spans the data (before the fix: 10^0..10^72, the series a flat line at the bottom)."""
    series = pages["series"]
    (change,) = series.changes
    assert change.job_id == pages["slow_job"]
    plot = drawn(browser, pages["paths"]["history"])["plot-history"]
    assert check_log_axes(plot, "history") == 1
    check_every_annotation_inside(plot, "history")
    (label,) = plot["annotations"]
    assert label["text"] == f"{change.magnitude:+.1%}" and abs(change.magnitude - STEP) < 0.1
    tip_x = (label["arrow"]["left"] + label["arrow"]["right"]) / 2
    # the arrow ends at the point: the change's job on the category axis, its level after the step
    assert abs(label["arrow"]["bottom"] - to_px(plot, "yaxis", change.after_ns / 1e6)) <= 3, label
    assert abs(tip_x - to_px(plot, "xaxis", change.index)) <= 12, (label, change.index)
    # the medians are drawn on the plot, apart: the step is visible, not a flat line
    before, after = change.before_ns / 1e6, change.after_ns / 1e6
    assert to_px(plot, "yaxis", before) - to_px(plot, "yaxis", after) > 40


# ---- a job's report ---------------------------------------------------------------------------------


@pytest.mark.service("chromium")
def test_speedup_baseline_label_sits_on_the_line_at_1(pages, browser):
    plots = drawn(browser, pages["paths"]["report"])
    for div in ("plot-speedup", "plot-speedup-stored-baseline"):
        plot = plots[div]
        check_every_annotation_inside(plot, div)
        at_1 = to_px(plot, "yaxis", 1.0)
        (line,) = plot["shapes"]
        assert abs(line["top"] - at_1) <= 2 and abs(line["bottom"] - at_1) <= 2, (div, line, at_1)
        (label,) = plot["annotations"]
        assert label["text"] == "baseline" and abs(label["text_box"]["bottom"] - at_1) <= 3, (div, label)


@pytest.mark.service("chromium")
@pytest.mark.parametrize("page", ["report", "warn", "gpu", "compare", "history"])
def test_every_log_axis_spans_its_data_with_readable_ticks(pages, browser, page):
    """Every figure of every kind of page: its log axes span the data, their tick labels are numbers with
    their magnitude (not a bare 2..8 under 20..80) at the place of that number, none overlapping."""
    plots = drawn(browser, pages["paths"][page])
    logs = 0
    for div, plot in plots.items():
        logs += check_log_axes(plot, f"{page} {div}")
        check_colorbars(plot, f"{page} {div}")
        check_every_annotation_inside(plot, f"{page} {div}")
    assert logs >= {"report": 4, "warn": 3, "gpu": 4, "compare": 2, "history": 1}[page], logs


@pytest.mark.service("chromium")
def test_warn_verdict_box_in_chromium(pages, browser):
    browser.load(pages["paths"]["warn"], *WINDOW)
    text = browser.evaluate("document.querySelector('p.verdict').innerText")
    cls = browser.evaluate("document.querySelector('p.verdict').className")
    colour = browser.evaluate("getComputedStyle(document.querySelector('p.verdict')).color")
    assert text.startswith("Acceptance: WARN (0 failed, 6 ambiguous"), text
    assert cls == "verdict ambiguous" and colour == "rgb(166, 94, 0)", (cls, colour)
    rows = browser.evaluate(
        "[...document.querySelectorAll('p.verdict + table tr')].slice(1).map(r => r.cells[0].innerText)"
    )
    assert rows == ["AMBIGUOUS"] * 6, rows


# ---- without a browser: the figures' coordinates and the verdict --------------------------------------


def _annotated_log_axes(page: str) -> list[tuple[str, dict, dict]]:
    out = []
    for div in re.findall(r'Plotly\.newPlot\("([^"]+)"', page):
        data, layout = _plot_data(page, div)
        for a in layout.get("annotations", []):
            axis = "yaxis" + a.get("yref", "y")[1:].split(" ")[0]
            if a.get("yref", "y").startswith("y") and layout.get(axis, {}).get("type") == "log":
                out.append((div, a, {"data": data, "layout": layout}))
    return out


def test_annotations_on_log_axes_are_placed_in_the_axis_coordinates(pages):
    """Plotly reads an annotation's y on a log axis as log10 of the value: the pages give it so."""
    report = pages["paths"]["report"].read_text()
    labels = _annotated_log_axes(report)
    assert {d for d, _, _ in labels} == {"plot-speedup", "plot-speedup-stored-baseline"}
    for div, a, _ in labels:
        assert a["text"] == "baseline" and a["y"] == pytest.approx(0.0), (div, a)  # log10(1)
    history = pages["paths"]["history"].read_text()
    ((_, a, _),) = _annotated_log_axes(history)
    (change,) = pages["series"].changes
    assert 10 ** a["y"] == pytest.approx(change.after_ns / 1e6), a


def test_figure_converts_every_annotation_and_range_on_a_log_axis():
    """figure() takes annotations and ranges in data units and gives plotly.js the axis' own coordinates:
    log10 on a log axis, unchanged on a linear or category one, and on paper or domain references."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 10, 100], y=[20, 32, 40], xaxis="x", yaxis="y"))
    fig.add_annotation(x=10, y=32, text="on both log axes")
    fig.add_annotation(x=0.5, y=0.5, xref="paper", yref="paper", text="paper")
    fig.add_annotation(x=1, y=20, xref="x domain", yref="y", text="domain x, log y")
    fig.update_layout(xaxis={"type": "log", "range": [1, 100]}, yaxis={"type": "log"})
    _, layout = _plot_data(figure(fig, "f"), "f")
    a, paper, domain = layout["annotations"]
    assert (a["x"], a["y"]) == (pytest.approx(1.0), pytest.approx(math.log10(32)))
    assert (paper["x"], paper["y"]) == (0.5, 0.5)
    assert (domain["x"], domain["y"]) == (1, pytest.approx(math.log10(20)))
    assert layout["xaxis"]["range"] == [pytest.approx(0.0), pytest.approx(2.0)]


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (20, 32),
        (20.0, 20.4),
        (3.0, 3.0),
        (0.5, 2.0),
        (0.03, 100),
        (1e-4, 1e4),
        (40, 233),
        (1e-9, 1e12),
        (0.65, 1.0),
        (0.5, 0.55),
        (7e-3, 9.9e-3),
    ],  # fmt: skip
)
def test_log_ticks_are_few_and_labelled_with_their_magnitude(lo, hi):
    from jobs.report.plotting import log_ticks

    values, labels = log_ticks(lo, hi)
    if lo == hi:  # one value: plotly.js shows it a decade either side
        lo, hi = lo / 10, hi * 10
    inside = [v for v in values if lo * 0.999 <= v <= hi * 1.001]
    assert 3 <= len(inside) <= 10, (lo, hi, inside)
    assert values == sorted(values) and all(v > 0 for v in values)
    for v, text in zip(values, labels, strict=True):
        assert float(text) == pytest.approx(v, rel=1e-9), (v, text)  # the label is the value itself


def test_verdict_box_says_warn_for_ambiguous_assertions(pages):
    """`farm accept` gave warn with 6 ambiguous assertions (none failed, so none in the failure bank):
    the box says WARN and lists them, not a green 'no failed assertion stored'."""
    page = pages["paths"]["warn"].read_text()
    assert "no failed assertion stored" not in page and 'class="verdict pass"' not in page
    m = re.search(r'<p class="verdict ambiguous">Acceptance: WARN \(0 failed, 6 ambiguous[^<]*</p>', page)
    assert m, re.search(r'<p class="verdict.*?</p>', page)[0]
    rows = re.findall(r'<tr><td class="l">AMBIGUOUS</td><td class="l">stability</td>', page)
    assert len(rows) == 6


def test_verdict_box_follows_each_acceptance_outcome(tmp_path, store):
    """The same job judged four ways: the box says what each `farm accept` said."""
    job = make_job(store, failures=False)
    assert "not judged" in verdict_html(store, job)
    strict = tmp_path / "strict.yaml"
    strict.write_text(STRICT_CARD)
    cases = [
        (dict(card=str(strict), ambiguous="fail"), "fail", "Acceptance: FAIL (0 failed, 6 ambiguous"),
        (dict(card=str(strict), ambiguous="warn"), "ambiguous", "Acceptance: WARN (0 failed, 6 ambiguous"),
        (dict(), None, None),  # the probe card passes it: nothing stored
    ]
    for kwargs, cls, text in cases:
        acc = accept(store, job, **kwargs)
        box = verdict_html(store, job)
        if cls is None:
            assert acc.verdict == "pass" and "not judged yet, or passed" in box, box
            continue
        assert acc.verdict == {"fail": "fail", "ambiguous": "warn"}[cls]
        assert box.startswith(f'<p class="verdict {cls}">{text}'), box


def test_the_values_a_log_axis_spans_are_the_positive_finite_numbers():
    """plotting._positive (what a log axis' ticks span): a float's fast path keeps what the general checks
    keep (not 0, a negative, NaN or infinity), and numpy numbers and ints as floats; no bool, str, None."""
    import numpy as np

    from jobs.report.plotting import _positive

    values = [2.5, 0.0, -0.0, -1.5, math.nan, math.inf, -math.inf, 1e-300, 3, True, "4", None,
              np.float64(5.5), np.float64(math.nan), np.int64(6), np.float32(0.25), False, 0]  # fmt: skip
    assert _positive(values) == [2.5, 1e-300, 3.0, 5.5, 6.0, 0.25]
    assert all(type(v) is float for v in _positive(values))
    assert _positive(None) == []


def test_whisker_ends_of_plain_floats_are_those_of_the_general_path():
    """The error bars' ends of a trace of floats (a kernel page's levels: taken in C) span what the
    general path (None, ints, numpy numbers, missing bars) finds for the same numbers."""
    import numpy as np

    from jobs.report.plotting import _whisker_ends

    rng = np.random.default_rng(3)
    values = [float(v) for v in rng.lognormal(0, 2, 100)]
    plus = [float(v) for v in rng.uniform(0, 1, 100)]
    minus = [float(v) for v in rng.uniform(0, 5, 100)]
    fast = _whisker_ends(values, plus, minus)
    general = _whisker_ends([np.float64(v) for v in values], plus, minus)  # not all floats: the loop
    assert sorted(fast) == sorted(general) and len(fast) == 200
    assert min(fast) == min(v - m for v, m in zip(values, minus, strict=True))
    assert _whisker_ends([1.0, None, 3], [0.5, 0.5, None], [0.5, 0.5, 1]) == [1.5, 0.5, 3.0, 2.0]
    assert _whisker_ends([1.0, 2.0], [0.5], [0.5, 0.5]) == [1.5, 0.5]  # as far as the shortest goes
