"""Instructions per request of the gateway, counted by valgrind (callgrind): a figure that does not move
with the machine's load.

On a shared 2-core VM the CPU time per request of ``python -m benchmarks gateway`` moves by 20-40% between
runs, so a change of 5% cannot be seen there. Here one process holds a client, the fake upstream and a
server on one event loop, and callgrind counts the instructions of N requests (nothing else: counting is
switched on around the requests only). Three runs side by side:

- ``direct``: the client to the fake upstream;
- ``gateway``: the same through the gateway (its ledger on SQLite with its spool, metrics, keys, limits);
- ``aiohttp``: the same through a minimal aiohttp proxy (server + ClientSession, nothing else): the floor
  of any gateway built on aiohttp.

gateway - direct is the gateway's cost per request; gateway - aiohttp what the gateway adds to aiohttp's
own. ``--parts`` adds runs with one stage of the gateway made free (its ledger row, its whole accounting,
its key check, its admission) to show what each costs. Time-driven work (the key cache refresh, the
ledger's flush timer) is moved out of the counted window: under valgrind's 50x slowdown it would count
50x too much; one flush of every row is counted instead, as under load.

    .venv/bin/python -m benchmarks.gateway_ir [--requests N] [--stream] [--parts]

Needs valgrind (Debian's ``valgrind``); without it the benchmark says so and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("ledger", "account", "auth", "admit")


async def _serve_and_count(mode: str, n: int, stream: bool, free: str | None) -> None:
    """The process valgrind runs: start everything, warm up, count ``n`` requests of ``mode``."""
    import aiohttp
    from aiohttp import web

    from benchmarks import gateway_bench as gb
    from benchmarks.aiohttp_floor import make_app as make_floor
    from gateway.http.app import GATEWAY
    from testkit.gateway.fake_upstream import FakeUpstream

    def counting(on: bool) -> None:
        flag = "on" if on else "off"
        subprocess.run(["callgrind_control", "-i", flag, str(os.getpid())], stdout=subprocess.DEVNULL)

    fake = FakeUpstream()
    await fake.start("127.0.0.1", 0)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-ir-"))
    cfg = gb._config(tmp, fake.port, 0, {"max_concurrency": 256})
    # under valgrind (about 50x slower) on a loaded host, the database's first answer can take over the
    # default 10 s: the start is not counted, so it may take what it needs
    cfg["database_connect_timeout_s"] = 300
    app, runner, gw_port = await gb.serve_in_process(cfg, tmp)
    gw = app[GATEWAY]
    key, _ = await gw.keys.create("bench", "ir")
    gw.keys._cache_ttl = 1e9  # no time-driven work in the counted window (see the module docstring)
    gw.ledger._interval, gw.ledger._batch_size = 1e9, 10**9
    gw.ledger._wake.set()
    _make_free(gw, free, key)

    floor = make_floor(f"http://127.0.0.1:{fake.port}/v1/chat/completions")
    mini_runner = web.AppRunner(floor, access_log=None)
    await mini_runner.setup()
    await web.TCPSite(mini_runner, "127.0.0.1", 0).start()

    port = {
        "direct": fake.port,
        "gateway": gw_port,
        "aiohttp": mini_runner.addresses[0][1],
    }[mode]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
    body = json.dumps({**gb.BODY, "stream": stream}).encode()
    conc = 8
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc)) as client:
        for _ in range(50):
            await gb._one(client, url, body, headers, stream)
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await gb._one(client, url, body, headers, stream)

        counting(True)
        await asyncio.gather(*(worker() for _ in range(conc)))
        await gw.ledger.flush()  # every row of the window, in one flush
        counting(False)
    await mini_runner.cleanup()
    await runner.cleanup()
    await fake.close()


def _make_free(gw, free: str | None, key: str) -> None:
    """One stage of the gateway replaced by a no-op (``--parts``)."""
    if free == "ledger":
        gw.ledger.submit = lambda row, owned=False: None
    elif free == "account":
        gw.pipeline.account = lambda rec: setattr(rec, "closed", True)
    elif free == "auth":
        real, project = gw.pipeline.authenticate, gw.settings.projects["bench"]
        cached: list = []

        async def authenticate(request, rec=None):
            if not cached:
                cached.append(await real(request))
            info = cached[0][0]
            if rec is not None:
                rec.project, rec.key_id = info.project, info.id
            return info, project

        gw.pipeline.authenticate = authenticate
    elif free == "admit":

        class Free:
            queue_wait_s = 0.0
            shared_pending = False

            def release(self) -> None:
                pass

            def settle(self, *_: object) -> None:
                pass

        async def admit(rec, cap, estimate=0):
            return Free(), False

        gw.pipeline._admit = admit


def _count(mode: str, n: int, stream: bool, free: str | None) -> int:
    """Instructions counted in one valgrind run."""
    with tempfile.TemporaryDirectory(prefix="gateway-ir-cg-") as d:
        cmd = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={d}/callgrind.out",
            sys.executable, "-m", "benchmarks.gateway_ir", "--child", mode, "--requests", str(n),
        ] + (["--stream"] if stream else []) + (["--free", free] if free else [])  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
        m = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or m is None:
            raise RuntimeError(f"valgrind run {mode} failed:\n{out.stderr[-2000:]}")
        return int(m.group(1))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="requests counted per run")
    ap.add_argument("--stream", action="store_true", help="streamed chat completions")
    ap.add_argument("--parts", action="store_true", help=f"also runs with one stage free: {', '.join(PARTS)}")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--free", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        import uvloop

        uvloop.run(_serve_and_count(args.child, args.requests, args.stream, args.free))
        return {}
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind): skipped")
        return {"skipped": "no valgrind"}
    n = args.requests
    runs = [("direct", None), ("gateway", None), ("aiohttp", None)]
    if args.parts:
        runs += [("gateway", p) for p in PARTS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        counts = list(pool.map(lambda r: _count(r[0], n, args.stream, r[1]), runs))
    per = {f"{m}{'-free-' + f if f else ''}": c for (m, f), c in zip(runs, counts, strict=True)}
    direct = per["direct"]
    gateway = (per["gateway"] - direct) / n
    floor = (per["aiohttp"] - direct) / n
    res = {
        "requests": n,
        "stream": args.stream,
        "gateway_ir_per_request": round(gateway),
        "aiohttp_proxy_ir_per_request": round(floor),
        "gateway_over_aiohttp": round(gateway - floor),
    }
    kind = "stream" if args.stream else "non-stream"
    print(f"instructions per request ({kind} chat completions, {n} requests, callgrind)")
    print(f"  gateway                 {gateway:12,.0f}")
    print(f"  minimal aiohttp proxy   {floor:12,.0f}   (the floor of an aiohttp gateway)")
    print(f"  gateway over the floor  {gateway - floor:12,.0f}   ({(gateway - floor) / gateway:.0%})")
    for part in PARTS if args.parts else ():
        cost = (per["gateway"] - per[f"gateway-free-{part}"]) / n
        res[f"{part}_ir_per_request"] = round(cost)
        print(f"    of which {part:<12} {cost:12,.0f}   ({cost / gateway:.0%} of the gateway)")
    return res


if __name__ == "__main__":
    main()
