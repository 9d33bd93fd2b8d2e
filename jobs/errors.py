"""The farm's errors that a command ends on, and the exit code each gives (README, "Exit codes").

    0    every trial passed and the card's assertions hold
    1    a trial failed or an assertion failed: the verdict (never an error of the farm itself)
    2    bad input: a bad spec, card, option or flag value, a job, baseline or store that does not exist
    3    no worker could be kept alive
    4    infrastructure: the store, the cluster or the file system failed (InfrastructureError)
    130  interrupted (the job is resumable)

Hierarchy (a layer raises these at its boundary; the CLI, jobs/cli/__init__.py, turns any FarmError into
its one-line message and exit code, with the traceback only under `farm --debug`):

    FarmError
    +-- BadInput (2)
    |   +-- NoSuchJob (2)
    |   +-- NoSuchStore (2): a command that only reads names a store that does not exist
    +-- InfrastructureError (4)
        +-- StoreError (4): the results store cannot be opened, read or written
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NO_WORKERS = 3
EXIT_INFRASTRUCTURE = 4
EXIT_INTERRUPTED = 130


class FarmError(Exception):
    """An error a command ends on: its message is one line that names the problem and the fix."""

    exit_code = EXIT_FAILED


class BadInput(FarmError):
    exit_code = EXIT_BAD_INPUT


class NoSuchJob(BadInput):
    """The same message and exit code (2) from every command that takes a job id. (Not a LookupError:
    a command's own `except LookupError` must not turn it into another message or code.)"""

    def __init__(self, job_id: int, url: str) -> None:
        from schemakit import display_url  # the store as given, less its password

        where = display_url(url)
        super().__init__(f"no job {job_id} in the farm store {where} (`farm jobs list` shows its jobs)")
        self.job_id = job_id


class NoSuchStore(BadInput):
    """A command that only reads was given a store that does not exist (an SQLite file not there): it is
    never created by reading, so a mistyped --db is not mistaken for an empty store."""

    def __init__(self, url: str, source: str | None = None) -> None:
        from schemakit import display_url  # the store as given, less its password

        given = f" ({source})" if source else ""
        super().__init__(
            f"no farm store at {display_url(url)}{given}: the file does not exist; check --db (or FARM_DB), "
            "or create the store with a command that writes (`farm sweep run`, `farm db upgrade`)"
        )
        self.url = url


class InfrastructureError(FarmError):
    """The store, the cluster (Ray: unreachable, refused auth) or the file system failed: exit 4, so CI
    can tell a broken machine from a slower kernel."""

    exit_code = EXIT_INFRASTRUCTURE


class StoreError(InfrastructureError):
    """The results store cannot be opened, read or written (corrupt, read-only, unknown URL, no driver)."""
