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


# the table macro as it was written in the templates before issue 46 (a cell at a time), the markup
# templating.table_html must write
_MACRO = """{% macro spark(s) -%}
<svg class="spark" width="{{ s.width }}" height="{{ s.height }}" viewBox="0 0 {{ s.width }} {{ s.height }}"><polyline points="{{ s.points }}" fill="none" stroke="#366ccc" stroke-width="1.5"/>
{%- for x, y in s.dots %}<circle cx="{{ x }}" cy="{{ y }}" r="2.5" fill="#b00020"/>{% endfor %}</svg>
{%- endmacro %}
{% macro table(t) -%}
<table><tr>
{%- for h in t.head %}<th{% if loop.index0 < t.left %} class="l"{% endif %}>{{ h }}</th>{% endfor %}</tr>
{%- for r in t.rows %}
{%- set cls = t.classes[loop.index0] if t.classes else "" %}
<tr{% if cls %} class="{{ cls }}"{% endif %}>
{%- for v in r %}<td{% if loop.index0 < t.left %} class="l"{% endif %}>
{%- if v is link %}<a href="{{ v.href }}">{{ v.text }}</a>{% elif v is spark %}{{ spark(v) }}{% else %}{{ v }}{% endif -%}
</td>{% endfor %}</tr>
{%- endfor %}</table>
{%- endmacro %}
{{ table(t) }}"""  # noqa: E501 (the macro's lines as they were)


def test_a_tables_markup_is_what_the_macro_wrote_a_cell_at_a_time():
    from markupsafe import Markup

    env = environment().overlay()
    env.tests["link"] = lambda v: isinstance(v, Link)
    env.tests["spark"] = lambda v: isinstance(v, Spark)
    macro = env.from_string(_MACRO)
    cells = [1, 2.5, None, "", "a & b", "<i>'x'</i>", '"q"', Markup("<b>kept</b>"),
             Link("a.html?x=1&y=<2>", "l'<"), spark([1.0, 3.0, 2.0], marks=(0, 2)), spark([]), spark([5.0]),
             Spark(10, 4, "0,1 <2,3>", ())]  # fmt: skip
    tables = [
        Table(["a", "b<", "c"], [cells[:3], cells[3:6], cells[6:9], cells[9:12]], left=1),
        Table(["x"], [[c] for c in cells], ["bad" if i % 2 else "" for i in range(len(cells))], left=0),
        Table(["p", "q"], [[c, cells[-1 - i]] for i, c in enumerate(cells)], ['ev"il<'] * len(cells), left=2),
        Table(["only a header"], []),
        Table(
            ["plain", "n"], [["a", 1], [Link("b.html", "b"), 2.5], [True, None], ["c d", -3], ["", 0]], left=1
        ),
        Table(["x"], [[c] for c in cells if not isinstance(c, str | Link | Spark)], left=1),
    ]
    for t in tables:
        assert _table(t) == macro.render(t=t)
