"""Pages from templates: one Jinja2 environment over jobs/report/templates/, autoescape on.

Every value a template prints is escaped the way the standard library's html.escape does it (`'` as
`&#x27;`, as the pages always wrote it); what Python marks safe (a Markup: the figures' JSON, plotly.js
itself) is placed as it is. The templates hold the markup; the data is prepared in Python as the view
models of jobs.report.views.
"""

from __future__ import annotations

import html
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from jobs.report.views import Link, Spark

TEMPLATES = Path(__file__).with_name("templates")


def _escaped(value: Any) -> Any:
    """Every printed value, escaped here (before autoescape, which leaves a Markup as it is)."""
    if hasattr(value, "__html__"):
        return value
    return Markup(html.escape(str(value)))


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
    env.tests["link"] = lambda v: isinstance(v, Link)
    env.tests["spark"] = lambda v: isinstance(v, Spark)
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
