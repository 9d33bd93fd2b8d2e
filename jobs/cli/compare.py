"""`farm compare` (A/B of two jobs, jobs.report.ab) and `farm export best-configs` (jobs.report.export)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from jobs.cli.common import console, db_option, output_option, require_job, store_for, writable_output

# jobs.report.ab (SciPy) and jobs.report.export (torch) are imported by the verbs that use them: every
# `farm` command assembles this module, and those two imports were 2 s of each command's start.


@click.command("compare")
@click.argument("job_a", type=int)
@click.argument("job_b", type=int, required=False)
@db_option
@click.option("--config-a", default=None, help="select side A: K=V,... over config keys (and backend=)")
@click.option("--config-b", default=None, help="select side B, same form")
@click.option("--min-effect", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.05)
@click.option("--alpha", type=click.FloatRange(0, 1, min_open=True, max_open=True), default=0.002)
@click.option("--json", "as_json", is_flag=True, help="print the comparison as JSON")
@click.option("--fail-on-slower", is_flag=True, help="exit 1 when B is slower than A on any shape")
@output_option("--html", "html_path", help="also write the A/B view as an interactive HTML file")
def compare(
    job_a: int,
    job_b: int | None,
    db: str | None,
    config_a: str | None,
    config_b: str | None,
    min_effect: float,
    alpha: float,
    as_json: bool,
    fail_on_slower: bool,
    html_path: Path | None,
) -> None:
    """A/B per shape: two tile configs from two jobs, or two configs inside one job. Each comparison is
    kept in the store with what differed between the two jobs' environments (`farm jobs show` lists them)."""
    from jobs.report.ab import Selector, compare_jobs, render

    store = store_for(db, create=False)
    for job_id in (job_a, job_b):
        if job_id is not None:
            require_job(store, job_id)
    try:
        result = compare_jobs(
            store,
            job_a,
            job_b,
            Selector.parse(config_a),
            Selector.parse(config_b),
            min_effect=min_effect,
            alpha=alpha,
        )
        kept = _keep(store, result, min_effect, alpha, one_job=job_b is None)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    finally:
        store.close()
    if as_json:
        kept_id = kept if isinstance(kept, int) else None
        click.echo(json.dumps({**result.to_dict(), "comparison_id": kept_id}, indent=2, default=str))
    else:
        render(result, console())
        if isinstance(kept, int):
            click.echo(f"kept as comparison {kept} (farm jobs show {job_a} lists it)")
        else:
            click.echo(f"not kept: {kept}", err=True)
    if html_path:
        from jobs.report.html import render_compare

        html_path.write_text(render_compare(result))
        click.echo(f"wrote {html_path}", err=True)
    if fail_on_slower and result.verdicts().get("slower"):
        sys.exit(1)


def _keep(store, result, min_effect: float, alpha: float, *, one_job: bool) -> int | str:
    """The comparison kept in the store (its id), or why not: compare is a reading command, and a
    read-only store still answers it."""
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.report.ab import keep
    from jobs.store import store_error

    try:
        return keep(store, result, min_effect=min_effect, alpha=alpha, one_job=one_job)
    except SQLAlchemyError as err:
        return str(store_error(err, store.url))


@click.group("export")
def export() -> None:
    """Export results for other tools."""


@export.command("best-configs")
@click.argument("job", type=int)
@db_option
@output_option("-o", "--output")
@click.option("--backend", default="triton", show_default=True)
@click.option(
    "--split-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="also write one file per (N, K), named as the Triton ports look them up",
)
def export_best_configs(
    job: int, db: str | None, output: Path | None, backend: str, split_dir: Path | None
) -> None:
    """The fastest correct config per (N, K) and M, as Triton ports key their tuned configs."""
    from jobs.report.export import best_configs, best_configs_file

    if output is not None:
        writable_output(output)
    store = store_for(db, create=False)
    require_job(store, job)
    try:
        table, missing = best_configs(store, job, backend)
        envs = store.environments(job)
        device = envs[0].device_name if envs else "unknown"
        files = {nk: best_configs_file(store, job, nk, device) for nk in table} if split_dir else {}
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    finally:
        store.close()
    for m in missing:
        click.echo(f"no correct {backend} config for {m}", err=True)
    text = json.dumps(table, indent=2)
    if output is None:
        click.echo(text)
    else:
        output.write_text(text + "\n")
        click.echo(f"wrote {len(table)} (N, K) entries to {output}", err=True)
    if split_dir is not None:
        split_dir.mkdir(parents=True, exist_ok=True)
        for nk, by_m in table.items():
            (split_dir / files[nk]).write_text(json.dumps(by_m, indent=2) + "\n")
        click.echo(f"wrote {len(table)} files to {split_dir}", err=True)
