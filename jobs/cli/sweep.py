"""`farm sweep validate|run|resume`: check a spec, run it as a job, resume a stopped job."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console

from jobs.cli.accept import send_drafts
from jobs.cli.common import address_option, db_option, echo, gpus_option, quiet_option, store_for
from jobs.settings import FarmSettings
from jobs.spec.sweep import SpecError, load_spec
from jobs.spec.sweep import loads_spec as load_spec_text
from jobs.store.repository import Store


@click.group()
def sweep() -> None:
    """Validate, run and resume sweep jobs."""


@sweep.command("validate")
@click.argument("spec_path", type=click.Path(dir_okay=False, path_type=Path))
def sweep_validate(spec_path: Path) -> None:
    """Check a spec and print the trials it expands to, without running anything."""
    spec = _load(spec_path)
    trials = spec.trials()
    click.echo(f"{spec_path}: ok, family {spec.family}, baseline {spec.baseline}, {len(trials)} trials")
    for t in trials:
        click.echo(f"  {t.label()}")


def _load(path: Path):
    try:
        return load_spec(path)
    except SpecError as err:
        click.echo(str(err), err=True)
        sys.exit(2)


def _finish(result, store: Store, report: bool, accept: bool | None, ambiguous: str) -> None:
    """Report, then judge the job by its card (when the spec names one) and exit with the worse code."""
    from jobs.report.render import render_terminal
    from jobs.run.runner import EXIT_INTERRUPTED

    if report:
        render_terminal(store, result.job_id, Console())
    counts = " ".join(f"{k} {v}" for k, v in sorted(result.counts.items()))
    echo(f"job {result.job_id} {result.status}: {counts}" + (f"\n{result.note}" if result.note else ""))
    code = result.exit_code
    job = store.get_job(result.job_id)
    spec = load_spec_text(job.spec, f"job {job.id} spec")
    if accept is None:
        accept = spec.card is not None
    if accept and code != EXIT_INTERRUPTED:
        from jobs.judge.acceptance import accept as judge
        from jobs.judge.acceptance import render

        acc = judge(store, result.job_id, ambiguous=ambiguous)
        render(acc, Console(width=200))
        code = max(code, acc.exit_code)
        if spec.drafts:
            send_drafts(store, result.job_id, spec.drafts)
    sys.exit(code)


accept_option = click.option(
    "--accept/--no-accept", default=None,
    help="judge the job by its metric card when it finishes (default: when the spec names a card)",
)  # fmt: skip
ambiguous_option = click.option(
    "--ambiguous", type=click.Choice(["fail", "warn"]), default="fail", show_default=True,
    help="whether an ambiguous assertion (too noisy to call) fails the verdict or only warns",
)  # fmt: skip


@sweep.command("run")
@click.argument("spec_path", type=click.Path(dir_okay=False, path_type=Path))
@address_option
@gpus_option
@db_option
@quiet_option
@click.option("--no-report", is_flag=True, help="do not print the report table at the end")
@accept_option
@ambiguous_option
def sweep_run(
    spec_path: Path,
    address: str | None,
    gpus: int | None,
    db: str | None,
    quiet: bool,
    no_report: bool,
    accept: bool | None,
    ambiguous: str,
) -> None:
    """Run the sweep in SPEC_PATH: expand the grid, dispatch trials to one worker per GPU, store results."""
    from jobs.run.runner import RunOptions, run_sweep

    spec = _load(spec_path)
    settings = FarmSettings()
    store = store_for(db)
    options = RunOptions(address or settings.ray_address, gpus or settings.gpus, not quiet, echo)
    result = run_sweep(spec, store, options)
    _finish(result, store, not no_report, accept, ambiguous)


@sweep.command("resume")
@click.argument("job_id", type=int)
@address_option
@gpus_option
@db_option
@quiet_option
@click.option("--no-report", is_flag=True)
@accept_option
@ambiguous_option
def sweep_resume(
    job_id: int,
    address: str | None,
    gpus: int | None,
    db: str | None,
    quiet: bool,
    no_report: bool,
    accept: bool | None,
    ambiguous: str,
) -> None:
    """Run only the trials of JOB_ID that have not finished."""
    from jobs.run.runner import RunOptions, resume_job

    settings = FarmSettings()
    store = store_for(db)
    try:
        options = RunOptions(address or settings.ray_address, gpus or settings.gpus, not quiet, echo)
        result = resume_job(job_id, store, options)
    except (LookupError, SpecError) as err:
        raise click.ClickException(str(err)) from None
    _finish(result, store, not no_report, accept, ambiguous)
