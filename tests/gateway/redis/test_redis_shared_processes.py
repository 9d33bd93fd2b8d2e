"""Two real gateway processes (``python -m gateway.ops.cli serve``) sharing one Redis and one database
(SQLite,
and PostgreSQL where a server can be started): the
project's concurrency cap holds across them at the upstream, and slots held by a process that is then
SIGKILLed come free within the lease time (``redis_lease_s``), without any release from it."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml
from pg import DB_BACKENDS

from testkit.gateway.fake_upstream import FakeUpstream, Fault
from tests.gateway.serving import ROOT, ServeProcess, create_key
from tests.gateway.shared_redis import REDIS_TIMEOUT_S

SECRET = "shared-secret-0123456789abcdef"
LEASE_S = 1.0
MSGS = [{"role": "user", "content": "hi"}]


def _gateway(cfg: Path, env: dict[str, str], work: Path, name: str) -> ServeProcess:
    env = {**env, "FARM_GATEWAY_LEDGER_SPOOL_DIR": str(work / f"{name}-spool")}
    return ServeProcess(cfg, work / f"{name}.log", env)


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


@pytest.mark.slow
async def test_two_processes_share_the_concurrency_cap_and_a_killed_one_frees_its_slots(
    redis_server, tmp_path, db_url
):
    fake = FakeUpstream()
    await fake.start()
    gateways: list[ServeProcess] = []
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
            "redis_timeout_s": REDIS_TIMEOUT_S,
        }
        cfg_path = tmp_path / "gateway.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_GATEWAY_")}
        env |= {"PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": SECRET}
        key = await create_key(cfg_path, env, "--name", "shared")
        gateways = [_gateway(cfg_path, env, tmp_path, name) for name in ("gw1", "gw2")]
        one, two = gateways
        headers = {"Authorization": f"Bearer {key}"}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            await asyncio.gather(*(g.ready(s, 60, degraded=False) for g in gateways))

            async def chat(g: ServeProcess) -> int:
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
            g.stop(signal.SIGINT, 15)
        await fake.close()
