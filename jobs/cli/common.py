"""What the `farm` commands share: the store a --db names, messages to stderr, common options."""

from __future__ import annotations

import click

from jobs.settings import FarmSettings
from jobs.store.repository import Store


def store_for(db: str | None) -> Store:
    return Store(db or FarmSettings().db)


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
