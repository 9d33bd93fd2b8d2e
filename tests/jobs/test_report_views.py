"""The pages' templates (jobs/report/templates/, jobs.report.templating) and their view models
(jobs.report.views): every value is escaped as html.escape does it, links and sparklines are placed as
markup, and a figure's JSON cannot close the <script> it stands in."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go

from jobs.drafts.account import Account
from jobs.report.account_page import render_account
from jobs.report.plotting import figure, script_json
from jobs.report.templating import environment, render
from jobs.report.verdict import VerdictView
from jobs.report.views import Link, Spark, Table, spark


def _table(table: Table) -> str:
    return (
        environment().from_string('{% from "_macros.html.j2" import table %}{{ table(t) }}').render(t=table)
    )


def test_autoescape_is_on_and_escapes_as_the_standard_library():
    assert environment().autoescape is True
    page = render("verdict.html.j2", verdict=VerdictView("fail", "<b>x</b> & it's"))
    assert page.startswith('<p class="verdict fail">Acceptance: &lt;b&gt;x&lt;/b&gt; &amp; it&#x27;s</p>')
    assert "<table>" not in page  # no assertion listed: no table
    assert "not judged yet" in render("verdict.html.j2", verdict=VerdictView())


def test_a_table_places_links_and_sparklines_and_escapes_the_rest():
    table = Table(
        ["name", "n", "history"],
        [[Link("kernels/a&b.html", "a<b"), 3, spark([1.0, 2.0, 1.5], marks=(1,))], ["<i>", 4, ""]],
        ["bad", ""],
        left=2,
    )
    html = _table(table)
    assert html.startswith('<table><tr><th class="l">name</th><th class="l">n</th><th>history</th></tr>')
    row1, row2 = re.findall(r"<tr.*?</tr>", html)[1:]
    assert row1.startswith('<tr class="bad"><td class="l"><a href="kernels/a&amp;b.html">a&lt;b</a></td>')
    assert '<td class="l">3</td><td><svg class="spark"' in row1 and row1.count("<circle") == 1
    assert row2 == '<tr><td class="l">&lt;i&gt;</td><td class="l">4</td><td></td></tr>'


def test_a_sparkline_scales_its_values_into_its_box():
    s = spark([10.0, 20.0], width=100, height=30, marks=(0,))
    assert isinstance(s, Spark) and s.points == "0.0,28.0 100.0,2.0" and s.dots == (("0.0", "28.0"),)
    assert spark([]) == ""


def test_a_figure_json_cannot_close_its_script():
    fig = go.Figure(go.Bar(name="</script><b>'x'", x=["n=1"], y=[1.0]))
    fig.update_layout(title="a <title>")
    placed = figure(fig, "plot-x")
    assert placed.startswith('<h3 class="fig">a &lt;title&gt;</h3><div id="plot-x" class="plot"></div>')
    script = placed[placed.index("<script>") + len("<script>") : placed.rindex("</script>")]
    assert "</script>" not in script and "<b>" not in script
    data = json.loads(re.search(r'Plotly\.newPlot\("plot-x", (\[.*?\]), \{"', placed)[1])
    assert data[0]["name"] == "</script><b>'x'"
    assert json.loads(script_json({"a": "<&>'"})) == {"a": "<&>'"}


def test_a_page_without_a_figure_loads_no_plotly_and_shows_its_nav():
    page = render_account(Account([]), (Link("index.html", "index"),))
    assert "<script" not in page and '<nav><a href="index.html">index</a></nav>' in page
    assert page.startswith("<!doctype html>") and "<title>Token account</title>" in page
