"""Two real gateway processes (``python -m gateway.ops.cli serve``) sharing one Redis and one database
(SQLite,
and PostgreSQL where a server can be started): the
project's concurrency cap holds across them at the upstream, and slots held by a process that is then
SIGKILLed come free within the lease time (``redis_lease_s``), without any release from it."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml
from pg import DB_BACKENDS

from testkit.gateway.fake_upstream import FakeUpstream, Fault
from tests.gateway.http.test_workers import drop_stale_port_lock

ROOT = Path(__file__).resolve().parents[3]
SECRET = "shared-secret-0123456789abcdef"
LEASE_S = 1.0
MSGS = [{"role": "user", "content": "hi"}]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-3000:]
    except OSError:
        return "(no log)"


class _Gateway:
    def __init__(self, cfg: Path, env: dict[str, str], work: Path, name: str) -> None:
        self.port = _free_port()
        self.log = work / f"{name}.log"
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable,
            "-m",
            "gateway.ops.cli",
            "serve",
            "--config",
            str(cfg),
            "--port",
            str(self.port),
        ]
        env = {**env, "FARM_GATEWAY_LEDGER_SPOOL_DIR": str(work / f"{name}-spool")}
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)

    async def ready(self, s: aiohttp.ClientSession, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{_tail(self.log)}")
            try:
                async with s.get(self.url + "/readyz") as r:
                    if r.status == 200 and (await r.json())["status"] == "ready":
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, f"gateway not ready within {timeout:g} s:\n{_tail(self.log)}"
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        drop_stale_port_lock(self.port)  # left by a SIGKILLed process


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


@pytest.mark.slow
async def test_two_processes_share_the_concurrency_cap_and_a_killed_one_frees_its_slots(
    redis_server, tmp_path, db_url
):
    fake = FakeUpstream()
    await fake.start()
    gateways: list[_Gateway] = []
    try:
        cfg = {
            "host": "127.0.0.1",
            "database_url": db_url,  # one SQLite file, or one PostgreSQL database, for both processes
            "providers": {"oa": {"kind": "openai", "base_url": fake.base_url, "read_timeout_s": 30}},
            "models": {"gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"}},
            "projects": {"alpha": {"models": ["gpt-fake"], "max_concurrency": 2, "queue_timeout_s": 0.3}},
            "retry": {"max_retries": 0},
            "redis_url": redis_server.url,
            "redis_key_prefix": f"p{uuid.uuid4().hex[:12]}",
            "redis_lease_s": LEASE_S,
        }
        cfg_path = tmp_path / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_GATEWAY_")}
        env |= {"PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": SECRET}
        made = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway.ops.cli", "keys", "create", "--config", str(cfg_path),
            "--project", "alpha", "--name", "shared",
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await made.communicate()
        assert made.returncode == 0, err.decode()[-2000:]
        key = out.decode().strip().splitlines()[-1]
        gateways = [_Gateway(cfg_path, env, tmp_path, name) for name in ("gw1", "gw2")]
        one, two = gateways
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            await asyncio.gather(one.ready(s), two.ready(s))

            async def chat(g: _Gateway) -> int:
                async with s.post(
                    g.url + "/v1/chat/completions",
                    json={"model": "gpt-fake", "messages": MSGS},
                    headers=headers,
                ) as r:
                    await r.read()
                    return r.status

            # a burst through both processes: at most 2 at once at the upstream, the rest wait their turn
            cfg_queue = 0.3
            fake.latency_s = 0.05
            statuses = await asyncio.gather(*(chat((one, two)[i % 2]) for i in range(6)))
            assert fake.max_in_flight == 2
            assert statuses.count(200) >= 2 and set(statuses) <= {200, 429}
            fake.latency_s = 0.0

            # process one holds both slots (its requests stall at the upstream) ...
            fake.faults += [Fault(stall_before_headers=True), Fault(stall_before_headers=True)]
            held = [asyncio.create_task(chat(one)) for _ in range(2)]
            deadline = time.monotonic() + 10
            while fake.in_flight < 2:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)
            assert await chat(two) == 429  # ... so process two is refused after its queue wait
            # ... and is SIGKILLed: its leases are not renewed and expire within the lease time
            one.proc.send_signal(signal.SIGKILL)
            one.proc.wait()
            killed = time.perf_counter()
            while (status := await chat(two)) != 200:
                assert status == 429
                assert time.perf_counter() - killed < LEASE_S + 2, "the dead process's slots were never freed"
            freed_after = time.perf_counter() - killed
            print(f"slots freed {freed_after:.2f} s after the SIGKILL")
            assert freed_after <= LEASE_S + cfg_queue + 0.3, freed_after
            await asyncio.gather(*held, return_exceptions=True)
    finally:
        for g in gateways:
            g.stop()
        await fake.close()
