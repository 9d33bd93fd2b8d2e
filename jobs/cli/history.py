"""`farm history`: one point's (or a spec's) median across jobs in commit order, with change points."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from jobs.cli.common import console, db_option, parse_point, store_for
from jobs.history.jsonout import series_json_parts
from jobs.history.series import DEFAULT_LAST, Selection, Series, collect, min_jobs, paused_gc
from jobs.judge.environment import changed_text


def _fmt(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def render_series(series: Series, out_console: Console) -> None:
    changes = {c.job_id: c for c in series.changes}
    marks = {m.job_id: m for m in series.marks}
    table = Table(title=f"{series.key.label} on {series.key.env}", title_justify="left")
    for col in ("job", "commit", "created", "median ms", "spread", "level ms", "+-", "p90 ms", "n", "change"):
        table.add_column(col, justify="left" if col in ("commit", "created", "change") else "right")
    table.add_column("environment", justify="left")  # what changed there (a performance component)
    for p in series.points:
        c = changes.get(p.job_id)
        mark = f"[bold red]{c.magnitude:+.1%}[/bold red] (p={c.p_value:.3f})" if c else ""
        env = marks[p.job_id].text if p.job_id in marks else ""
        table.add_row(
            str(p.job_id),
            (p.commit or "-")[:12],
            p.created_at.strftime("%Y-%m-%d %H:%M"),
            _fmt(p.median_ns / 1e6, ".4f"),
            _fmt(p.spread_pct, ".1f") + ("%" if p.spread_pct is not None else ""),
            _fmt(p.level_ns / 1e6, ".4f") + (" contended" if p.contended else ""),
            _fmt(p.uncertainty_ns / 1e6 if p.uncertainty_ns is not None else None, ".4f"),
            _fmt(p.p90_ns / 1e6 if p.p90_ns is not None else None, ".4f"),
            _fmt(p.n, "d"),
            mark,
            escape(env),
        )
    out_console.print(table)
    out_console.print(
        "  level: the median of the kept samples, +- its standard error; change points are found on it "
        "(contended trials left out while 11 clean jobs remain)"
    )
    need = min_jobs()
    if len(series.points) < need:
        have = len(series.points)
        out_console.print(
            f"  no change point can be called yet: that takes at least {need} jobs, this has {have}"
        )
    elif not series.changes:
        out_console.print("  no change point")
    for c in series.changes:
        there = f", environment changed there: {changed_text(c.environment)}" if c.environment else ""
        out_console.print(
            escape(
                f"  change point at job {c.job_id} (commit {c.commit or 'unknown'}): "
                f"{c.before_ns / 1e6:.4f} -> {c.after_ns / 1e6:.4f} ms, {c.magnitude:+.1%}{there}"
            )
        )
    for m in series.marks:
        out_console.print(
            escape(f"  environment changed at job {m.job_id} (commit {m.commit or 'unknown'}): {m.text}")
        )


@click.command("history")
@db_option
@click.option("--family", default=None, help="kernel family (e.g. fp8_gemm)")
@click.option("--backend", default=None, help="backend name")
@click.option("--shape", default=None, help="K=V,... the whole shape")
@click.option("--config", "config", default=None, help="K=V,... the whole config (`_` knobs ignored)")
@click.option("--dtype", default=None)
@click.option("--spec", default=None, help="only jobs of this spec name (all its points)")
@click.option("--json", "as_json", is_flag=True, help="print the series and change points as JSON")
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=None,
    help=f"only the newest N jobs that ran the selected points (default {DEFAULT_LAST}); "
    "the change points are found in them",
)
@click.option("--all", "every", is_flag=True, help="every job that ran the selected points (a year: seconds)")
def history(
    db: str | None,
    family: str | None,
    backend: str | None,
    shape: str | None,
    config: str | None,
    dtype: str | None,
    spec: str | None,
    as_json: bool,
    last: int | None,
    every: bool,
) -> None:
    """Median and spread per job in commit order; change points (E-divisive means) with their size.

    The newest 100 jobs that ran the selected points, unless --last N or --all: the change points are
    found in what is shown."""
    if not (family or spec):
        raise click.UsageError("name a --family (with --backend/--shape/--config to narrow) or a --spec")
    if every and last is not None:
        raise click.UsageError("--all and --last: name one")
    try:
        selection = Selection(
            family=family,
            backend=backend,
            shape=parse_point(shape, "--shape"),
            config=parse_point(config, "--config"),
            dtype=dtype,
            spec=spec,
            last=None if every else last or DEFAULT_LAST,
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    with paused_gc():  # a family's points are freed by their counts at the end of the command
        _show(db, selection, as_json)


def _show(db: str | None, selection: Selection, as_json: bool) -> None:
    """The selected series, as JSON or as tables."""
    store = store_for(db, create=False)
    try:
        found = collect(store, selection)
    finally:
        store.close()
    if not found:
        raise click.ClickException("no finished trial matches that selection")
    if as_json:
        for part in series_json_parts(found):
            click.echo(part, nl=False)
        click.echo()
        return
    out_console = console()
    for series in found:
        render_series(series, out_console)
    if selection.last is not None:
        out_console.print(
            f"  (the newest {selection.last} jobs that ran these points: --last N or --all for more)"
        )
