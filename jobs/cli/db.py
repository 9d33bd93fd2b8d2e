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
