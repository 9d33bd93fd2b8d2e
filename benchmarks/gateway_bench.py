"""Gateway overhead and throughput, side by side with calling the fake upstream directly.

The fake upstream and the gateway each run in their own subprocess (own event loop, own core share);
this process is the aiohttp client. A third subprocess, the minimal aiohttp proxy of
benchmarks.aiohttp_floor (no key, limit, ledger or metric), is measured in the same rounds: what aiohttp
alone reaches on this machine, the floor under any gateway built on it.
Serial: added latency p50/p95. Concurrency 32: requests per second,
non-stream and stream, and the CPU time each server process spent per request (from /proc: user + system).
Requests per second depend on whatever else the machine runs; CPU per request much less so, and
1 / (gateway CPU per request) is the most one gateway process can serve with a core to itself.
Bounded in count and time (well under a minute).

Routed case: the same non-stream run against ``bench-routed``, a public model of two deployments
(gateway.upstream.routing) of which one cools down for the whole run (its provider refuses connections; the
first warm-up request cools it), so each request pays the picker skipping a cooling deployment and the routing
headers. Its gateway CPU per request is printed beside the plain proxy's (target: at most 25% more).

Translated case: chat completions clients on ``bench-translated``, a model served by an anthropic provider
(the same fake, answering Anthropic Messages), so the gateway translates each request (chat -> messages)
and each answer back, whole and streamed event by event. Its gateway CPU per request is printed beside
the plain proxy's, non-stream and stream (target: at most 25% more).

``--redis`` (``python -m benchmarks gateway --redis``) runs instead the limits comparison: non-stream
requests per second and CPU per request (all gateway processes together, and the redis-server apart) with
a project that has every limit set (concurrency, rpm, tpm, daily budget; far above what the run uses), for
in-process limits, limits shared through Redis, and shared through Redis with ``serve --workers N``
(``--workers``, 2). It starts a redis-server of its own on a free port (skipped, saying so, without one).

    .venv/bin/python -m benchmarks.gateway_bench [--serial N] [--seconds S] [--rounds R] [--concurrency C]
    .venv/bin/python -m benchmarks.gateway_bench --redis [--workers N] [--seconds S] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import yaml

from benchmarks.loops import install_uvloop

ROOT = Path(__file__).resolve().parents[1]
MODEL = "bench-model"
ROUTED = "bench-routed"  # two deployments, one cooling down (the routed case)
TRANSLATED = "bench-translated"  # served by an anthropic provider: chat -> messages (the translated case)
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Summarise the FP8 GEMM anomaly in one line."}],
}


def _config(tmp: Path, fake_port: int, gw_port: int, limits: dict) -> dict:
    """The gateway's config: one project ``bench`` with ``limits`` on one model of the fake upstream."""
    return {
        "host": "127.0.0.1",
        "port": gw_port,
        "database_url": f"sqlite+aiosqlite:///{tmp / 'bench.db'}",
        "providers": {
            "fake": {"kind": "openai", "base_url": f"http://127.0.0.1:{fake_port}/v1"},
            # nothing listens there: the routed case's cooling deployment
            "dead": {"kind": "openai", "base_url": f"http://127.0.0.1:{_free_port()}/v1"},
            "fake-anthropic": {"kind": "anthropic", "base_url": f"http://127.0.0.1:{fake_port}/v1"},
        },
        "models": {
            MODEL: {"provider": "fake", "upstream_model": MODEL},
            ROUTED: {
                "deployments": [
                    {"name": "cold", "provider": "dead", "upstream_model": MODEL},
                    {"name": "warm", "provider": "fake", "upstream_model": MODEL},
                ]
            },
            TRANSLATED: {"provider": "fake-anthropic", "upstream_model": MODEL},
        },
        "routing": {"allowed_fails": 0, "cooldown_s": 3600, "max_cooldown_s": 3600},
        "projects": {"bench": {"models": [MODEL, ROUTED, TRANSLATED], "default_task": "bench", **limits}},
    }


async def serve_in_process(cfg: dict, tmp: Path):
    """The gateway of ``cfg`` (written to tmp/gateway.yaml) served in this process on 127.0.0.1, on a free
    port: (its aiohttp app, runner, port). The caller cleans the runner up."""
    from aiohttp import web

    from gateway.config import load_settings
    from gateway.http.app import create_app

    (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    os.environ.setdefault("FARM_GATEWAY_SECRET", "bench-secret")
    app = create_app(load_settings(tmp / "gateway.yaml"))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return app, runner, runner.addresses[0][1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


async def _wait_http(url: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as s:
        while True:
            try:
                async with s.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not come up")
            await asyncio.sleep(0.05)


async def _one(s: aiohttp.ClientSession, url: str, body: bytes, headers: dict, stream: bool) -> None:
    async with s.post(url, data=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.read())[:200]!r}")
        if stream:
            async for _ in r.content.iter_any():
                pass
        else:
            await r.read()


async def serial(url: str, headers: dict, n: int) -> list[float]:
    body = json.dumps(BODY).encode()
    out = []
    async with aiohttp.ClientSession() as s:
        for _ in range(20):
            await _one(s, url, body, headers, False)
        for _ in range(n):
            t0 = time.perf_counter()
            await _one(s, url, body, headers, False)
            out.append(time.perf_counter() - t0)
    return out


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux /proc); None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def throughput(
    url: str,
    headers: dict,
    stream: bool,
    conc: int,
    seconds: float,
    pids: dict[str, int],
    model: str = MODEL,
) -> dict:
    """Requests per second at `conc` in flight, and the CPU microseconds per request of each process in
    `pids` over the measured window."""
    body = json.dumps({**BODY, "model": model, "stream": stream}).encode()
    done = 0
    connector = aiohttp.TCPConnector(limit=conc)
    async with aiohttp.ClientSession(connector=connector) as s:
        for _ in range(conc):  # warm the pools
            await _one(s, url, body, headers, stream)
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await _one(s, url, body, headers, stream)
                done += 1

        cpu0 = {name: _tree_cpu_s(pid) for name, pid in pids.items()}
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        elapsed = time.perf_counter() - t0
        cpu1 = {name: _tree_cpu_s(pid) for name, pid in pids.items()}
    out = {"rps": done / elapsed, "requests": done}
    for name in pids:
        a, b = cpu0[name], cpu1[name]
        out[f"{name}_cpu_us"] = (b - a) / done * 1e6 if a is not None and b is not None else None
    return out


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1] * 1000


def _tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of a process and its children (a ``--workers`` supervisor and its workers)."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        kids = []
    own = _cpu_s(pid)
    if own is None:
        return None
    return own + sum(_cpu_s(int(k)) or 0.0 for k in kids)


async def _create_key(cfg_path: Path, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway.ops.cli",
        "keys",
        "create",
        "--config",
        str(cfg_path),
        "--project",
        "bench",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    out, _ = await proc.communicate()
    return out.decode().strip().splitlines()[-1]


async def run(args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": "bench-secret"}
    if args.no_uvloop:
        env["FARM_GATEWAY_UVLOOP"] = "0"
    fake_port, gw_port, floor_port = _free_port(), _free_port(), _free_port()
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-"))
    cfg = _config(tmp, fake_port, gw_port, {"max_concurrency": 256})
    cfg_path = tmp / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    procs = [_start([sys.executable, "-m", "testkit.gateway.fake_upstream", str(fake_port)], env)]
    try:
        key = await _create_key(cfg_path, env)
        prof = (
            ["-m", "cProfile", "-o", os.environ["GATEWAY_BENCH_PROFILE"]]
            if "GATEWAY_BENCH_PROFILE" in env
            else []
        )
        gw_cmd = [sys.executable, *prof, "-m", "gateway.ops.cli", "serve", "--config", str(cfg_path)]
        procs.append(_start(gw_cmd, env))
        floor_cmd = [sys.executable, "-m", "benchmarks.aiohttp_floor", str(fake_port), str(floor_port)]
        floor_cmd += ["--no-uvloop"] if args.no_uvloop else []
        procs.append(_start(floor_cmd, env))
        await _wait_http(f"http://127.0.0.1:{gw_port}/healthz")
        await _wait_http(f"http://127.0.0.1:{floor_port}/healthz")
        await _wait_http(f"http://127.0.0.1:{fake_port}/v1/models")
        direct = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
        via = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        floor = f"http://127.0.0.1:{floor_port}/v1/chat/completions"
        h_direct = {"Content-Type": "application/json"}
        h_via = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        res: dict = {}
        # Rounds of (direct, gateway) back to back; the round of median ratio is reported, with the range:
        # a VM's figures move by tens of percent from one second to the next.
        rounds = []
        for _ in range(args.rounds):
            d = await serial(direct, h_direct, args.serial)
            f = await serial(floor, h_direct, args.serial)
            rounds.append((d, await serial(via, h_via, args.serial), f))
        rounds.sort(key=lambda r: _pct(r[1], 50) - _pct(r[0], 50))
        res["serial_direct"], res["serial_via"], res["serial_floor"] = rounds[len(rounds) // 2]
        res["serial_added_p50_rounds"] = [_pct(v, 50) - _pct(d, 50) for d, v, _ in rounds]
        fake_pid, gw_pid, floor_pid = procs[0].pid, procs[1].pid, procs[2].pid
        for stream in (False, True):
            tag = "stream" if stream else "nonstream"
            conc, secs = args.concurrency, args.seconds
            runs = []
            for _ in range(args.rounds):
                d = await throughput(direct, h_direct, stream, conc, secs, {"fake": fake_pid})
                f_pids = {"fake": fake_pid, "gateway": floor_pid}
                f = await throughput(floor, h_direct, stream, conc, secs, f_pids)
                v = await throughput(via, h_via, stream, conc, secs, {"fake": fake_pid, "gateway": gw_pid})
                runs.append((d, v, f))
            runs.sort(key=lambda p: p[1]["rps"] / p[0]["rps"])
            res[f"{tag}_direct"], res[f"{tag}_via"], res[f"{tag}_floor"] = runs[len(runs) // 2]
            res[f"{tag}_ratio_rounds"] = [v["rps"] / d["rps"] for d, v, _ in runs]
            res[f"{tag}_floor_ratio_rounds"] = [f["rps"] / d["rps"] for d, _, f in runs]
        res["routed_via"] = await throughput(
            via, h_via, False, args.concurrency, args.seconds, {"fake": fake_pid, "gateway": gw_pid}, ROUTED
        )
        for stream in (False, True):
            res[f"translated_{'stream' if stream else 'nonstream'}_via"] = await throughput(
                via, h_via, stream, args.concurrency, args.seconds, {"fake": fake_pid, "gateway": gw_pid},
                TRANSLATED,
            )  # fmt: skip
        return res
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGINT)
        for p in reversed(procs):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


LIMITED = {  # every limit set, far above what a run uses: the whole admission and settlement path runs
    "max_concurrency": 256,
    "rpm": 100_000_000,
    "tpm": 10_000_000_000,
    "daily_token_budget": 1_000_000_000_000,
}


def _start_redis(work: Path) -> tuple[subprocess.Popen, str] | str:
    """A redis-server on a free port of 127.0.0.1 without persistence, or why there is none."""
    binary = shutil.which("redis-server")
    if binary is None:
        return "redis-server is not installed (Debian: apt-get install redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis package is not installed (.venv/bin/pip install redis)"
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(work), "--protected-mode", "no"],
        stdout=(work / "redis.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                return f"redis-server did not start: {(work / 'redis.log').read_text()[-500:]}"
            time.sleep(0.02)


async def _wait_workers(url: str, n: int, timeout: float = 30) -> None:
    """Until ``n`` distinct workers have answered ``/workerz`` (fresh connections)."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(seen)} of {n} workers answered")
        try:
            async with aiohttp.ClientSession() as s, s.get(url + "/workerz") as r:
                seen.add((await r.json())["pid"])
        except aiohttp.ClientError:
            await asyncio.sleep(0.05)


async def run_limits(args: argparse.Namespace) -> dict:
    """In-process limits, Redis-shared limits, and Redis-shared limits with ``--workers``, one after the
    other against one fake upstream: non-stream req/s and CPU per request."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": "bench-secret"}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    if args.no_uvloop:
        env["FARM_GATEWAY_UVLOOP"] = "0"
    tmp = Path(tempfile.mkdtemp(prefix="gwbench-redis-"))
    redis = _start_redis(tmp)
    if isinstance(redis, str):
        print(f"skipped the Redis comparison: {redis}")
        return {"skipped": redis}
    redis_proc, redis_url = redis
    fake_port = _free_port()
    fake = _start([sys.executable, "-m", "testkit.gateway.fake_upstream", str(fake_port)], env)
    modes = [("in-process", None, 1), ("redis", redis_url, 1), (f"redis, {args.workers} workers", redis_url,
             args.workers)]  # fmt: skip
    out: dict = {"runs": [], "concurrency": args.concurrency, "seconds": args.seconds}
    try:
        await _wait_http(f"http://127.0.0.1:{fake_port}/v1/models")
        key = None
        for name, url, workers in modes:
            gw_port = _free_port()
            cfg = _config(tmp, fake_port, gw_port, LIMITED)
            if url:
                cfg |= {"redis_url": url, "redis_key_prefix": f"bench{uuid.uuid4().hex[:8]}"}
            cfg_path = tmp / "gateway.yaml"
            cfg_path.write_text(yaml.safe_dump(cfg))
            key = key or await _create_key(cfg_path, env)
            cmd = [sys.executable, "-m", "gateway.ops.cli", "serve", "--config", str(cfg_path)]
            gw = _start([*cmd, "--workers", str(workers)], env)
            try:
                base = f"http://127.0.0.1:{gw_port}"
                await _wait_http(base + "/readyz", timeout=60)
                await _wait_workers(base, workers)
                headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
                pids = {"gateway": gw.pid, "fake": fake.pid, "redis": redis_proc.pid}
                res = await throughput(
                    base + "/v1/chat/completions", headers, False, args.concurrency, args.seconds, pids
                )
            finally:
                gw.send_signal(signal.SIGINT)
                try:
                    gw.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    gw.kill()
            if not url:
                res.pop("redis_cpu_us", None)
            out["runs"].append({"mode": name, "workers": workers, **res})
            print(f"  {name}: {res['rps']:.0f} req/s", flush=True)
        return out
    finally:
        fake.send_signal(signal.SIGINT)
        redis_proc.terminate()
        for p in (fake, redis_proc):
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def report_limits(res: dict) -> str:
    lines = [
        f"{'limits':24} {'req/s':>8} {'gateway CPU us/req':>19} {'redis CPU us/req':>17} "
        f"{'fake CPU us/req':>16}",
        "-" * 88,
    ]
    for r in res["runs"]:
        redis_cpu = f"{r['redis_cpu_us']:17.0f}" if r.get("redis_cpu_us") is not None else f"{'-':>17}"
        gw_cpu = r.get("gateway_cpu_us")
        lines.append(
            f"{r['mode']:24} {r['rps']:8.0f} {gw_cpu if gw_cpu is None else round(gw_cpu):>19} {redis_cpu} "
            f"{r['fake_cpu_us'] or 0:16.0f}"
        )
    lines.append(
        f"(non-stream chat completions, concurrency {res['concurrency']}, {res['seconds']:g} s each; "
        f"gateway CPU: every gateway process, supervisor and workers; {os.cpu_count()} CPUs)"
    )
    return "\n".join(lines)


def report(res: dict, args: argparse.Namespace) -> str:
    d, v, f = res["serial_direct"], res["serial_via"], res.get("serial_floor")
    floor_p50 = f"; aiohttp floor +{_pct(f, 50) - _pct(d, 50):.3f}" if f else ""
    rows = [
        (
            "serial p50 latency (ms)",
            _pct(d, 50),
            _pct(f, 50) if f else None,
            _pct(v, 50),
            _pct(v, 50) - _pct(d, 50),
            "added <= 0.7 ms" + _rounds_ms(res.get("serial_added_p50_rounds")) + floor_p50,
        ),
        (
            "serial p95 latency (ms)",
            _pct(d, 95),
            _pct(f, 95) if f else None,
            _pct(v, 95),
            _pct(v, 95) - _pct(d, 95),
            "",
        ),  # fmt: skip
    ]
    for tag, label, share in (("nonstream", "non-stream", 0.30), ("stream", "stream", 0.50)):
        d, v, f = res[f"{tag}_direct"], res[f"{tag}_via"], res.get(f"{tag}_floor")
        spread = res.get(f"{tag}_ratio_rounds") or [v["rps"] / d["rps"]]
        target = (
            f"{v['rps'] / d['rps']:.0%} of direct (target >= {share:.0%}; rounds {min(spread):.0%}-"
            f"{max(spread):.0%})"
        )
        if f:
            fs = res.get(f"{tag}_floor_ratio_rounds") or [f["rps"] / d["rps"]]
            target += f"; aiohttp floor {f['rps'] / d['rps']:.0%} ({min(fs):.0%}-{max(fs):.0%})"
        rows.append((f"{label} req/s @{args.concurrency}", d["rps"], f["rps"] if f else None, v["rps"], None,
                     target))  # fmt: skip
        if v.get("gateway_cpu_us") is not None:
            rows.append((f"  {label} CPU us/req", d["fake_cpu_us"], f.get("gateway_cpu_us") if f else None,
                         v["gateway_cpu_us"], None,
                         f"direct: the fake; proxies: their process (gateway's one-core ceiling "
                         f"{1e6 / v['gateway_cpu_us']:.0f} req/s)"))  # fmt: skip
    lines = [f"{'':28} {'direct':>10} {'aiohttp':>10} {'gateway':>10} {'added':>9}  target", "-" * 83]
    for name, a, fl, b, added, target in rows:
        add = f"{added:9.3f}" if added is not None else f"{'':9}"
        fl_s = f"{fl:10.2f}" if fl is not None else f"{'-':>10}"
        lines.append(f"{name:28} {a:10.2f} {fl_s} {b:10.2f} {add}  {target}")
    lines.append("(aiohttp: the minimal proxy of benchmarks.aiohttp_floor, the floor of an aiohttp gateway)")
    plain, routed = res["nonstream_via"], res.get("routed_via")
    if routed is not None:
        lines.append(f"routed (2 deployments, 1 cooling): {routed['rps']:.0f} req/s @{args.concurrency}")
        lines += _cpu_beside_plain(plain, routed, "routed")
    for tag, label in (("nonstream", "non-stream"), ("stream", "stream")):
        plain, tr = res[f"{tag}_via"], res.get(f"translated_{tag}_via")
        if tr is None:
            continue
        lines.append(f"translated chat->messages, {label}: {tr['rps']:.0f} req/s @{args.concurrency}")
        lines += _cpu_beside_plain(plain, tr, "translated")
    loop = "uvloop" if _has_uvloop() and not args.no_uvloop else "asyncio"
    lines.append(
        f"({os.cpu_count()} CPUs; fake, gateway and client in separate processes; event loop: {loop})"
    )
    return "\n".join(lines)


def _cpu_beside_plain(plain: dict, other: dict, name: str) -> list[str]:
    """The gateway's CPU per request of a variant (routed, translated) beside the plain proxy's, where both
    were measured: the variant's target is at most 25% more."""
    if not (other.get("gateway_cpu_us") and plain.get("gateway_cpu_us")):
        return []
    more = other["gateway_cpu_us"] / plain["gateway_cpu_us"] - 1
    return [
        f"  gateway CPU us/req: plain {plain['gateway_cpu_us']:.0f}, {name} "
        f"{other['gateway_cpu_us']:.0f} ({more:+.0%}; target <= +25%)"
    ]


def _rounds_ms(xs: list[float] | None) -> str:
    return f" (rounds {min(xs):.3f}-{max(xs):.3f})" if xs and len(xs) > 1 else ""


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401  # type: ignore[import-not-found]

        return True
    except ImportError:
        return False


def figures(res: dict) -> dict:
    """The run as JSON-able figures (raw serial latencies summarised)."""
    out = {k: v for k, v in res.items() if not k.startswith("serial_") or k.endswith("_rounds")}
    for side in ("direct", "via", "floor"):
        xs = res[f"serial_{side}"]
        out[f"serial_{side}_ms"] = {"p50": _pct(xs, 50), "p95": _pct(xs, 95), "n": len(xs)}
    out["added_p50_ms"] = out["serial_via_ms"]["p50"] - out["serial_direct_ms"]["p50"]
    out["floor_added_p50_ms"] = out["serial_floor_ms"]["p50"] - out["serial_direct_ms"]["p50"]
    out["cpus"] = os.cpu_count()
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--serial", type=int, default=500, help="serial requests per side")
    ap.add_argument("--seconds", type=float, default=2.0, help="duration of each throughput run")
    ap.add_argument(
        "--rounds", type=int, default=3, help="(direct, gateway) rounds per figure; the median is reported"
    )
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--no-uvloop", action="store_true", help="plain asyncio loops in all three processes")
    ap.add_argument(
        "--redis", action="store_true", help="compare in-process, Redis-shared and --workers limits instead"
    )
    ap.add_argument("--workers", type=int, default=2, help="gateway workers of the last --redis run")
    args = ap.parse_args(argv)
    if not args.no_uvloop:
        install_uvloop()
    if args.redis:
        print("gateway benchmark: limits in-process, shared through Redis, and with --workers", flush=True)
        limits = asyncio.run(run_limits(args))
        if "runs" in limits:
            print(report_limits(limits))
        return {"redis_limits": limits}
    res = asyncio.run(run(args))
    print("gateway benchmark (fake upstream, OpenAI chat completions)")
    print(report(res, args))
    return figures(res)


if __name__ == "__main__":
    main()
