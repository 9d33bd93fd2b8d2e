"""`farm jobs list|show`: the stored jobs."""

from __future__ import annotations

import click
from rich.table import Table

from jobs.cli.common import console, db_option, require_job, store_for
from jobs.cli.queue import jobs_cancel, jobs_logs, jobs_wait, queue_table
from kernels.base import NOT_FAILED, TrialStatus


@click.group()
def jobs() -> None:
    """List and inspect stored jobs."""


@jobs.command("list")
@db_option
@click.option("--limit", default=50, show_default=True)
def jobs_list(db: str | None, limit: int) -> None:
    """The most recent jobs with their trial counts."""
    store = store_for(db, create=False)
    table = Table()
    for col in ("job", "name", "family", "status", "trials", "ok", "not ok", "created", "kernels commit"):
        table.add_column(col)
    listed = store.list_jobs(limit)
    for job, counts in listed:
        total = sum(counts.values())
        bad = sum(n for s, n in counts.items() if s not in NOT_FAILED and s != TrialStatus.PENDING)
        table.add_row(
            str(job.id),
            job.name,
            job.family,
            job.status,
            str(total),
            str(counts.get(TrialStatus.OK, 0)),
            str(bad),
            f"{job.created_at:%Y-%m-%d %H:%M:%S}",
            (job.git_commit or "-")[:12],
        )
    out = console()
    out.print(table)
    waiting = queue_table(store, {job.id: counts for job, counts in listed})  # each job counted once
    if waiting is not None:
        out.print(waiting)


@jobs.command("show")
@click.argument("job_id", type=int)
@db_option
def jobs_show(job_id: int, db: str | None) -> None:
    """One job: spec, cluster, status counts and every trial."""
    store = store_for(db, create=False)
    job = require_job(store, job_id)
    out_console = console()
    out_console.print(f"[bold]job {job.id}[/bold] {job.name} family {job.family} status {job.status}")
    out_console.print(f"created {job.created_at}  started {job.started_at}  finished {job.finished_at}")
    out_console.print(f"spec hash {job.spec_hash}  kernels commit {job.git_commit or '-'}")
    if job.cluster:
        out_console.print(f"cluster: {job.cluster.get('address')} — {job.cluster.get('note')}")
    if job.message:
        out_console.print(f"message: {job.message}")
    out_console.print(
        "counts: " + " ".join(f"{k} {v}" for k, v in sorted(store.status_counts(job_id).items()))
    )
    table = Table()
    for col in (
        "#",
        "backend",
        "shape",
        "config",
        "dtype",
        "status",
        "attempt",
        "node",
        "worker",
        "gpu",
        "gpu type",
    ):
        table.add_column(col)
    for t in store.trials(job_id):
        table.add_row(
            str(t.seq),
            t.backend,
            str(t.shape),
            str(t.config),
            t.dtype,
            t.status,
            str(t.attempt),
            t.node or "-",
            t.worker or "-",
            t.gpu_id or "-",
            t.gpu_type or "-",
        )
    out_console.print(table)
    for line in comparison_lines(store.comparisons(job_id)):
        out_console.print(line)
    out_console.print("[bold]spec[/bold]\n" + job.spec)


def comparison_lines(rows: list) -> list[str]:
    """`farm jobs show`'s lines for the comparisons the job took part in (jobs.store's `comparisons`)."""
    from jobs.judge import environment

    lines = []
    for c in rows:
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(c.verdicts.items())) or "no shapes"
        sides = f"job {c.job_a} vs job {c.job_b}" if c.job_b is not None else f"job {c.job_a}, two configs"
        changed = environment.changed_text(environment.stored(c.environment)) or "environment unchanged"
        lines.append(f"comparison {c.id} ({c.created_at:%Y-%m-%d %H:%M}): {sides}: {verdicts}; {changed}")
    return lines


jobs.add_command(jobs_cancel)
jobs.add_command(jobs_wait)
jobs.add_command(jobs_logs)
