"""Gateways the tests serve on 127.0.0.1: an app in the test's own event loop (``ServedGateway``), or
``python -m gateway.ops.cli serve`` as a child process with its output in a log file (``ServeProcess``);
the free ports they take and the port locks a killed one leaves behind."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from gateway.http.app import GATEWAY, Gateway
from gateway.http.startup import port_lock_path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def drop_stale_port_lock(port: int) -> None:
    """A gateway killed with SIGKILL (on purpose, or by ``stop``) leaves its port's lock file: removed after
    the test unless another gateway still holds it (a stopped one removed its own already)."""
    path = port_lock_path("127.0.0.1", port)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        path.unlink(missing_ok=True)
    except BlockingIOError:
        pass  # its gateway still serves
    finally:
        os.close(fd)


@dataclass
class ServedGateway:
    """A gateway app served in this process on ``port``, with the keys made for its projects."""

    app: web.Application
    runner: web.AppRunner
    port: int
    keys: dict[str, str] = field(default_factory=dict)

    @property
    def gw(self) -> Gateway:
        return self.app[GATEWAY]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def create_key(cfg: Path, env: dict[str, str], *args: str, project: str = "alpha") -> str:
    """A key of ``project`` made by ``gateway.ops.cli keys create`` (``args``: more of its options)."""
    made = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.ops.cli", "keys", "create", "--config", str(cfg), "--project", project,
        *args, cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await made.communicate()
    assert made.returncode == 0, err.decode()[-2000:]
    return out.decode().strip().splitlines()[-1]


class ServeProcess:
    """``python -m gateway.ops.cli serve --config CFG --port PORT ARGS...``, its output in ``log``."""

    def __init__(
        self, cfg: Path, log: Path, env: dict[str, str], *args: str, port: int | None = None
    ) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = ["--config", str(cfg), "--port", str(self.port), *args]
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.ops.cli", "serve", *cmd],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"

    async def ready(self, s: aiohttp.ClientSession, timeout: float = 120, *, degraded: bool = True) -> None:
        """Until /readyz answers 200 (``degraded``: "ready" or "degraded"; else "ready" only). The deadline
        only ends a start that will not come: two workers took over 30 s on this machine at load 25."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                async with s.get(self.url + "/readyz") as r:
                    if r.status == 200 and (degraded or (await r.json())["status"] == "ready"):
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"not ready within {timeout:g} s:\n{self.output()[-3000:]}"
            await asyncio.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20) -> None:
        """``sig``, then SIGKILL after ``timeout`` s; the port lock of a killed process is dropped."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        drop_stale_port_lock(self.port)
