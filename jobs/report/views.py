"""The small view models the page templates (jobs/report/templates/) are filled with: a table, a link, an
inline sparkline, a placed figure. Python prepares them; the templates only place them, escaping every
value (jobs.report.templating)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup


@dataclass(frozen=True)
class Link:
    """An <a>: a table cell, a nav entry."""

    href: str
    text: str


@dataclass
class Table:
    """A <table>: the header, the rows (a cell is a value, a Link or a Spark), a class per row ("bad" or
    empty) and how many columns from the left are left-aligned (the rest are numbers)."""

    head: list[str]
    rows: list[list[Any]]
    classes: list[str] | None = None
    left: int = 1


@dataclass(frozen=True)
class Spark:
    """An inline SVG line (no script): its polyline's points and the change points' dots."""

    width: int
    height: int
    points: str
    dots: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class FigureView:
    """A Plotly figure placed on a page: its title above it, the <div> it is drawn in and the JSON of its
    data and layout (made safe for a <script> by jobs.report.plotting)."""

    div_id: str
    title: str
    div_json: Markup
    data: Markup
    layout: Markup


def spark(
    values: list[float], width: int = 160, height: int = 32, marks: tuple[int, ...] = ()
) -> Spark | str:
    """The sparkline of `values`, with the points at `marks` as red dots; an empty cell for no values."""
    if not values:
        return ""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    ys = [f"{height - 2 - (v - lo) / span * (height - 4):.1f}" for v in values]
    xy = list(zip(_xs(len(values), width), ys, strict=True))
    return Spark(width, height, " ".join(f"{x},{y}" for x, y in xy), tuple(xy[i] for i in marks))


@functools.lru_cache(maxsize=256)
def _xs(n: int, width: int) -> tuple[str, ...]:
    """The x of each of a sparkline's n points, as written (the same for every line of n points: a site's
    night draws thousands)."""
    step = width / max(n - 1, 1)
    return tuple(f"{i * step:.1f}" for i in range(n))


NAV_INDEX = (Link("../index.html", "index"),)  # a page one folder below the site's index
