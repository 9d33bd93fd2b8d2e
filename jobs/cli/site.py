"""`farm site -o DIR`: the store as a static site (index with sparklines, kernel history pages, job pages,
the token account of the drafts, read from the gateway's ledger with FARM_GATEWAY_KEY when set)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from jobs.cli.common import db_option, echo, store_for
from jobs.history.series import DEFAULT_LAST


@click.command("site")
@db_option
@click.option(
    "-o", "--output", type=click.Path(file_okay=False, path_type=Path), required=True, help="folder to write"
)
@click.option(
    "--full", is_flag=True, help="rewrite every page (default: only what changed since the last build)"
)
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=DEFAULT_LAST,
    show_default=True,
    help="the newest N jobs of each kernel a kernel page shows (as farm history)",
)
def site(db: str | None, output: Path, full: bool, last: int) -> None:
    """Write a static site of every job and every kernel's history, which opens offline. Into a folder it
    built before, only the pages of new or changed jobs and of the kernels they ran are written again."""
    from jobs.drafts.account import build_account
    from jobs.report.site import build_site

    store = store_for(db, create=False)
    try:
        start = time.perf_counter()
        account = build_account(store)
        if account.note:
            echo(f"token account: {account.note}")
        result = build_site(store, output, account, full=full, last=last)
    finally:
        store.close()
    echo(
        f"wrote {result.pages} pages ({result.kernels} kernels, {result.jobs} jobs) to {output} "
        f"in {time.perf_counter() - start:.1f} s; open {output / 'index.html'}"
    )
