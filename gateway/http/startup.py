"""What ``farm gateway serve`` checks before it serves, so that a bad setup is refused at once in one line
(gateway.config.StartupError: exit 2 for the configuration, 4 for infrastructure), not found by the first
request or left as a traceback:

- ``hold_port_lock``: no other gateway serves this host and port. Workers share a port through
  ``SO_REUSEPORT``, so a second supervisor could bind it too and the kernel would spread connections over
  both; a lock file per (host, port), held for the life of the process that serves it, tells them apart;
- ``check_dependencies``: the database answers within ``database_connect_timeout_s`` with the current
  schema, and Redis answers at ``redis_url`` (unless ``redis_start_degraded``);
- ``metrics_folder``: the supervisor's Prometheus folder, with its owner's lock inside, so that the next
  supervisor removes the folders of dead ones (``sweep_metrics_folders``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import os
import re
import shutil
import tempfile
from pathlib import Path

from gateway.config import GatewaySettings, UnavailableError
from gateway.store.db import create_engine, database_problem, display_url, ensure_ready, first_line

METRICS_PREFIX = "farm-gateway-metrics-"
_OWNER = ".owner.lock"  # inside a metrics folder: locked by the supervisor that made it
_held: list[int] = []  # descriptors of the locks held for the life of the process


def _lock(path: Path) -> int | None:
    """An exclusive lock on ``path`` (created), held until the process ends; None when another holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


# --- the port ----------------------------------------------------------------------------------------------
def port_lock_path(host: str, port: int) -> Path:
    safe = re.sub(r"[^A-Za-z0-9.]", "_", host)
    return Path(tempfile.gettempdir()) / f"farm-gateway-{safe}-{port}.lock"


def hold_port_lock(host: str, port: int) -> None:
    """Refuse (UnavailableError) when another gateway on this machine serves ``host``:``port``; else hold
    the port's lock until this process ends (a killed process lets it go with it). Port 0 (a free port
    chosen at bind) needs none."""
    if port == 0:
        return
    path = port_lock_path(host, port)
    while True:
        fd = _lock(path)
        if fd is None:
            try:
                holder = path.read_text().strip()
            except OSError:
                holder = ""
            who = f" (pid {holder})" if holder.isdigit() else ""
            raise UnavailableError(
                f"another gateway{who} already serves {host}:{port} (lock {path}): stop it, or choose "
                "another port with --port"
            )
        try:  # the file is still the one at the path (its last holder removes it as it exits)?
            if os.fstat(fd).st_ino == path.stat().st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _held.append(fd)
    atexit.register(_remove_while_held, path)  # a killed process leaves the file: the next one reuses it


def _remove_while_held(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


# --- the dependencies --------------------------------------------------------------------------------------
async def check_dependencies(settings: GatewaySettings) -> None:
    """The database answers with the current schema, and Redis answers; else a StartupError of one line."""
    try:
        engine = create_engine(settings.database_url)
    except Exception as e:  # a driver package that is not installed
        problem = database_problem(e, settings.database_url)
        if problem is None:
            raise
        raise problem from e
    try:
        await ensure_ready(engine, settings.database_url, settings.database_connect_timeout_s)
    finally:
        await engine.dispose()
    if settings.redis_url and not settings.redis_start_degraded:
        await _ping_redis(settings)
    _check_spool_dir(settings)


def _check_spool_dir(settings: GatewaySettings) -> None:
    """The ledger's spool folder exists or can be made (else every row would be a traceback at start)."""
    from gateway.store.spool import default_spool_dir

    spool = Path(settings.ledger_spool_dir or default_spool_dir(settings.database_url))
    try:
        spool.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UnavailableError(
            f"cannot make the ledger's spool folder {spool} (ledger_spool_dir): {e.strerror or e}; check "
            "that its parent exists and is writable, or fix ledger_spool_dir"
        ) from None


async def _ping_redis(settings: GatewaySettings) -> None:
    import redis.asyncio as aredis
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff
    from redis.exceptions import RedisError

    assert settings.redis_url is not None
    deadline = max(1.0, settings.redis_timeout_s)
    client = aredis.from_url(
        settings.redis_url,
        socket_connect_timeout=deadline,
        socket_timeout=deadline,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        async with asyncio.timeout(deadline):
            await client.ping()
    except (RedisError, OSError, TimeoutError) as e:
        why = first_line(e)
        raise UnavailableError(
            f"nothing answers at redis_url {display_url(settings.redis_url)} within {deadline:g} s ({why}): "
            "start Redis or fix redis_url; to start anyway, each process on its share of the limits until "
            "Redis answers, set redis_start_degraded: true"
        ) from None
    finally:
        await client.aclose()


# --- the supervisor's metrics folders ----------------------------------------------------------------------
def sweep_metrics_folders() -> list[Path]:
    """Remove the metrics folders whose supervisor is gone (its lock is free); the removed ones."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(METRICS_PREFIX + "*"):
        owner = folder / _OWNER
        if not folder.is_dir() or not owner.exists():
            continue  # not one of ours, or one being made right now
        fd = _lock(owner)
        if fd is None:
            continue  # its supervisor is alive
        try:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def metrics_folder() -> str:
    """A fresh metrics folder owned (locked) by this process for its life."""
    folder = tempfile.mkdtemp(prefix=METRICS_PREFIX)
    fd = _lock(Path(folder) / _OWNER)
    assert fd is not None  # a fresh folder
    _held.append(fd)
    return folder
