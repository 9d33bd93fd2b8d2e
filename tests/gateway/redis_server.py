"""A redis-server of the tests' own (Debian's ``redis-server``; ``make test`` installs it) on a free port of
127.0.0.1, without persistence (``--save '' --appendonly no``). ``start_server`` raises ``Unavailable``
with the reason when there is none, so the tests that need it skip saying why."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from tests.gateway.serving import free_port


class Unavailable(Exception):
    """No redis-server can be started here (the reason is the message)."""


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, binary: str, workdir: Path, port: int | None = None) -> None:
        self.binary = binary
        self.workdir = workdir
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 10) -> None:
        """Start it (again, on the same port after ``stop``) and wait until it answers PING."""
        log = (self.workdir / "redis.log").open("a")
        cmd = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.workdir), "--protected-mode", "no",
        ]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()
        deadline = time.monotonic() + timeout
        while not _ping(self.port):
            if self.proc.poll() is not None:
                raise Unavailable(f"redis-server exited with {self.proc.returncode}: {self._tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise Unavailable(f"redis-server did not answer within {timeout:g} s: {self._tail()}")
            time.sleep(0.01)

    def stop(self) -> None:
        """SIGTERM (no persistence: Redis comes back empty) and wait until the port is closed."""
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        if self.running:
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait()

    def _tail(self) -> str:
        try:
            return (self.workdir / "redis.log").read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"


def start_server(workdir: Path) -> RedisServer:
    binary = shutil.which("redis-server")  # on PATH only, as every service is found (tests/services.py)
    if binary is None:
        raise Unavailable(
            "redis-server is not installed (Debian: apt-get install redis-server; `make test` installs it)"
        )
    try:
        import redis  # noqa: F401
    except ImportError:
        raise Unavailable("the redis package is not installed (.venv/bin/pip install redis)") from None
    server = RedisServer(binary, workdir)
    server.start()
    return server
