"""CPU per request of the upstream transport alone, against the fake upstream in another process.

This process only sends: non-stream OpenAI chat completions (the fake upstream's ~400-byte JSON answer),
`--concurrency` in flight, on uvloop unless `--no-uvloop`. The figure is this process's user + system CPU
divided by the requests done, after a warm-up (connections open), the best of `--rounds` rounds.

    .venv/bin/python -m benchmarks.transport_bench [--requests N] [--concurrency C] [--rounds R]
        [--kinds client,transport,aiohttp-default]

Kinds: ``client`` = gateway.upstream.client.UpstreamClient.send (fair slots, retry loop, transport) and a
whole read; ``transport`` = gateway.upstream.transport.AiohttpTransport.post + read; ``aiohttp-default`` = a
stock ``aiohttp.ClientSession().post`` for reference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.loops import install_uvloop

ROOT = Path(__file__).resolve().parents[1]
BODY = json.dumps(
    {"model": "bench-model", "messages": [{"role": "user", "content": "Summarise the FP8 GEMM anomaly."}]}
).encode()
HEADERS = {"Content-Type": "application/json"}
PATH = "/chat/completions"

# name -> async factory(base_url, concurrency) -> (one_request, close)
Factory = Callable[[str, int], Awaitable[tuple[Callable[[], Awaitable[None]], Callable[[], Awaitable[None]]]]]
KINDS: dict[str, Factory] = {}


def kind(name: str):
    def deco(fn: Factory) -> Factory:
        KINDS[name] = fn
        return fn

    return deco


@kind("client")
async def _client(base_url: str, conc: int):
    from gateway.config import ProviderConfig, RetryConfig
    from gateway.limits.slots import FairSlots
    from gateway.upstream.client import UpstreamClient

    cfg = ProviderConfig(kind="openai", base_url=base_url, max_connections=conc)
    client = UpstreamClient("bench", cfg, RetryConfig(), "sk-bench", slots=FairSlots(cfg.max_connections))
    await client.start()

    async def one() -> None:
        result = await client.send(PATH, BODY, HEADERS, project="bench")
        assert result.status == 200 and result.response is not None
        await result.response.read()
        result.response.release()

    return one, client.close


@kind("transport")
async def _transport(base_url: str, conc: int):
    from gateway.upstream.transport import AiohttpTransport

    t = AiohttpTransport(
        "bench", base_url, max_connections=conc, default_headers={"Authorization": "Bearer x"}
    )
    await t.start()

    async def one() -> None:
        r = await t.post(PATH, BODY, HEADERS)
        assert r.status == 200
        await r.read()
        r.release()

    return one, t.close


@kind("aiohttp-default")
async def _aiohttp_default(base_url: str, conc: int):
    import aiohttp

    s = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc))
    url = base_url + PATH

    async def one() -> None:
        async with s.post(url, data=BODY, headers=HEADERS) as r:
            assert r.status == 200
            await r.read()

    return one, s.close


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu() -> float:
    return time.process_time()  # user + system CPU of this process, all threads


async def _round(one: Callable[[], Awaitable[None]], n: int, conc: int) -> float:
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    c0 = _cpu()
    await asyncio.gather(*(worker() for _ in range(conc)))
    return (_cpu() - c0) / n * 1e6


async def measure(name: str, base_url: str, n: int, conc: int, rounds: int) -> float:
    one, close = await KINDS[name](base_url, conc)
    try:
        await _round(one, min(n, 500), conc)  # warm-up: connections open, caches filled
        return min([await _round(one, n, conc) for _ in range(rounds)])
    finally:
        await close()


async def _wait_port(port: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the fake upstream did not come up") from None
            await asyncio.sleep(0.05)


async def main(args: argparse.Namespace) -> dict[str, float]:
    port = _free_port()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    fake = subprocess.Popen(
        [sys.executable, "-m", "testkit.gateway.fake_upstream", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    if len(cpus) >= 2:  # each process on a core of its own: steadier figures
        os.sched_setaffinity(fake.pid, {cpus[-1]})
        os.sched_setaffinity(0, {cpus[0]})
    try:
        await _wait_port(port)
        base_url = f"http://127.0.0.1:{port}/v1"
        out = {}
        for name in args.kinds.split(","):
            out[name] = await measure(name, base_url, args.requests, args.concurrency, args.rounds)
            print(f"{name:>16}: {out[name]:6.1f} us CPU per request", flush=True)
        return out
    finally:
        fake.terminate()
        fake.wait(5)


def cli(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--kinds", default="client,transport,aiohttp-default")
    p.add_argument("--no-uvloop", action="store_true")
    args = p.parse_args(argv)
    if not args.no_uvloop:
        install_uvloop()
    asyncio.run(main(args))


if __name__ == "__main__":
    cli()
