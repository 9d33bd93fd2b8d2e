"""The `farm` command line: one module per verb group, assembled on the `main` group here.

sweep (sweep.py), jobs (jobs.py), report (report.py), compare and export (compare.py), baseline
(baseline.py), accept and failures (accept.py, drafts included), db (db.py), and gateway (the gateway's
own group, mounted when its package is present).
"""

from __future__ import annotations

import click

from jobs.cli.accept import accept_cmd, failures
from jobs.cli.baseline import baseline
from jobs.cli.compare import compare, export
from jobs.cli.db import db_group
from jobs.cli.jobs import jobs
from jobs.cli.report import report
from jobs.cli.sweep import sweep
from jobs.settings import FarmSettingsError
from jobs.store.schema import StoreSchemaError


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


main.add_command(sweep, "sweep")
main.add_command(jobs, "jobs")
main.add_command(report, "report")
main.add_command(baseline, "baseline")
main.add_command(accept_cmd, "accept")
main.add_command(failures, "failures")
main.add_command(db_group, "db")
main.add_command(compare, "compare")
main.add_command(export, "export")

# ---- gateway (a separate service; mounted only when its package is present) ----------------------------
try:
    from gateway.cli import gateway as _gateway_group

    main.add_command(_gateway_group, "gateway")
except ImportError:  # the farm runs without the gateway package
    pass
