"""`farm baseline set|list`: name a job as the baseline later jobs are compared to."""

from __future__ import annotations

import click
from rich.table import Table

from jobs.cli.common import console, db_option, echo, require_job, store_for


@click.group()
def baseline() -> None:
    """Name a job as the baseline later jobs are compared to."""


@baseline.command("set")
@click.argument("job_id", type=int)
@click.option("--name", default=None, help="baseline name (default: the job's spec name)")
@click.option(
    "--force", is_flag=True, help="move a name already on another job (of the same family and spec) here"
)
@db_option
def baseline_set(job_id: int, name: str | None, force: bool, db: str | None) -> None:
    """Take JOB_ID's ok trials as baseline points (keyed by family, backend, shape, config, dtype and
    GPU model or CPU). A name on another job moves only with --force, never to another family or spec."""
    from jobs.judge.baselines import set_from_job

    store = store_for(db, create=True)
    require_job(store, job_id)
    done = set_from_job(store, job_id, name, force=force)  # BadInput (exit 2): refused, nothing changed
    if done.previous_job is None:
        verb = "set to"
    elif done.previous_job == job_id:
        verb = "refreshed on"
    else:
        verb = f"moved from job {done.previous_job} to"
    click.echo(f"baseline {done.baseline.name} {verb} job {job_id}: {done.points} points")
    for line in done.skipped:
        echo(f"  not taken: {line}")


@baseline.command("list")
@click.option("--history", is_flag=True, help="every setting of each baseline, oldest first")
@click.option("--name", default=None, help="with --history: only this baseline")
@db_option
def baseline_list(history: bool, name: str | None, db: str | None) -> None:
    """Every baseline: its job, family, points, commit and when it was set (--history: every move)."""
    store = store_for(db, create=False)
    table = Table()
    if history:
        for col in (
            "name",
            "job",
            "from job",
            "family",
            "spec",
            "points",
            "kernels commit",
            "forced",
            "set at",
        ):
            table.add_column(col)
        for m in store.baseline_history(name):
            table.add_row(
                m.name, str(m.job_id), "-" if m.previous_job_id is None else str(m.previous_job_id),
                m.family, m.spec_name, str(m.points), (m.git_commit or "-")[:12],
                "yes" if m.forced else "-", f"{m.set_at:%Y-%m-%d %H:%M:%S}",
            )  # fmt: skip
        console().print(table)
        return
    for col in ("name", "job", "family", "points", "kernels commit", "set at"):
        table.add_column(col)
    for b, n in store.list_baselines():
        table.add_row(
            b.name,
            str(b.job_id),
            b.family,
            str(n),
            (b.git_commit or "-")[:12],
            f"{b.created_at:%Y-%m-%d %H:%M:%S}",
        )
    console().print(table)
