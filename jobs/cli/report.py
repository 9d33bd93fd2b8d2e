"""`farm report JOB`: a job's report as a terminal table, JSON, CSV or HTML (jobs.report.render)."""

from __future__ import annotations

from pathlib import Path

import click

from jobs.cli.common import console, db_option, echo, output_option, require_job, store_for, writable_output


@click.command("report")
@click.argument("job_id", type=int)
@db_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True
)
@output_option("--html", "html_path", help="also write an HTML report with plots to this file")
@output_option("--output", "-o", help="write the json/csv export here instead of stdout")
def report(job_id: int, db: str | None, fmt: str, html_path: Path | None, output: Path | None) -> None:
    """Per shape and backend: median time, spread, speedup over baseline, throughput, correctness."""
    from jobs.report import render as rep

    for path in (output, html_path):
        if path is not None:
            writable_output(path)
    store = store_for(db, create=False)
    require_job(store, job_id)
    reads = rep.JobReads(store, job_id)  # the table and the page from one read of the job's trials
    if fmt == "table":
        rep.render_terminal(store, job_id, console(), reads)
    else:
        text = rep.to_json(store, job_id) if fmt == "json" else rep.to_csv(store, job_id)
        if output:
            output.write_text(text)
            echo(f"wrote {output}")
        else:
            click.echo(text, nl=False)
    if html_path:
        html_path.write_text(rep.render_html(store, job_id, reads))
        echo(f"wrote {html_path}")
