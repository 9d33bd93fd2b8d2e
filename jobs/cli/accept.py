"""`farm accept JOB` (the verdict against the metric card, with drafts for the anomalies) and
`farm failures list` (the failure bank)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.table import Table

from jobs.cli.common import (
    address_option,
    console,
    db_option,
    echo,
    output_option,
    require_job,
    store_for,
    writable_output,
)
from jobs.settings import FarmSettings
from jobs.spec.sweep import SpecError
from jobs.store import Store


@click.command("accept")
@click.argument("job_id", type=int)
@click.option("--baseline", "baseline_name", default=None, help="baseline name (default: newest matching)")
@click.option("--card", default=None, help="card name under jobs/cards or a YAML path (default: the spec's)")
@output_option("--junit", help="write JUnit XML")
@click.option("--confirm", is_flag=True, help="re-run suspicious trials interleaved with their baseline")
@click.option(
    "--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="rounds of --confirm"
)
@click.option(
    "--ambiguous", type=click.Choice(["fail", "warn"]), default=None,
    help="whether an ambiguous assertion (too noisy to call) fails the verdict or only warns "
    "(default: fail; on CPU timings the card's cpu.ambiguous, warn unless it says fail)",
)  # fmt: skip
@click.option("--tag", default=None, help="a tag kept with failures in the failure bank (CI build, branch)")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON instead of a table")
@click.option("--verbose", is_flag=True, help="list every assertion, not only those that did not pass")
@click.option(
    "--drafts",
    "want_drafts",
    is_flag=True,
    help="send the compressed anomalies through the gateway (FARM_GATEWAY_URL, FARM_GATEWAY_KEY; without "
    "a key: the offline drafter) and store the drafts with the job",
)
@click.option("--drafts-task", type=click.Choice(["checklist", "log_summary"]), default="checklist")
@address_option
@db_option
def accept_cmd(
    job_id: int,
    baseline_name: str | None,
    card: str | None,
    junit: Path | None,
    confirm: bool,
    rounds: int,
    ambiguous: str | None,
    tag: str | None,
    as_json: bool,
    verbose: bool,
    want_drafts: bool,
    drafts_task: str,
    address: str | None,
    db: str | None,
) -> None:
    """Judge JOB_ID against its metric card and baseline; exit 1 when an assertion fails."""
    import json

    from jobs.judge.acceptance import accept, render, write_junit
    from jobs.spec.cards import CardError

    if junit is not None:
        writable_output(junit)
    store = store_for(db, create=False)
    require_job(store, job_id)
    options = None
    if confirm:  # the runner (and Ray) only for the re-runs of --confirm
        from jobs.run.runner import RunOptions

        options = RunOptions(address=address or FarmSettings().ray_address, show_progress=False, echo=echo)
    try:
        acc = accept(
            store, job_id, card=card, baseline=baseline_name, ambiguous=ambiguous, confirm=confirm,
            rounds=rounds, tag=tag, options=options,
        )  # fmt: skip
    except CardError as err:
        click.echo(str(err), err=True)
        sys.exit(2)
    except (LookupError, ValueError, SpecError) as err:  # a bad invocation: 2, never a verdict's 1
        click.echo(f"Error: {err}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(acc.to_dict(), indent=2, default=str))
    else:
        render(acc, console(), verbose=verbose)
    if junit:
        write_junit(acc, junit)
        echo(f"wrote {junit}")
    if want_drafts:
        send_drafts(store, job_id, drafts_task)
    sys.exit(acc.exit_code)


def send_drafts(store: Store, job_id: int, task: str) -> None:
    """Drafts for the anomalies just stored; a gateway failure is reported, never changes the verdict."""
    from jobs.drafts.client import DraftsError, draft_job, render_drafts

    try:
        done = draft_job(store, job_id, task=task)
    except DraftsError as err:
        echo(f"drafts: {err}")
        return
    if done.skipped:
        echo(
            f"drafts: {len(done.skipped)} anomal{'y' if len(done.skipped) == 1 else 'ies'} not sent: "
            "the latest draft of each was rejected (farm drafts list)"
        )
    if done.run_id is None:
        if not done.skipped:
            echo("drafts: no anomalies to draft")
        return
    render_drafts(store, job_id, console())


@click.group()
def failures() -> None:
    """The failure bank: failed assertions kept across jobs."""


@failures.command("list")
@click.option(
    "--min-jobs", type=click.IntRange(min=1), default=1, show_default=True, help="seen in >= N jobs"
)
@click.option(
    "--by", "by", type=click.Choice(["fingerprint", "environment"]), default="fingerprint", show_default=True,
    help="environment: one row per fingerprint and environment the trials ran in (torch, triton, GPU, ...), "
    "so a failure seen on one version only shows as such",
)  # fmt: skip
@db_option
def failures_list(min_jobs: int, by: str, db: str | None) -> None:
    """Failed assertions grouped by fingerprint (and environment), the most recurring first."""
    from jobs.judge.acceptance import recurring

    by_env = by == "environment"
    table = Table()
    cols = ("fingerprint", "assertion", "point") + (("environment",) if by_env else ())
    for col in cols + ("jobs", "commits", "tags", "last message"):
        table.add_column(col, overflow="fold")
    for g in recurring(store_for(db, create=False), min_jobs, by_environment=by_env):
        table.add_row(
            g.fingerprint[:12],
            g.assertion,
            g.label,
            *((g.environment,) if by_env else ()),
            f"{len(g.jobs)}: " + ",".join(map(str, g.jobs)),
            ",".join(c[:12] for c in g.commits) or "-",
            ",".join(g.tags) or "-",
            g.last_message,
        )
    console().print(table)
