"""CPU per request of the limits: in-process (``gateway.limits.local.Limits``) against shared through Redis
(``gateway.limits.redis.SharedLimits``, a redis-server of its own on a free port of 127.0.0.1).

One request is ``admit`` + ``release`` + ``settle`` on a project with every limit set (concurrency, rpm,
tpm and the daily budget, all far above what the run uses), so the whole admission and settlement scripts
run. ``time.process_time`` of this process only (Redis' own CPU is not the gateway's), including sending
the last settlements (``SharedState.stop``). Concurrency 1 and 16 (tasks each running requests one after
another), uvloop when installed. Target: at most 150 us of gateway CPU per request for shared limits.

    .venv/bin/python -m benchmarks.shared_limits_bench [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from gateway.config import GatewaySettings
from gateway.limits.local import Limits

TARGET_US = 150.0
PROJECT = {
    "models": ["m"],
    "max_concurrency": 1000,
    "rpm": 10_000_000,
    "tpm": 1_000_000_000,
    "daily_token_budget": 1_000_000_000_000,
    "queue_timeout_s": 5,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(url: str | None) -> GatewaySettings:
    return GatewaySettings(
        providers={"oa": {"kind": "openai", "base_url": "http://127.0.0.1:9"}},
        models={"m": {"provider": "oa", "upstream_model": "m"}},
        projects={"alpha": PROJECT},
        redis_url=url,
        redis_key_prefix=f"bench{uuid.uuid4().hex[:8]}",
    )


async def _requests(limits, n: int, concurrency: int) -> None:
    pl = limits["alpha"]

    async def worker(count: int) -> None:
        for _ in range(count):
            adm = await pl.admit(16, 20)
            adm.release()
            adm.settle(30)

    await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))


async def _local(n: int, concurrency: int) -> float:
    limits = Limits(_settings(None).projects)
    await _requests(limits, 200, concurrency)  # warm-up
    t0 = time.process_time()
    await _requests(limits, n, concurrency)
    return (time.process_time() - t0) / n * 1e6


async def _shared(url: str, n: int, concurrency: int) -> tuple[float, float]:
    from gateway.core.record import DayUsage
    from gateway.limits.redis import SharedLimits
    from gateway.redis.state import SharedState

    async def seed() -> DayUsage:
        return DayUsage({}, {}, [])

    settings = _settings(url)
    shared = SharedState(settings)
    limits = SharedLimits(shared, settings.projects, seed_source=seed)
    await shared.start()
    assert shared.up, shared.status()
    await _requests(limits, 200, concurrency)  # warm-up: scripts loaded, the day seeded
    t0, w0 = time.process_time(), time.perf_counter()
    await _requests(limits, n, concurrency)
    await shared.stop()  # the last settlements are answered
    cpu, wall = time.process_time() - t0, time.perf_counter() - w0
    assert shared.fallback_admissions == 0
    return cpu / n * 1e6, wall / n * 1e6


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=4000)
    args = ap.parse_args(argv)
    binary = shutil.which("redis-server")
    if binary is None:
        print("redis-server is not installed: only the in-process figures")
    try:
        import uvloop  # type: ignore[import-not-found]

        run, loop_name = uvloop.run, "uvloop"
    except ImportError:
        run, loop_name = asyncio.run, "asyncio"
    figures: dict = {"loop": loop_name, "requests": args.requests, "target_us": TARGET_US, "runs": []}
    proc = None
    with tempfile.TemporaryDirectory() as work:
        try:
            if binary is not None:
                port = _free_port()
                proc = subprocess.Popen(
                    [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                     "--dir", work, "--protected-mode", "no"],
                    stdout=(Path(work) / "redis.log").open("w"), stderr=subprocess.STDOUT,
                )  # fmt: skip
                deadline = time.monotonic() + 10
                while True:
                    try:
                        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                        break
                    except OSError:
                        assert time.monotonic() < deadline, "redis-server did not start"
                        time.sleep(0.02)
            for conc in (1, 16):
                local = run(_local(args.requests, conc))
                row = {"concurrency": conc, "in_process_cpu_us": round(local, 1)}
                if proc is not None:
                    cpu, wall = run(_shared(f"redis://127.0.0.1:{port}/0", args.requests, conc))
                    row |= {"redis_cpu_us": round(cpu, 1), "redis_wall_us": round(wall, 1)}
                figures["runs"].append(row)
                line = f"concurrency {conc:>2}: in-process {local:6.1f} us CPU/request"
                if proc is not None:
                    line += f"; Redis {cpu:6.1f} us CPU/request ({wall:.0f} us wall), target <= {TARGET_US:g}"
                print(line, flush=True)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=10)
    return figures


if __name__ == "__main__":
    main()
