"""The `farm` command line."""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from jobs.migrations.schema import StoreSchemaError
from jobs.settings import FarmSettings, FarmSettingsError
from jobs.spec import SpecError, load_spec
from jobs.spec import loads_spec as load_spec_text
from jobs.store import Store
from kernels.base import NOT_FAILED, TrialStatus


def _store(db: str | None) -> Store:
    return Store(db or FarmSettings().db)


def _echo(message: str) -> None:
    click.echo(message, err=True)


db_option = click.option(
    "--db", default=None, help="SQLAlchemy URL or SQLite path (env FARM_DB; default .farm/farm.db)"
)
address_option = click.option(
    "--address",
    default=None,
    help="join this Ray cluster (e.g. 10.0.0.5:6379 or 'auto'); default: start a local one",
)
gpus_option = click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="workers to run: GPUs to use, or logical GPU slots on a CPU-only machine",
)
quiet_option = click.option("--quiet", is_flag=True, help="no live progress bar")


class _FarmGroup(click.Group):
    """Every command: a bad FARM_* value or an out-of-date store is one line and exit 1, no traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (FarmSettingsError, StoreSchemaError) as err:
            raise click.ClickException(str(err)) from None


@click.group(cls=_FarmGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """KernelFarm: sweep GPU kernels over a Ray cluster, store every sample, report and judge."""


# ---- sweep -------------------------------------------------------------------------------------------
@main.group()
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
    from jobs.report import render_terminal
    from jobs.runner import EXIT_INTERRUPTED

    if report:
        render_terminal(store, result.job_id, Console())
    counts = " ".join(f"{k} {v}" for k, v in sorted(result.counts.items()))
    _echo(f"job {result.job_id} {result.status}: {counts}" + (f"\n{result.note}" if result.note else ""))
    code = result.exit_code
    job = store.get_job(result.job_id)
    spec = load_spec_text(job.spec, f"job {job.id} spec")
    if accept is None:
        accept = spec.card is not None
    if accept and code != EXIT_INTERRUPTED:
        from jobs.acceptance import accept as judge
        from jobs.acceptance import render

        acc = judge(store, result.job_id, ambiguous=ambiguous)
        render(acc, Console(width=200))
        code = max(code, acc.exit_code)
        if spec.drafts:
            _accept_drafts(store, result.job_id, spec.drafts)
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
    from jobs.runner import RunOptions, run_sweep

    spec = _load(spec_path)
    settings = FarmSettings()
    store = _store(db)
    options = RunOptions(address or settings.ray_address, gpus or settings.gpus, not quiet, _echo)
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
    from jobs.runner import RunOptions, resume_job

    settings = FarmSettings()
    store = _store(db)
    try:
        options = RunOptions(address or settings.ray_address, gpus or settings.gpus, not quiet, _echo)
        result = resume_job(job_id, store, options)
    except (LookupError, SpecError) as err:
        raise click.ClickException(str(err)) from None
    _finish(result, store, not no_report, accept, ambiguous)


# ---- jobs --------------------------------------------------------------------------------------------
@main.group()
def jobs() -> None:
    """List and inspect stored jobs."""


@jobs.command("list")
@db_option
@click.option("--limit", default=50, show_default=True)
def jobs_list(db: str | None, limit: int) -> None:
    """The most recent jobs with their trial counts."""
    store = _store(db)
    table = Table()
    for col in ("job", "name", "family", "status", "trials", "ok", "not ok", "created", "kernels commit"):
        table.add_column(col)
    for job, counts in store.list_jobs(limit):
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
    Console().print(table)


@jobs.command("show")
@click.argument("job_id", type=int)
@db_option
def jobs_show(job_id: int, db: str | None) -> None:
    """One job: spec, cluster, status counts and every trial."""
    store = _store(db)
    job = store.get_job(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id} in {store.url}")
    console = Console()
    console.print(f"[bold]job {job.id}[/bold] {job.name} family {job.family} status {job.status}")
    console.print(f"created {job.created_at}  started {job.started_at}  finished {job.finished_at}")
    console.print(f"spec hash {job.spec_hash}  kernels commit {job.git_commit or '-'}")
    if job.cluster:
        console.print(f"cluster: {job.cluster.get('address')} — {job.cluster.get('note')}")
    if job.message:
        console.print(f"message: {job.message}")
    console.print("counts: " + " ".join(f"{k} {v}" for k, v in sorted(store.status_counts(job_id).items())))
    table = Table()
    for col in ("#", "backend", "shape", "config", "dtype", "status", "attempt", "node", "worker", "gpu"):
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
        )
    console.print(table)
    console.print("[bold]spec[/bold]\n" + job.spec)


# ---- report ------------------------------------------------------------------------------------------
@main.command("report")
@click.argument("job_id", type=int)
@db_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table", show_default=True
)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="also write an HTML report with plots to this file",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="write the json/csv export here instead of stdout",
)
def report(job_id: int, db: str | None, fmt: str, html_path: Path | None, output: Path | None) -> None:
    """Per shape and backend: median time, spread, speedup over baseline, throughput, correctness."""
    from jobs import report as rep

    store = _store(db)
    if store.get_job(job_id) is None:
        raise click.ClickException(f"no job {job_id} in {store.url}")
    if fmt == "table":
        rep.render_terminal(store, job_id, Console())
    else:
        text = rep.to_json(store, job_id) if fmt == "json" else rep.to_csv(store, job_id)
        if output:
            output.write_text(text)
            _echo(f"wrote {output}")
        else:
            click.echo(text, nl=False)
    if html_path:
        html_path.write_text(rep.render_html(store, job_id))
        _echo(f"wrote {html_path}")


# ---- baselines, acceptance and the failure bank ----------------------------------------------------
@main.group()
def baseline() -> None:
    """Name a job as the baseline later jobs are compared to."""


@baseline.command("set")
@click.argument("job_id", type=int)
@click.option("--name", default=None, help="baseline name (default: the job's spec name); reusing moves it")
@db_option
def baseline_set(job_id: int, name: str | None, db: str | None) -> None:
    """Take JOB_ID's ok trials as baseline points (keyed by family, backend, shape, config, dtype and
    GPU model or CPU)."""
    from jobs.baselines import set_from_job

    store = _store(db)
    try:
        done = set_from_job(store, job_id, name)
    except (LookupError, ValueError) as err:
        raise click.ClickException(str(err)) from None
    verb = "moved to" if done.replaced else "set to"
    click.echo(f"baseline {done.baseline.name} {verb} job {job_id}: {done.points} points")
    for line in done.skipped:
        _echo(f"  not taken: {line}")


@baseline.command("list")
@db_option
def baseline_list(db: str | None) -> None:
    """Every baseline: its job, family, points, commit and when it was set."""
    table = Table()
    for col in ("name", "job", "family", "points", "kernels commit", "set at"):
        table.add_column(col)
    for b, n in _store(db).list_baselines():
        table.add_row(
            b.name,
            str(b.job_id),
            b.family,
            str(n),
            (b.git_commit or "-")[:12],
            f"{b.created_at:%Y-%m-%d %H:%M:%S}",
        )
    Console().print(table)


@main.command("accept")
@click.argument("job_id", type=int)
@click.option("--baseline", "baseline_name", default=None, help="baseline name (default: newest matching)")
@click.option("--card", default=None, help="card name under jobs/cards or a YAML path (default: the spec's)")
@click.option(
    "--junit", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write JUnit XML"
)
@click.option("--confirm", is_flag=True, help="re-run suspicious trials interleaved with their baseline")
@click.option(
    "--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="rounds of --confirm"
)
@click.option("--ambiguous", type=click.Choice(["fail", "warn"]), default="fail", show_default=True)
@click.option("--tag", default=None, help="a tag kept with failures in the failure bank (CI build, branch)")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON instead of a table")
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
    ambiguous: str,
    tag: str | None,
    as_json: bool,
    want_drafts: bool,
    drafts_task: str,
    address: str | None,
    db: str | None,
) -> None:
    """Judge JOB_ID against its metric card and baseline; exit 1 when an assertion fails."""
    import json

    from jobs.acceptance import accept, render, write_junit
    from jobs.cards import CardError
    from jobs.runner import RunOptions

    store = _store(db)
    options = RunOptions(address=address or FarmSettings().ray_address, show_progress=False, echo=_echo)
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
        render(acc, Console(width=200))
    if junit:
        write_junit(acc, junit)
        _echo(f"wrote {junit}")
    if want_drafts:
        _accept_drafts(store, job_id, drafts_task)
    sys.exit(acc.exit_code)


def _accept_drafts(store: Store, job_id: int, task: str) -> None:
    """Drafts for the anomalies just stored; a gateway failure is reported, never changes the verdict."""
    from jobs.drafts import DraftsError, draft_job, render_drafts

    try:
        done = draft_job(store, job_id, task=task)
    except DraftsError as err:
        _echo(f"drafts: {err}")
        return
    if done.run_id is None:
        _echo("drafts: no anomalies to draft")
        return
    render_drafts(store, job_id, Console(width=200))


@main.group()
def failures() -> None:
    """The failure bank: failed assertions kept across jobs."""


@failures.command("list")
@click.option(
    "--min-jobs", type=click.IntRange(min=1), default=1, show_default=True, help="seen in >= N jobs"
)
@db_option
def failures_list(min_jobs: int, db: str | None) -> None:
    """Failed assertions grouped by fingerprint, the most recurring first."""
    from jobs.acceptance import recurring

    table = Table()
    for col in ("fingerprint", "assertion", "point", "jobs", "commits", "tags", "last message"):
        table.add_column(col, overflow="fold")
    for g in recurring(_store(db), min_jobs):
        table.add_row(
            g.fingerprint[:12],
            g.assertion,
            g.label,
            f"{len(g.jobs)}: " + ",".join(map(str, g.jobs)),
            ",".join(c[:12] for c in g.commits) or "-",
            ",".join(g.tags) or "-",
            g.last_message,
        )
    Console(width=200).print(table)


# ---- db ----------------------------------------------------------------------------------------------
@main.group("db")
def db_group() -> None:
    """The results store's schema (Alembic migrations in jobs/migrations)."""


@db_group.command("upgrade")
@db_option
def db_upgrade(db: str | None) -> None:
    """Create or migrate the store's tables to the newest schema.

    Run it once per store after installing a release that changes the schema (commands refuse an
    out-of-date store, naming this command); it adopts a store made before migrations. Safe to re-run,
    and from several hosts at once. A new, empty store needs no command: the first use creates it."""
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.migrations.schema import display_url, upgrade_schema
    from jobs.store import Base, make_engine

    url = db or FarmSettings().db
    try:
        engine = make_engine(url, check_schema=False)
    except (OSError, SQLAlchemyError) as err:
        raise click.ClickException(f"cannot open the farm store {url}: {_first_line(err)}") from None
    where = display_url(str(engine.url))
    try:
        before, after = upgrade_schema(engine, Base.metadata)
    except StoreSchemaError as err:
        raise click.ClickException(str(err)) from None
    except (OSError, SQLAlchemyError, RuntimeError) as err:  # RuntimeError: a table it cannot adopt
        raise click.ClickException(f"cannot upgrade the farm store {where}: {_first_line(err)}") from None
    finally:
        engine.dispose()
    if before.up_to_date:
        click.echo(f"{where}: schema already at the newest revision, {after.current}")
        return
    was = "empty" if before.empty else (before.current or "tables from before migrations")
    click.echo(f"{where}: schema upgraded from {was} to {after.current}")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else err.__class__.__name__


# ---- A/B comparison and tuned-config export ---------------------------------------------------------
from jobs.compare import compare as _compare  # noqa: E402
from jobs.compare import export as _export  # noqa: E402

main.add_command(_compare, "compare")
main.add_command(_export, "export")


# ---- gateway (a separate service; mounted only when its package is present) ----------------------------
try:
    from gateway.cli import gateway as _gateway_group

    main.add_command(_gateway_group, "gateway")
except ImportError:  # the farm runs without the gateway package
    pass


if __name__ == "__main__":
    main()
