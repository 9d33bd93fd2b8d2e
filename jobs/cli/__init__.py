"""The `farm` command line: one module per verb group, assembled on the `main` group here.

sweep (sweep.py), jobs (jobs.py), report (report.py), compare and export (compare.py), baseline
(baseline.py), accept and failures (accept.py, drafts included), the review of drafts (drafts.py), db
(db.py), and gateway (the gateway's own group, mounted when its package is present).
"""

from __future__ import annotations

import importlib
import traceback

import click

from jobs.errors import BadInput, FarmError, InfrastructureError, StoreError

# name -> (module, attribute, one-line help). A command's module is imported only when the command runs
# (or its own --help is asked): `farm --help` imports neither SQLAlchemy nor the gateway, torch, SciPy or
# Ray. tests/jobs/test_cli_output.py holds each line to the command's own help.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "sweep": ("jobs.cli.sweep", "sweep", "Validate, run and resume sweep jobs."),
    "jobs": ("jobs.cli.jobs", "jobs", "List and inspect stored jobs."),
    "report": ("jobs.cli.report", "report",
               "Per shape and backend: median time, spread, speedup over baseline, throughput, correctness."),
    "baseline": ("jobs.cli.baseline", "baseline", "Name a job as the baseline later jobs are compared to."),
    "accept": ("jobs.cli.accept", "accept_cmd",
               "Judge JOB_ID against its metric card and baseline; exit 1 when an assertion fails."),
    "failures": ("jobs.cli.accept", "failures", "The failure bank: failed assertions kept across jobs."),
    "drafts": ("jobs.cli.drafts", "drafts",
               "Review the drafts of a job's anomalies; promote the accepted ones into the metric card."),
    "db": ("jobs.cli.db", "db_group",
           "The results store's schema (Alembic migrations in jobs/store/migrations)."),
    "compare": ("jobs.cli.compare", "compare",
                "A/B per shape: two tile configs from two jobs, or two configs inside one job."),
    "export": ("jobs.cli.compare", "export", "Export results for other tools."),
    "history": ("jobs.cli.history", "history",
                "Median and spread per job in commit order; change points (E-divisive means) "
                "with their size."),
    "site": ("jobs.cli.site", "site",
             "Write a static site of every job and every kernel's history, which opens offline."),
    "submit": ("jobs.cli.queue", "submit",
               "Queue a sweep for the pool and print its job id at once (`farm jobs wait ID` for the "
               "verdict)."),
    "pool": ("jobs.cli.queue", "pool", "The warm workers that serve the queue of `farm submit`."),
    "bench": ("jobs.cli.bench", "bench",
              "Measure one point of FAMILY in this process and print what the farm would store."),
    # a separate service, mounted only when its package is present
    "gateway": ("gateway.ops.cli", "gateway",
                "The agent gateway: OpenAI and Anthropic endpoints with per-project keys, limits "
                "and a ledger."),
}  # fmt: skip


class _Exit(click.ClickException):
    """One line on stderr ("Error: ...") and the exit code of the error it stands for."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _FarmGroup(click.Group):
    """Every command ends on an error as one line and its documented exit code (jobs/errors.py): bad input
    2 (a FARM_* value, a job that does not exist), infrastructure 4 (the store, the cluster, the file
    system). The traceback is printed only with `farm --debug`. Commands load lazily (COMMANDS)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name in COMMANDS if name != "gateway" or _has_gateway())

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or (name == "gateway" and not _has_gateway()):
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [(name, _shorten(COMMANDS[name][2], limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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


def _shorten(text: str, limit: int) -> str:
    """The line cut at a word to fit `limit` characters, "..." marking the cut (as click shows a command's
    own help)."""
    if len(text) <= limit:
        return text
    cut = text[: max(limit - 3, 1)].rsplit(" ", 1)[0]
    return cut + "..."


def _has_gateway() -> bool:
    import importlib.util

    return importlib.util.find_spec("gateway") is not None


def _as_farm_error(err: Exception, ctx: click.Context) -> FarmError | None:
    from sqlalchemy.exc import SQLAlchemyError

    from jobs.cli.common import FILE_FIX, STORE_URL
    from jobs.settings import FarmSettingsError
    from jobs.store import store_error
    from jobs.store.schema import StoreSchemaError

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
