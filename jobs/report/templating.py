"""Pages from templates: one Jinja2 environment over jobs/report/templates/, autoescape on.

Every value a template prints is escaped the way the standard library's html.escape does it (`'` as
`&#x27;`, as the pages always wrote it); what Python marks safe (a Markup: the figures' JSON, plotly.js
itself) is placed as it is. The templates hold the markup; the data is prepared in Python as the view
models of jobs.report.views.
"""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from jobs.report.views import Link, Spark, Table

TEMPLATES = Path(__file__).with_name("templates")


def _escaped(value: Any) -> Any:
    """Every printed value, escaped here (before autoescape, which leaves a Markup as it is)."""
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value)))


_SPECIAL = re.compile("[&<>\"']").search  # what html.escape changes


def _escape(text: str) -> str:
    """html.escape(text), looked for before it is made (most cells have nothing to escape)."""
    return html.escape(text) if _SPECIAL(text) else text


def _text(value: Any) -> str:
    """A value as a template prints it (_escaped, then autoescape): a Markup's markup, else escaped."""
    if type(value) is str:
        return _escape(value)
    return str(value.__html__()) if hasattr(value, "__html__") else html.escape(str(value))


def _spark(s: Spark) -> str:
    dots = "".join(f'<circle cx="{_text(x)}" cy="{_text(y)}" r="2.5" fill="#b00020"/>' for x, y in s.dots)
    w, h, points = _text(s.width), _text(s.height), _text(s.points)
    return (
        f'<svg class="spark" width="{w}" height="{h}" viewBox="0 0 {w} {h}"><polyline points="{points}"'
        f' fill="none" stroke="#366ccc" stroke-width="1.5"/>{dots}</svg>'
    )


def _cell(value: Any) -> str:
    kind = type(value)
    if kind is str:  # most cells (a kernel page's 2,000 tables of 500 cells): no __html__ looked for
        return _escape(value)
    if kind is int or kind is float:
        return str(value)  # digits, a sign, a point, e, inf, nan: nothing to escape
    if isinstance(value, Link):
        return f'<a href="{_text(value.href)}">{_text(value.text)}</a>'
    if isinstance(value, Spark):
        return _spark(value)
    return _text(value)


def _plain(rows: list[list[Any]]) -> bool:
    """Whether no str cell and no Link of `rows` has a character to escape: looked for once in all of
    them (a kernel page at 1/16 is 120 rows of 7 cells, 2,000 pages a night)."""
    texts = [v for row in rows for v in row if type(v) is str]
    texts += [x for row in rows for v in row if type(v) is Link for x in (v.href, v.text) if type(x) is str]
    return not _SPECIAL("\n".join(texts))


def table_html(t: Table) -> Markup:
    """A Table as every page places it (the `table` macro of _macros.html.j2 writes this): a header row,
    then a row per row with its class, the first `left` columns left-aligned, a cell a value, a Link or a
    Spark (an inline SVG), every value escaped as the templates escape it. Made as one string: the macro
    took 0.1 ms a row (a job page's 500 trials and 500 points of history, 50 ms); where no cell of the
    table has a character to escape its str cells and Links of str are written as they are, any other by
    _cell."""
    left = ' class="l"'
    head = "".join(f"<th{left if i < t.left else ''}>{_text(h)}</th>" for i, h in enumerate(t.head))
    opens = [f"<td{left}>" if i < t.left else "<td>" for i in range(max(map(len, t.rows), default=0))]
    plain = _plain(t.rows)
    out = [f"<table><tr>{head}</tr>"]
    for n, row in enumerate(t.rows):
        cls = t.classes[n] if t.classes else ""
        out.append(f'<tr class="{_text(cls)}">' if cls else "<tr>")
        for td, v in zip(opens, row):  # noqa: B905 - opens is as long as the longest row
            kind = type(v)
            if kind is str and plain:  # nothing to escape in the table: most cells as they are
                out += (td, v, "</td>")
            elif kind is Link and plain and type(v.href) is str and type(v.text) is str:
                out += (td, '<a href="', v.href, '">', v.text, "</a></td>")
            else:
                out += (td, _cell(v), "</td>")
        out.append("</tr>")
    out.append("</table>")
    return Markup("".join(out))


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        finalize=_escaped,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.globals["table_html"] = table_html
    return env


@cache
def plotly_js() -> str:
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def render(name: str, **context: Any) -> str:
    """The template `name` filled with `context`."""
    return environment().get_template(name).render(**context)


@cache
def _plotly_inline() -> Markup:
    return Markup(plotly_js())


def render_page(
    name: str,
    title: str,
    plotly_src: str | None = None,
    *,
    plotly: bool = True,
    nav: tuple[Link, ...] = (),
    **context: Any,
) -> str:
    """A whole page (a template that extends base.html.j2) titled `title`, with the `nav` links on top:
    plotly.js inline when `plotly_src` is None, else a <script src> to it; none at all with
    `plotly=False` (a page without a figure)."""
    inline = _plotly_inline() if plotly and plotly_src is None else None
    src = plotly_src if plotly else None
    return render(name, title=title, plotly_inline=inline, plotly_src=src, nav=nav, **context)
