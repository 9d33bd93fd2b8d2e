"""``farm gateway serve --workers N``: N gateway processes on one port, supervised by this one.

Each worker is a whole gateway (``gateway.http.app.run_one``) in a process of its own (``multiprocessing``,
spawn: nothing is inherited but the settings), listening with ``SO_REUSEPORT`` on the same address, so the
kernel spreads new connections over the workers. They share the limits, key revocations and summaries
cache through Redis (``redis_url``, required: without it each worker would enforce every limit on its
own, N times the configured rates), the database, and the ledger spool folder (each process writes
segments of its own, locked with ``flock``; a dead worker's are replayed by the next start).

The supervisor (the process that ran ``serve``) reserves the port (a bound ``SO_REUSEPORT`` socket that
never listens), starts worker 0 and, once it is ready (schema and secret settled), the others. A worker
that dies is logged with its exit status and restarted (at once when it had run 10 s or more, else after
a backoff doubling from 0.5 s to 30 s); one that fails before any worker was ever ready stops the whole
start (a config or schema error would only repeat). SIGTERM or SIGINT to the supervisor sends SIGTERM to
each worker (which finishes its requests and flushes its ledger) and waits for all of them. Workers sit in
a process group of their own, so a terminal's Ctrl-C reaches them once, through the supervisor, and they
get SIGTERM from the kernel should the supervisor itself die (``PR_SET_PDEATHSIG``).

Metrics: the supervisor points ``PROMETHEUS_MULTIPROC_DIR`` at a fresh folder of its own; every worker
writes its metrics there (prometheus_client's multiprocess mode) and any worker's ``/metrics`` serves the
sum over all of them (gateway.core.metrics). A dead worker's live gauges are removed (``mark_process_dead``);
its counters stay, so totals never go backwards. The folder is removed when the supervisor stops, and a
killed supervisor's by the next one to start (gateway.http.startup).

Also here: the database lock of ``serve`` (``hold_database_lock``): a process without ``redis_url`` takes
an exclusive ``flock`` on ``<SQLite file>.lock`` for its life, one with it a shared one, so a second
process on the same SQLite file without Redis is refused, naming ``redis_url``.

Nothing here imports prometheus_client or gateway.http.app at module level: a spawned worker must set up its
metrics folder before prometheus_client is first imported.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from gateway.config import (
    EXIT_CONFIG,
    EXIT_UNAVAILABLE,
    ConfigError,
    GatewaySettings,
    StartupError,
    UnavailableError,
)
from gateway.http.startup import check_dependencies, hold_port_lock, metrics_folder, sweep_metrics_folders

if TYPE_CHECKING:
    from collections.abc import Callable
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

log = logging.getLogger("gateway.http.workers")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
STOP_TIMEOUT_S = 60.0  # how long the supervisor waits for its workers to stop before SIGKILL
HEALTHY_RUN_S = 10.0  # a worker that ran this long is restarted at once
BACKOFF_S = (0.5, 30.0)  # first and longest wait before restarting a worker that died young
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_held_locks: list[int] = []  # descriptors of database locks held for the life of the process


# --- the database lock -----------------------------------------------------------------------------------
def sqlite_file(database_url: str) -> Path | None:
    """The SQLite file of a database URL, or None (another database, in memory, a ``file:`` URI)."""
    try:
        u = make_url(database_url)
    except Exception:
        return None
    db = u.database
    if u.get_backend_name() != "sqlite" or not db or db == ":memory:" or db.startswith("file:"):
        return None
    return Path(db)


def hold_database_lock(settings: GatewaySettings) -> Path | None:
    """Take the lock of a serving process on its SQLite database, for the life of the process: exclusive
    without ``redis_url`` (limits of this process alone), shared with it. Raises ConfigError naming
    ``redis_url`` when another process holds it the other way. Returns the lock file (None: no SQLite)."""
    db = sqlite_file(settings.database_url)
    if db is None:
        return None
    exclusive = not settings.redis_url
    lock = db.with_name(db.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_pid(fd)
        os.close(fd)
        who = f" (pid {holder})" if holder else ""
        if exclusive:
            raise ConfigError(
                f"another gateway process{who} is serving the database {db} (lock {lock}): without "
                f"redis_url only one process may serve it, since each would enforce every project limit on "
                f"its own; set redis_url (shared limits) to run several processes or hosts on one database"
            ) from None
        raise ConfigError(
            f"a gateway process without redis_url{who} is serving the database {db} (lock {lock}) with "
            f"limits of its own; stop it, or give it the same redis_url, before starting this one"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    if exclusive:  # the holder's pid, for the message of whoever is refused
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held_locks.append(fd)
    return lock


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None


# --- the supervisor --------------------------------------------------------------------------------------
def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


def reserve_port(host: str, port: int) -> socket.socket:
    """A bound, never listening ``SO_REUSEPORT`` socket on (host, port): fails at once when the port is
    taken by anything else, holds it between worker restarts, and resolves port 0 to a free one."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        raise UnavailableError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


@dataclass
class _Worker:
    index: int
    proc: BaseProcess | None = None
    ready_conn: Connection | None = None
    started: float = 0.0
    ready: bool = False
    failures: int = 0  # deaths in a row that came soon after a start
    restart_at: float | None = None  # when a dead worker is started again
    pids: list[int] = field(default_factory=list)


class Supervisor:
    def __init__(self, settings: GatewaySettings, host: str, port: int, workers: int) -> None:
        import multiprocessing

        self.settings = settings
        self.host = host
        self.port = port
        self.ctx = multiprocessing.get_context("spawn")
        self.workers = [_Worker(i) for i in range(workers)]
        self.metrics_dir = ""
        self.stopping = False
        self.any_ready = False
        self.exit_code = 0

    # signals: set a flag; the loop below polls it every 0.2 s
    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping:
            log.info("supervisor: %s again; still waiting for the workers", signal.Signals(signum).name)
            return
        log.info("supervisor: %s: stopping %d workers", signal.Signals(signum).name, len(self.workers))
        self.stopping = True

    def run(self) -> int:
        reserved = reserve_port(self.host, self.port)
        self.port = reserved.getsockname()[1]
        for stale in sweep_metrics_folders():  # left by supervisors that were killed
            log.info("supervisor: removed the metrics folder %s of a supervisor that is gone", stale)
        self.metrics_dir = metrics_folder()
        os.environ[MULTIPROC_ENV] = self.metrics_dir  # inherited by every worker spawned from here
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            log.info(
                "supervisor (pid %d): %d workers on %s:%d, shared state %s, metrics in %s",
                os.getpid(), len(self.workers), self.host, self.port, self.settings.redis_url,
                self.metrics_dir,
            )  # fmt: skip
            self._start(self.workers[0])
            self._loop()
        finally:
            self._stop_all()
            for s, h in old.items():
                signal.signal(s, h)
            reserved.close()
            os.environ.pop(MULTIPROC_ENV, None)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return self.exit_code

    def _start(self, w: _Worker) -> None:
        reader, writer = self.ctx.Pipe(duplex=False)
        level = logging.getLogger().getEffectiveLevel()
        proc = self.ctx.Process(
            target=worker_main,
            args=(self.settings, self.host, self.port, w.index, len(self.workers), writer, level),
            name=f"gateway-worker-{w.index}",
        )
        proc.start()
        writer.close()
        w.proc, w.ready_conn, w.started, w.ready, w.restart_at = proc, reader, time.monotonic(), False, None
        assert proc.pid is not None
        w.pids.append(proc.pid)
        log.info("supervisor: worker %d started (pid %d)", w.index, proc.pid)

    def _loop(self) -> None:
        from multiprocessing.connection import wait

        while not self.stopping:
            waiting: list[Any] = []
            for w in self.workers:
                if w.proc is not None:
                    waiting.append(w.proc.sentinel)
                    if not w.ready and w.ready_conn is not None:
                        waiting.append(w.ready_conn)
            wait(waiting, timeout=0.2)
            now = time.monotonic()
            for w in self.workers:
                if w.proc is not None and not w.ready and w.ready_conn is not None and w.ready_conn.poll():
                    with contextlib.suppress(EOFError, OSError):
                        w.ready_conn.recv()
                        w.ready = True
                        log.info("supervisor: worker %d (pid %d) is ready", w.index, w.proc.pid)
                        if not self.any_ready:  # schema and secret settled: start the others
                            self.any_ready = True
                            for other in self.workers[1:]:
                                if other.proc is None and other.restart_at is None:
                                    self._start(other)
                if w.proc is not None and not w.proc.is_alive():
                    if not self._reap(w, now):
                        return
                elif w.proc is None and w.restart_at is not None and now >= w.restart_at:
                    self._start(w)

    def _reap(self, w: _Worker, now: float) -> bool:
        """A worker died: log it and plan its restart. False: give up (nothing ever started)."""
        assert w.proc is not None
        proc, ran = w.proc, now - w.started
        proc.join()
        code = proc.exitcode
        self._forget(w)
        if not self.any_ready:
            log.error(
                "supervisor: worker %d (pid %d) %s before it was ready (its error is above); stopping",
                w.index, proc.pid, describe_exit(code),
            )  # fmt: skip
            # a refused start (gateway.config.StartupError) keeps its status: 2 configuration, 4 the rest
            self.exit_code = code if code in (EXIT_CONFIG, EXIT_UNAVAILABLE) else 1
            return False
        w.failures = 0 if ran >= HEALTHY_RUN_S else w.failures + 1
        delay = 0.0 if w.failures == 0 else min(BACKOFF_S[0] * 2 ** (w.failures - 1), BACKOFF_S[1])
        w.restart_at = now + delay
        log.error(
            "supervisor: worker %d (pid %d) %s after %.1f s; restarting it%s",
            w.index, proc.pid, describe_exit(code), ran, f" in {delay:g} s" if delay else "",
        )  # fmt: skip
        return True

    def _forget(self, w: _Worker) -> None:
        from prometheus_client.multiprocess import mark_process_dead

        if w.proc is not None and w.proc.pid is not None and self.metrics_dir:
            mark_process_dead(w.proc.pid, self.metrics_dir)  # its live gauges go; its counters stay
        if w.ready_conn is not None:
            w.ready_conn.close()
        w.proc, w.ready_conn, w.ready = None, None, False

    def _stop_all(self) -> None:
        alive = [w for w in self.workers if w.proc is not None and w.proc.is_alive()]
        for w in alive:
            assert w.proc is not None and w.proc.pid is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(w.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for w in self.workers:
            if w.proc is None:
                continue
            w.proc.join(max(0.0, deadline - time.monotonic()))
            if w.proc.is_alive():
                log.error("supervisor: worker %d (pid %d) did not stop in time: SIGKILL", w.index, w.proc.pid)
                w.proc.kill()
                w.proc.join()
            log.info("supervisor: worker %d (pid %d) %s", w.index, w.proc.pid, describe_exit(w.proc.exitcode))
            self._forget(w)
        log.info("supervisor: stopped")


def check_workers(settings: GatewaySettings, workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, not {workers}")
    if workers > 1 and not settings.redis_url:
        raise ConfigError(
            f"--workers {workers} needs redis_url: without shared state each worker process would enforce "
            f"every project limit (concurrency, rpm, tpm, daily budget) on its own, {workers} times the "
            f"configured amounts; set redis_url (or FARM_GATEWAY_REDIS_URL) or run one worker"
        )


def supervise(settings: GatewaySettings, host: str | None, port: int | None, workers: int) -> int:
    """Run ``workers`` gateway processes on one port until SIGTERM/SIGINT; returns the exit status."""
    check_workers(settings, workers)
    hold_database_lock(settings)  # shared (redis_url is set): refused while a Redis-less process serves it
    return Supervisor(
        settings, host or settings.host, port if port is not None else settings.port, workers
    ).run()


# --- a worker --------------------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """SIGTERM when the supervisor dies (Linux); elsewhere nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def worker_main(
    settings: GatewaySettings,
    host: str,
    port: int,
    index: int,
    count: int,
    ready: Connection,
    log_level: int = logging.INFO,
) -> None:
    """The body of one worker process (spawned by the supervisor)."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # out of the terminal's process group: Ctrl-C comes once, from the supervisor
    _die_with_parent()
    if os.getppid() == 1:  # the supervisor died before the line above
        return
    logging.basicConfig(level=log_level, format=f"%(asctime)s %(levelname)s %(name)s [w{index}]: %(message)s")
    from gateway.http.app import run_one  # after PROMETHEUS_MULTIPROC_DIR is in the environment

    def on_ready() -> None:
        with contextlib.suppress(OSError):
            ready.send(os.getpid())
            ready.close()

    try:
        run_one(settings, host, port, reuse_port=True, worker=(index, count), on_ready=on_ready)
    except StartupError as e:  # e.g. a schema the database lacks: one line, and the supervisor stops
        log.error("%s", e)
        raise SystemExit(e.exit_code) from None


def serve(
    settings: GatewaySettings,
    host: str | None = None,
    port: int | None = None,
    *,
    workers: int = 1,
    on_checked: Callable[[], None] | None = None,
) -> int:
    """Run the gateway until interrupted (graceful stop flushes the ledger); returns the exit status.

    ``workers`` > 1: that many processes on one port under a supervisor (``supervise`` below; needs
    ``redis_url``). One process without ``redis_url`` holds an exclusive lock on its SQLite database for its
    life, so a second one on the same file is refused (each would enforce the limits on its own). A bad
    setup raises a StartupError before anything starts; ``on_checked`` runs once the checks have passed."""
    from gateway.http.app import run_one  # imports the whole app: not at module level (see above)

    host = host or settings.host
    port = port if port is not None else settings.port
    # Refused in one line before anything starts (gateway.http.startup): the configuration first, then
    # what it names (ConfigError exits 2, UnavailableError 4)
    check_workers(settings, workers)
    hold_port_lock(host, port)  # another gateway on this port, with --workers or not
    asyncio.run(check_dependencies(settings))  # the database (and its schema) and Redis answer
    if on_checked is not None:
        on_checked()
    if workers != 1:
        return supervise(settings, host, port, workers)
    hold_database_lock(settings)  # ConfigError naming redis_url when another process serves the database
    run_one(settings, host, port)
    return 0
