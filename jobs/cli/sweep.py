"""`farm sweep validate|run|resume`: check a spec, run it as a job, resume a stopped job.

A grid of more than `--max-trials` trials (default 10,000) is refused by `validate` and `run` unless
`--yes` is given: a typo in an axis can turn a sweep into a million trials."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from jobs.cli.accept import send_drafts
from jobs.cli.common import address_option, console, db_option, echo, gpus_option, quiet_option, store_for
from jobs.settings import FarmSettings
from jobs.spec.sweep import SpecError, SweepSpec, TooManyTrials, load_spec
from jobs.spec.sweep import loads_spec as load_spec_text
from jobs.store import Store

if TYPE_CHECKING:  # the runner (and Ray with it) loads when a sweep runs
    from jobs.run.runner import RunOptions


@click.group()
def sweep() -> None:
    """Validate, run and resume sweep jobs."""


MAX_TRIALS = 10_000
SHOWN = 5  # trials listed at each end of the grid by `validate`

yes_option = click.option("--yes", is_flag=True, help="accept a grid larger than --max-trials")
max_trials_option = click.option(
    "--max-trials", type=click.IntRange(min=1), default=MAX_TRIALS, show_default=True,
    help="the largest grid accepted without --yes",
)  # fmt: skip
oversubscribe_option = click.option(
    "--oversubscribe", is_flag=True,
    help="on CPU, run more timing workers than the cluster has cores (timings then contend)",
)  # fmt: skip


@sweep.command("validate")
@click.argument("spec_path", type=click.Path(dir_okay=False, path_type=Path))
@yes_option
@max_trials_option
def sweep_validate(spec_path: Path, yes: bool, max_trials: int) -> None:
    """Check a spec and summarise the trials it expands to (counts per backend and axis, the first
    and last few), without running anything."""
    spec = _load(spec_path, yes, max_trials)
    total = spec.count_trials()
    click.echo(f"{spec_path}: ok, family {spec.family}, baseline {spec.baseline}, {total} trials")
    for line in grid_summary(spec, total):
        click.echo(line)


def grid_summary(spec: SweepSpec, total: int) -> list[str]:
    """Per backend its trial count, each axis with its number of values, then the first and last
    SHOWN trials (every trial when there are no more than 2 * SHOWN); read in one pass, flat memory."""
    per_backend: dict[str, int] = {}
    axes: dict[str, set[str]] = {}
    first: list[str] = []
    last: collections.deque[str] = collections.deque(maxlen=SHOWN)
    for i, t in enumerate(spec.iter_trials()):
        per_backend[t.backend] = per_backend.get(t.backend, 0) + 1
        for where, point in (("shape", t.shape), ("config", t.config), ("", {"dtype": t.dtype})):
            for key, value in point.items():
                name = f"{where}.{key}" if where else key
                if len(axes.setdefault(name, set())) < 1000:  # bounded: enough to count an axis
                    axes[name].add(repr(value))
        label = f"  {t.label()}"
        if i < SHOWN:
            first.append(label)
        else:
            last.append(label)
    lines = ["backends: " + ", ".join(f"{b} {n}" for b, n in per_backend.items())]
    lines.append(
        "axes: " + ", ".join(f"{a} ({len(v)}{'+' if len(v) >= 1000 else ''})" for a, v in axes.items())
    )
    lines += first
    if total > len(first) + len(last):
        lines.append(f"  ... {total - len(first) - len(last)} more ...")
    return lines + list(last)


def _load(path: Path, yes: bool = True, max_trials: int = MAX_TRIALS) -> SweepSpec:
    try:
        return load_spec(path, max_trials=None if yes else max_trials)
    except SpecError as err:
        click.echo(str(err), err=True)
    except TooManyTrials as err:  # refused before its trials are checked one by one
        click.echo(
            f"{path}: the grid expands to {err.total:,} trials, more than --max-trials {max_trials:,}; "
            "check the axes, or pass --yes to accept it",
            err=True,
        )
    sys.exit(2)


def _finish(
    result, store: Store, report: bool, accept: bool | None, ambiguous: str | None, verbose: bool = False
) -> None:
    """Report, then judge the job by its card (when the spec names one) and exit with the worse code."""
    from jobs.report.render import render_summary, render_terminal
    from jobs.run.runner import EXIT_INTERRUPTED

    if not result.resumed:  # a finished job: nothing ran, nothing is judged or changed again
        echo(result.note)
        sys.exit(result.exit_code)
    if report:
        render_terminal(store, result.job_id, console())
    counts = " ".join(f"{k} {v}" for k, v in sorted(result.counts.items()))
    echo(f"job {result.job_id} {result.status}: {counts}" + (f"\n{result.note}" if result.note else ""))
    code = result.exit_code
    job = store.get_job(result.job_id)
    spec = load_spec_text(job.spec, f"job {job.id} spec")
    if accept is None:
        accept = spec.card is not None
    acc = None
    if accept and code != EXIT_INTERRUPTED:
        from jobs.judge.acceptance import accept as judge
        from jobs.judge.acceptance import render

        acc = judge(store, result.job_id, ambiguous=ambiguous)
        render(acc, console(), verbose=verbose)
        code = max(code, acc.exit_code)
        if spec.drafts:
            send_drafts(store, result.job_id, spec.drafts)
    if report:
        render_summary(store, result.job_id, console(), acc)  # the last thing printed: per shape, one line
    sys.exit(code)


accept_option = click.option(
    "--accept/--no-accept", default=None,
    help="judge the job by its metric card when it finishes (default: when the spec names a card)",
)  # fmt: skip
ambiguous_option = click.option(
    "--ambiguous", type=click.Choice(["fail", "warn"]), default=None,
    help="whether an ambiguous assertion (too noisy to call) fails the verdict or only warns "
    "(default: fail; on CPU timings the card's cpu.ambiguous, warn unless it says fail)",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class RunArgs:
    """The options `sweep run` and `sweep resume` share (run_options)."""

    address: str | None
    gpus: int | None
    db: str | None
    quiet: bool
    no_report: bool
    accept: bool | None
    ambiguous: str | None
    oversubscribe: bool

    def run_options(self) -> RunOptions:
        """How the sweep runs: the options given, else the settings' (FARM_*)."""
        from jobs.run.runner import RunOptions

        settings = FarmSettings()
        options = RunOptions(
            self.address or settings.ray_address, self.gpus or settings.gpus, not self.quiet, echo
        )
        options.oversubscribe = self.oversubscribe
        return options


def run_options(f: Callable) -> Callable:
    """The options of RunArgs, on a command that takes them as **run."""
    no_report = click.option("--no-report", is_flag=True, help="do not print the report table at the end")
    for option in reversed(
        (address_option, gpus_option, db_option, quiet_option, no_report, accept_option, ambiguous_option,
         oversubscribe_option)
    ):  # fmt: skip
        f = option(f)
    return f


@sweep.command("run")
@click.argument("spec_path", type=click.Path(dir_okay=False, path_type=Path))
@run_options
@yes_option
@max_trials_option
@click.option("--verbose", is_flag=True, help="list every assertion of the verdict, not only failures")
def sweep_run(spec_path: Path, yes: bool, max_trials: int, verbose: bool, **run: Any) -> None:
    """Run the sweep in SPEC_PATH: expand the grid, dispatch trials to one worker per GPU, store results."""
    from jobs.run.runner import run_sweep

    args = RunArgs(**run)
    spec = _load(spec_path, yes, max_trials)
    store = store_for(args.db, create=True)
    with _no_job_on_interrupt():
        result = run_sweep(spec, store, args.run_options())
    _finish(result, store, not args.no_report, args.accept, args.ambiguous, verbose)


@contextlib.contextmanager
def _no_job_on_interrupt() -> Iterator[None]:
    """Ctrl-C or SIGTERM while connecting to Ray (before a job exists): one line, exit 130."""
    from jobs.run.runner import EXIT_INTERRUPTED

    try:
        yield
    except KeyboardInterrupt:
        echo("interrupted while connecting to Ray; nothing was stored")
        sys.exit(EXIT_INTERRUPTED)


@sweep.command("resume")
@click.argument("job_id", type=int)
@run_options
def sweep_resume(job_id: int, **run: Any) -> None:
    """Run only the trials of JOB_ID that have not finished (a finished job is left as it is)."""
    from jobs.run.runner import resume_job

    args = RunArgs(**run)
    store = store_for(args.db, create=True)
    try:
        with _no_job_on_interrupt():
            result = resume_job(job_id, store, args.run_options())
    except SpecError as err:
        raise click.ClickException(str(err)) from None
    _finish(result, store, not args.no_report, args.accept, args.ambiguous)
