"""The `farm` command line: one module per verb group, assembled on the `main` group here.

sweep (sweep.py), jobs (jobs.py), report (report.py), compare and export (compare.py), baseline
(baseline.py), accept and failures (accept.py, drafts included), db (db.py), and gateway (the gateway's
own group, mounted when its package is present).
"""

from __future__ import annotations

import traceback

import click

from jobs.cli.accept import accept_cmd, failures
from jobs.cli.baseline import baseline
from jobs.cli.bench import bench
from jobs.cli.compare import compare, export
from jobs.cli.db import db_group
from jobs.cli.history import history
from jobs.cli.jobs import jobs
from jobs.cli.report import report
from jobs.cli.site import site
from jobs.cli.sweep import sweep
from jobs.errors import BadInput, FarmError, InfrastructureError, StoreError
from jobs.settings import FarmSettingsError
from jobs.store.schema import StoreSchemaError


class _Exit(click.ClickException):
    """One line on stderr ("Error: ...") and the exit code of the error it stands for."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _FarmGroup(click.Group):
    """Every command ends on an error as one line and its documented exit code (jobs/errors.py): bad input
    2 (a FARM_* value, a job that does not exist), infrastructure 4 (the store, the cluster, the file
    system). The traceback is printed only with `farm --debug`."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort, KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:  # noqa: BLE001 - every other error is translated here, at the CLI's edge
            farm_err = _as_farm_error(err, ctx)
            if farm_err is None:
                raise
            if ctx.params.get("debug"):
                traceback.print_exc()
            raise _Exit(str(farm_err), farm_err.exit_code) from None


def _as_farm_error(err: Exception, ctx: click.Context) -> FarmError | None:
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.cli.common import FILE_FIX, STORE_URL
    from jobs.store.repository import store_error

    if isinstance(err, FarmError):
        return err
    if isinstance(err, FarmSettingsError):
        return BadInput(str(err))
    if isinstance(err, StoreSchemaError):
        return StoreError(str(err))
    if isinstance(err, SQLAlchemyError):
        return store_error(err, ctx.meta.get(STORE_URL, "?"))
    if isinstance(err, OSError):
        where = f" {err.filename}" if err.filename else ""
        return InfrastructureError(f"cannot use{where}: {err.strerror or err}; {FILE_FIX}")
    return None


@click.group(cls=_FarmGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="print the traceback of an error, not only its one line")
def main(debug: bool) -> None:  # noqa: ARG001 - read by _FarmGroup from the context
    """KernelFarm: sweep GPU kernels over a Ray cluster, store every sample, report and judge.

    Exit codes: 0 passed, 1 a trial or an assertion failed, 2 bad input, 3 no worker could be kept
    alive, 4 infrastructure (store, cluster, file system), 130 interrupted."""


main.add_command(sweep, "sweep")
main.add_command(jobs, "jobs")
main.add_command(report, "report")
main.add_command(baseline, "baseline")
main.add_command(accept_cmd, "accept")
main.add_command(failures, "failures")
main.add_command(db_group, "db")
main.add_command(compare, "compare")
main.add_command(export, "export")
main.add_command(history, "history")
main.add_command(site, "site")
main.add_command(bench, "bench")

# ---- gateway (a separate service; mounted only when its package is present) ----------------------------
try:
    from gateway.ops.cli import gateway as _gateway_group

    main.add_command(_gateway_group, "gateway")
except ImportError:  # the farm runs without the gateway package
    pass
