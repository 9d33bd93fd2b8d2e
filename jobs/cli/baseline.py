"""`farm baseline set|list`: name a job as the baseline later jobs are compared to."""

from __future__ import annotations

import click
from rich.console import Console
from rich.table import Table

from jobs.cli.common import db_option, echo, store_for


@click.group()
def baseline() -> None:
    """Name a job as the baseline later jobs are compared to."""


@baseline.command("set")
@click.argument("job_id", type=int)
@click.option("--name", default=None, help="baseline name (default: the job's spec name); reusing moves it")
@db_option
def baseline_set(job_id: int, name: str | None, db: str | None) -> None:
    """Take JOB_ID's ok trials as baseline points (keyed by family, backend, shape, config, dtype and
    GPU model or CPU)."""
    from jobs.judge.baselines import set_from_job

    store = store_for(db)
    try:
        done = set_from_job(store, job_id, name)
    except (LookupError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    verb = "moved to" if done.replaced else "set to"
    click.echo(f"baseline {done.baseline.name} {verb} job {job_id}: {done.points} points")
    for line in done.skipped:
        echo(f"  not taken: {line}")


@baseline.command("list")
@db_option
def baseline_list(db: str | None) -> None:
    """Every baseline: its job, family, points, commit and when it was set."""
    table = Table()
    for col in ("name", "job", "family", "points", "kernels commit", "set at"):
        table.add_column(col)
    for b, n in store_for(db).list_baselines():
        table.add_row(
            b.name,
            str(b.job_id),
            b.family,
            str(n),
            (b.git_commit or "-")[:12],
            f"{b.created_at:%Y-%m-%d %H:%M:%S}",
        )
    Console().print(table)
