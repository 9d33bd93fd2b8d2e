"""`python -m benchmarks routing`: routing that follows the deployments (issue 48; target: under 10% of the
requests on a 3x slower deployment after warm-up, with ``strategy: latency``).

One model with two deployments, each on a fake upstream of its own (testkit.gateway.fake_upstream) that
answers after ``latency_s``: ``fast`` at FAST_S, ``slow`` at 3x that. The gateway runs in this process on
SQLite; requests are non-streamed chat completions, CONCURRENCY at a time; the deployment that answered is
read from each answer's ``x-farm-deployment``.

- **warm-up** (WARMUP requests), then **steady** (STEADY requests): the share of the steady requests that
  went to ``slow``, under ``weighted`` (equal weights: the share any latency-blind router gives it) and
  ``latency`` (5% exploration, the default);
- **recovery**: ``slow`` becomes as fast as ``fast``; the time and the requests until the router's estimate
  of it (``Deployment.ttfb``) is back within 10% of ``fast``'s (it competes again), then its share of the
  next STEADY requests; with exploration alone (it is only measured on the 5% of requests that explore),
  and with ``routing.health_check_interval_s`` (it is idle, so it is checked every interval whatever the
  traffic).

Figures: printed, returned (benchmarks/results/routing-*.json) and written to benchmarks/results/routing-*.md.

    .venv/bin/python -m benchmarks routing [--fast-s 0.02] [--steady 400]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODEL = "routed"
WARMUP, STEADY, CONCURRENCY = 40, 400, 4
MAX_RECOVERY = 3000  # requests: a recovery not seen by then is reported as not seen
HEALTH_INTERVAL_S = 0.5


def _settings(tmp: Path, fast_url: str, slow_url: str, strategy: str, health: float | None):
    from gateway.config import load_settings

    return load_settings(
        None,
        host="127.0.0.1",
        port=0,
        database_url=f"sqlite+aiosqlite:///{tmp / 'routing.db'}",
        secret="routing-bench-secret",
        providers={
            "fast": {"kind": "openai", "base_url": fast_url},
            "slow": {"kind": "openai", "base_url": slow_url},
        },
        models={
            MODEL: {
                "strategy": strategy,
                "deployments": [
                    {"name": "fast", "provider": "fast", "upstream_model": "m"},
                    {"name": "slow", "provider": "slow", "upstream_model": "m"},
                ],
            }
        },
        projects={"bench": {"models": [MODEL], "max_concurrency": 64}},
        routing={"health_check_interval_s": health},
        prices={"m": {"input_per_mtok": 1.0, "output_per_mtok": 1.0}},
        retry={"max_retries": 0},
    )


class _Run:
    """One gateway and its two fakes; ``send(n)`` sends n requests and gives the deployments that answered."""

    def __init__(self, strategy: str, fast_s: float, health: float | None = None) -> None:
        self.strategy, self.fast_s, self.health = strategy, fast_s, health

    async def __aenter__(self) -> _Run:
        import aiohttp
        from aiohttp import web

        from gateway.http.app import GATEWAY, create_app
        from testkit.gateway.fake_upstream import FakeUpstream

        self.fast, self.slow = FakeUpstream(record=False), FakeUpstream(record=False)
        self.fast.latency_s, self.slow.latency_s = self.fast_s, 3 * self.fast_s
        await self.fast.start()
        await self.slow.start()
        self.tmp = tempfile.TemporaryDirectory(prefix="routing-bench-")
        settings = _settings(
            Path(self.tmp.name), self.fast.base_url, self.slow.base_url, self.strategy, self.health
        )
        self.app = create_app(settings)
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.gw = self.app[GATEWAY]
        key, _ = await self.gw.keys.create("bench", "routing")
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {key}"}
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.session.close()
        await self.runner.cleanup()
        await self.fast.close()
        await self.slow.close()
        self.tmp.cleanup()

    def deployment(self, name: str):
        return next(d for d in self.gw.router.models[MODEL].deployments if d.name == name)

    async def _one(self) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
        async with self.session.post(self.url, json=body, headers=self.headers) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}")
            return r.headers["x-farm-deployment"]

    async def send(self, n: int) -> list[str]:
        out: list[str] = []
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                out.append(await self._one())

        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        return out

    async def recover(self) -> dict[str, Any]:
        """``slow`` becomes as fast as ``fast``: requests (CONCURRENCY at a time) until its estimate is
        within 10% of fast's; the seconds and requests that took, and its share of the next STEADY."""
        self.slow.latency_s = self.fast_s
        fast, slow = self.deployment("fast"), self.deployment("slow")
        t0, sent = time.perf_counter(), 0
        while not (slow.ttfb is not None and fast.ttfb and slow.ttfb <= 1.1 * fast.ttfb):
            if sent >= MAX_RECOVERY:
                return {"recovered": False, "requests": sent, "seconds": time.perf_counter() - t0}
            await self.send(CONCURRENCY)
            sent += CONCURRENCY
        took = time.perf_counter() - t0
        after = await self.send(STEADY)
        return {
            "recovered": True,
            "seconds": took,
            "requests": sent,
            "share_after": after.count("slow") / len(after),
        }


async def _steady(strategy: str, fast_s: float) -> dict[str, Any]:
    async with _Run(strategy, fast_s) as run:
        await run.send(WARMUP)
        steady = await run.send(STEADY)
        out: dict[str, Any] = {"slow_share": steady.count("slow") / len(steady)}
        if strategy == "latency":
            fast, slow = run.deployment("fast"), run.deployment("slow")
            out["ttfb_ms"] = {"fast": fast.ttfb * 1000, "slow": slow.ttfb * 1000}  # type: ignore[operator]
            out["recovery"] = await run.recover()
    return out


async def _recovery_with_checks(fast_s: float) -> dict[str, Any]:
    async with _Run("latency", fast_s, health=HEALTH_INTERVAL_S) as run:
        await run.send(WARMUP + STEADY)
        return await run.recover()


def _report(fig: dict[str, Any]) -> str:
    w, lat, chk = fig["weighted"], fig["latency"], fig["latency_with_health_checks"]
    rec = lat["recovery"]

    def recovery(r: dict[str, Any]) -> str:
        if not r["recovered"]:
            return f"not within {r['requests']} requests ({r['seconds']:.1f} s)"
        return (
            f"{r['seconds']:.2f} s, {r['requests']} requests; then {r['share_after']:.0%} of the next "
            f"{STEADY} on it"
        )

    return "\n".join(
        [
            f"# Routing: two deployments, one 3x slower ({fig['host']}, {fig['date']})",
            "",
            f"`python -m benchmarks routing`: fast answers after {fig['fast_s'] * 1000:.0f} ms, slow after "
            f"{fig['fast_s'] * 3000:.0f} ms; {WARMUP} warm-up then {STEADY} requests, "
            f"{CONCURRENCY} at a time.",
            "",
            "| strategy | share of requests on the slow one (target < 10% under latency) |",
            "|---|---|",
            f"| weighted (equal weights) | {w['slow_share']:.1%} |",
            f"| latency (5% exploration) | {lat['slow_share']:.1%} |",
            "",
            f"Estimates after warm-up: fast {lat['ttfb_ms']['fast']:.1f} ms, "
            f"slow {lat['ttfb_ms']['slow']:.1f} ms.",
            "",
            "When the slow one becomes as fast (until its estimate is within 10% of the other's):",
            "",
            f"- exploration alone: {recovery(rec)}",
            f"- with health checks every {HEALTH_INTERVAL_S} s of idle deployments: {recovery(chk)}",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global STEADY
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fast-s", type=float, default=0.02, help="the fast deployment's latency (seconds)")
    ap.add_argument("--steady", type=int, default=STEADY, help="requests counted after the warm-up")
    args = ap.parse_args(argv)
    STEADY = args.steady
    os.environ.setdefault("FARM_GATEWAY_SECRET", "routing-bench-secret")

    async def run() -> dict[str, Any]:
        return {
            "weighted": await _steady("weighted", args.fast_s),
            "latency": await _steady("latency", args.fast_s),
            "latency_with_health_checks": await _recovery_with_checks(args.fast_s),
        }

    fig: dict[str, Any] = asyncio.run(run())
    fig |= {"fast_s": args.fast_s, "host": platform.node(), "date": f"{datetime.date.today():%Y-%m-%d}"}
    text = _report(fig)
    print(text)
    out = ROOT / "benchmarks" / "results" / f"routing-{platform.node()}-{datetime.date.today():%Y%m%d}.md"
    out.write_text(text)
    print(f"(written to {out})")
    return json.loads(json.dumps(fig, default=str))
