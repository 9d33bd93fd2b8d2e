"""One real PostgreSQL server per test session, shared by every test package (tests/conftest.py's
``postgres`` fixture): the farm's store tests (tests/jobs) and the gateway's (tests/gateway/pg.py builds
its migrated template database on it).

The server comes from Debian's postgresql binaries (/usr/lib/postgresql/<version>/bin, which `make test`
installs through scripts/debian-deps.sh), started as the ``postgres`` user when the tests run as root
(the server refuses root), on 127.0.0.1 with trust authentication and no fsync. Each test makes a fresh
database on it (``create_database``: milliseconds, optionally a copy of a template). Where no server can
be started, ``start_server`` raises ``Unavailable`` with the reason, and the tests that need one skip
with it.

This module is imported as ``pgserver`` (pytest puts tests/ on sys.path for tests/conftest.py); it is
not named ``pg`` because tests/gateway/pg.py already is.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
from pathlib import Path

import services

SUPERUSER = "postgres"


class Unavailable(Exception):
    """Why no PostgreSQL server can be started here (the skip reason)."""


def _bindir() -> Path:
    initdb = services.executable("initdb")  # where every service's executables are looked up
    if initdb:
        return Path(initdb).parent
    raise Unavailable(
        "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb): `make test` installs "
        "Debian's postgresql (scripts/debian-deps.sh), or run `apt-get install postgresql`"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgServer:
    def __init__(self, bindir: Path, root: Path, as_user: str | None) -> None:
        self.bindir = bindir
        self.root = root
        self.data = root / "data"
        self.as_user = as_user  # run the server binaries as this user (we are root), else as ourselves
        self.port = 0
        self._names = itertools.count()

    # --- lifecycle -------------------------------------------------------------------------------
    def _cmd(self, *args: str) -> list[str]:
        cmd = [str(self.bindir / args[0]), *args[1:]]
        return ["runuser", "-u", self.as_user, "--", *cmd] if self.as_user else cmd

    def _check(self, what: str, *args: str, timeout: float = 60) -> None:
        try:
            res = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise Unavailable(f"PostgreSQL {what} failed: {e}") from None
        if res.returncode != 0:
            log = self.root / "server.log"
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            out = (res.stderr or res.stdout).strip()[-800:]
            raise Unavailable(f"PostgreSQL {what} failed (exit {res.returncode}): {out} {tail}".strip())

    def start(self) -> None:
        self._check(
            "initdb",
            "initdb", "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8", "--locale=C",
            "--no-sync", "--no-instructions",
        )  # fmt: skip
        for attempt in range(3):  # the port is free when chosen; another process could take it first
            self.port = _free_port()
            opts = (
                f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=300 "
                "-c shared_buffers=32MB -c timezone=Pacific/Kiritimati "  # not UTC: the engine must set it
                # no background work: the server lives until the session ends, and autovacuum going over
                # dozens of test databases would take CPU from the farm's timing tests that run later
                "-c autovacuum=off"
            )
            try:
                self._check(
                    "start", "pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w",
                    "-t", "30", "-o", opts, "start",
                )  # fmt: skip
                return
            except Unavailable:
                if attempt == 2:
                    raise

    def stop(self) -> None:
        subprocess.run(
            self._cmd("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop"),
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(self.root, ignore_errors=True)

    def processes(self) -> list[int]:
        """The server's processes: the postmaster (its pid file) and its children."""
        try:
            main = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        try:
            children = Path(f"/proc/{main}/task/{main}/children").read_text().split()
        except OSError:
            children = []
        return [main, *(int(c) for c in children)]

    @contextlib.contextmanager
    def frozen(self):
        """The server hung (SIGSTOP to all its processes: connections stay open, nothing answers), then
        resumed (SIGCONT) when the block ends."""
        pids = self.processes()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    # --- databases -------------------------------------------------------------------------------
    @property
    def admin_dsn(self) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/postgres"

    def url(self, database: str, driver: str = "psycopg") -> str:
        """An SQLAlchemy URL of one of this server's databases (``driver``: psycopg, asyncpg)."""
        return f"postgresql+{driver}://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "db", template: str | None = None) -> str:
        """A new, empty database (or a copy of ``template``, which must have no connections); its name."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return name


def _stop_orphans(bindir: Path, as_user: str | None) -> None:
    """Stop the servers of test sessions that were killed before their teardown (pg_ctl's server
    outlives them)."""
    for owner in Path("/tmp").glob("kfpg-*/owner"):
        try:
            os.kill(int(owner.read_text()), 0)
            continue  # its session still runs
        except ProcessLookupError:
            pass
        except (OSError, ValueError):
            continue
        PgServer(bindir, owner.parent, as_user).stop()


def start_server() -> PgServer:
    """Start a server; Unavailable says why not."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise Unavailable("psycopg is not installed (`.venv/bin/pip install 'psycopg[binary]'`)") from None
    bindir = _bindir()
    as_user = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SUPERUSER)
        except KeyError:
            raise Unavailable(
                "running as root and there is no `postgres` user to run the PostgreSQL server as "
                "(Debian's postgresql package creates it)"
            ) from None
        if shutil.which("runuser") is None:
            raise Unavailable(
                "running as root and `runuser` (util-linux) is missing: cannot run the server as postgres"
            )
        as_user = SUPERUSER
    _stop_orphans(bindir, as_user)
    root = Path(tempfile.mkdtemp(prefix="kfpg-", dir="/tmp"))
    (root / "owner").write_text(str(os.getpid()))
    if as_user:
        pw = pwd.getpwnam(as_user)
        os.chown(root, pw.pw_uid, pw.pw_gid)
    server = PgServer(bindir, root, as_user)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server
