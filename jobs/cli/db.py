"""`farm db upgrade`: create or migrate the results store's schema."""

from __future__ import annotations

import click

from jobs.cli.common import db_option
from jobs.errors import StoreError
from jobs.settings import FarmSettings


@click.group("db")
def db_group() -> None:
    """The results store's schema (Alembic migrations in jobs/store/migrations)."""


@db_group.command("upgrade")
@db_option
def db_upgrade(db: str | None) -> None:
    """Create or migrate the store's tables to the newest schema.

    Run it once per store after installing a release that changes the schema (commands refuse an
    out-of-date store, naming this command); it adopts a store made before migrations. Safe to re-run,
    and from several hosts at once. A new, empty store needs no command: the first command that writes
    creates it."""
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.store import Base, make_engine
    from jobs.store.schema import display_url, upgrade_schema

    url = db or FarmSettings().db
    engine = make_engine(url, check_schema=False)  # StoreError (exit 4): cannot be opened
    where = display_url(url)
    try:
        before, after = upgrade_schema(engine, Base.metadata, url=url)
    except StoreError:  # StoreSchemaError: a revision this code does not know
        raise
    except (OSError, SQLAlchemyError, RuntimeError) as err:  # RuntimeError: a table it cannot adopt
        raise StoreError(f"cannot upgrade the farm store {where}: {_first_line(err)}") from None
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


_UNITS = {"d": 1, "w": 7}


def parse_age(text: str) -> int:
    """`90d` or `12w` -> days; ValueError naming what is wrong."""
    import re

    found = re.fullmatch(r"\s*(\d+)\s*([dw])\s*", text or "")
    if not found or int(found.group(1)) == 0:
        raise ValueError(
            f"--samples-older-than: expected a number of days or weeks such as 90d or 12w (got {text!r})"
        )
    return int(found.group(1)) * _UNITS[found.group(2)]


@db_group.command("prune")
@db_option
@click.option("--samples-older-than", "age", required=True, help="e.g. 90d or 12w: jobs created before then")
@click.option("--apply", is_flag=True, help="delete them (without it: only say what would be freed)")
def db_prune(db: str | None, age: str, apply: bool) -> None:
    """Free the raw samples of old jobs, keeping every trial's summary (median, spread, quantiles) and the
    samples of baselines' trials and of confirmation jobs. A dry run unless --apply."""
    from datetime import timedelta

    from jobs.cli.common import store_for
    from jobs.store import now

    try:
        days = parse_age(age)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    before = now() - timedelta(days=days)
    store = store_for(db, create=False)
    try:
        pruned = store.prune_samples(before, apply=apply)
        sqlite = store.engine.dialect.name == "sqlite"
    finally:
        store.close()
    what = (
        f"the samples of {pruned.trials:,} trials ({pruned.values:,} values, "
        f"{pruned.bytes:,} bytes of arrays) of jobs created before {before:%Y-%m-%d %H:%M} UTC"
    )
    kept = "summaries, baselines' and confirmations' samples kept"
    if not apply:
        click.echo(f"would free {what}; {kept}. Run again with --apply to delete them.")
        return
    click.echo(
        f"freed {what}; {kept}."
        + (" The file shrinks after `sqlite3 FILE 'VACUUM'`." if sqlite and pruned.trials else "")
    )
