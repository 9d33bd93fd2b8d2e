"""What the `farm` commands share: the store a --db names, messages to stderr, common options."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from jobs.errors import InfrastructureError as InfrastructureError  # noqa: PLC0414 - raised by the CLI's verbs
from jobs.errors import NoSuchJob

if TYPE_CHECKING:  # the store (SQLAlchemy) and the settings (pydantic) load when a command opens them
    from jobs.store import Job, Store

STORE_URL = "farm.store_url"  # click context meta: the store the command opened (for error messages)
FILE_FIX = "check that the folder exists and is writable (create it first), or choose another path"


def console() -> Console:
    """The console command output goes to: the terminal's width, or, when the output is piped (a file, a CI
    log) and COLUMNS is not set, 200 columns, so rows are not cut at rich's default of 80."""
    out = Console()
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out = Console(width=200)
    return out


def store_for(db: str | None, *, create: bool) -> Store:
    """The store --db (else FARM_DB, else .farm/farm.db) names. Each command says whether it may create
    it: `create=True` for the commands that write (sweep run and resume, baseline set, ...); a command
    that only reads passes False, and a store that does not exist is then NoSuchStore (exit 2, one line)
    rather than a new, empty store that a mistyped --db would make look like one with no jobs."""
    from jobs.settings import FarmSettings
    from jobs.store import Store

    source = None
    if db is None:
        settings = FarmSettings()
        db, source = settings.db, ("FARM_DB" if "db" in settings.model_fields_set else "the default")
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[STORE_URL] = db
    return Store(db, create=create, source=source)


def require_job(store: Store, job_id: int) -> Job:
    """The job, or NoSuchJob: the same message and exit code (2) from every command."""
    job = store.get_job(job_id)
    if job is None:
        raise NoSuchJob(job_id, store.url)
    return job


def writable_output(path: Path) -> Path:
    """Check before any work that an output file can be written there (its folder exists)."""
    if not path.parent.is_dir():
        raise InfrastructureError(f"cannot write {path}: the folder {path.parent} does not exist; {FILE_FIX}")
    return path


def echo(message: str) -> None:
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


def output_option(*decls: str, help: str | None = None):  # noqa: A002 - click's own name
    """An option naming a file the command writes (not a folder); none given, nothing is written."""
    return click.option(*decls, type=click.Path(dir_okay=False, path_type=Path), default=None, help=help)


def parse_point(text: str | None, what: str) -> dict[str, Any] | None:
    """`m=64,n=128` -> {"m": 64, "n": 128} (YAML scalars: 64 is an int, true a bool); None stays None."""
    if text is None:
        return None
    import yaml

    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or not key.strip() or not raw.strip():
            raise ValueError(f"{what}: expected K=V[,K=V...] (got {part!r} in {text!r})")
        out[key.strip()] = yaml.safe_load(raw.strip())
    return out
