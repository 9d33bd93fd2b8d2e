"""End to end: a real Prometheus scrapes a gateway (fake upstream behind it) and a farm exporter while
traffic flows and a probe sweep runs on a local Ray; then every panel query of both dashboards, as
Grafana would send it, returns data."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
import pytest
import raykit
import yaml
from poolkit import busy_pool_metrics
from promkit import GRAFANA, LiveGateway, Prometheus, has_finite_value, needs_prometheus, queries, substitute

from jobs.run.farm_metrics import FarmMetrics
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from testkit.gateway.fake_upstream import Fault

pytestmark = [needs_prometheus, pytest.mark.slow]

# spin trials spread over several scrapes; then one trial past its timeout and one that kills its worker.
# The timeout leaves a spin trial (at most 375 ms of CPU) room on a busy machine: beside two busy loops
# it runs at a third of a core
PROBE = """
name: observability-probe
family: probe
backends:
  - {name: spin, baseline: true, configs: {grid: {ms: [20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75]}}}
  - {name: sleep, configs: {grid: {s: [30]}}}
  - {name: crash}
shapes: {grid: {n: [0]}}
measure: {warmup_ms: 0, min_samples: 3, max_samples: 5, max_time_s: 0.5}
timeout_s: 4
max_attempts: 1
"""
MSGS = [{"role": "user", "content": "hi"}]


async def traffic(gw: LiveGateway, rounds: int, pause_s: float) -> dict[int, int]:
    """Rounds of requests that touch every gateway metric: tokens per task, streams (TTFT), an upstream
    503 and an upstream 429 that are retried, a budgeted project, and a burst on a one-slot project (queue
    wait, 429s)."""
    alpha = {"Authorization": f"Bearer {gw.keys['alpha']}", "X-Farm-Task": "checklist"}
    beta = {"Authorization": f"Bearer {gw.keys['beta']}"}
    chat = {"model": "gpt-fake", "messages": MSGS}
    msg = {"model": "claude-fake", "max_tokens": 8, "messages": MSGS, "stream": True}
    statuses: dict[int, int] = {}

    async def post(s: aiohttp.ClientSession, path: str, body: dict, headers: dict) -> None:
        async with s.post(f"{gw.url}/v1/{path}", json=body, headers=headers) as r:
            await r.read()
            statuses[r.status] = statuses.get(r.status, 0) + 1

    async with aiohttp.ClientSession() as s:
        for _ in range(rounds):
            gw.fake.faults.append(Fault(status=503))  # the next request's first attempt: a retry
            await post(s, "chat/completions", chat, alpha)
            # an upstream 429 with a short Retry-After: the token account's 429s and retry wait per task
            gw.fake.faults.append(Fault(status=429, retry_after="0", headers={"retry-after-ms": "20"}))
            await post(s, "chat/completions", chat, alpha)
            await post(s, "chat/completions", {**chat, "stream": True}, alpha)
            await post(s, "messages", msg, {"x-api-key": gw.keys["alpha"]})
            burst = {"model": "gpt-beta", "messages": MSGS}
            await asyncio.gather(*(post(s, "chat/completions", burst, beta) for _ in range(4)))
            await asyncio.sleep(pause_s)
    return statuses


def prometheus_config(gateway_port: int, farm_port: int) -> dict[str, Any]:
    """The shipped prometheus.yml with the live targets, a 1 s scrape and the shipped alert rules."""
    cfg = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    cfg["global"].update(scrape_interval="1s", scrape_timeout="1s", evaluation_interval="1s")
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    jobs["kernelfarm-gateway"]["static_configs"] = [{"targets": [f"127.0.0.1:{gateway_port}"]}]
    jobs["kernelfarm-farm"]["static_configs"] = [{"targets": [f"127.0.0.1:{farm_port}"]}]
    cfg["scrape_configs"] = [jobs["kernelfarm-gateway"], jobs["kernelfarm-farm"]]
    cfg["rule_files"] = [str(GRAFANA / f) for f in cfg["rule_files"]]
    return cfg


def test_every_panel_returns_data(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("live")
    gw = LiveGateway(
        tmp / "gw.db",
        upstream_latency_s=0.1,
        projects={
            "alpha": {"daily_token_budget": 5_000_000},
            # one slot and a short queue: a burst of 4 waits (queue wait) and overflows (429 concurrency)
            "beta": {"max_concurrency": 1, "queue_timeout_s": 0.25},
        },
    )
    farm = FarmMetrics()
    pool, pool_store = busy_pool_metrics(tmp / "pool.db", farm.registry)  # the pool's row of the dashboard
    farm.serve(0)
    assert farm.port is not None
    prom = Prometheus(prometheus_config(gw.port, farm.port), tmp / "prometheus")
    store = Store(str(tmp / "farm.db"))
    try:
        prom.wait_ready(timeout=30)
        prom.wait_targets_up(timeout=30)
        t0 = time.time()
        sent = gw.submit(lambda: traffic(gw, rounds=8, pause_s=0.6))  # runs while Ray starts
        raykit.local_ray()
        result = run_sweep(
            loads_spec(PROBE),
            store,
            RunOptions(
                gpus=2,
                show_progress=False,
                echo=lambda _: None,
                metrics=farm,
                observer=lambda _r, _w: pool.waited("bo", 5.0),
            ),  # a job got a worker: its wait
        )
        statuses = sent.result(timeout=60)
        done = time.time()
        assert result.counts == {"ok": 12, "timeout": 2, "crashed": 1} or result.counts.get("ok") == 12, (
            result
        )
        assert statuses.get(200) and statuses.get(429), statuses
        prom.wait_scraped_after(done + 1.0, timeout=20)
        end = time.time()
        print(f"phases: last scrape at {end - t0:.1f} s")

        empty = []
        range_s = f"{math.ceil(end - t0) + 5}s"
        for board, title, target in queries():
            expr = substitute(target["expr"], rate_interval="4s", range_=range_s)
            if target.get("instant"):
                data = prom.api("query", query=expr, time=end)
            else:
                data = prom.api("query_range", query=expr, start=t0 - 2, end=end, step=1)
            if not has_finite_value(data):
                empty.append(f"{board}: {title} [{target['refId']}]: {expr}")
        assert not empty, "panels without data:\n" + "\n".join(empty)

        # the shipped alert rules loaded into the real server and evaluate
        groups = prom.api("rules")["groups"]
        assert {r["name"] for g in groups for r in g["rules"]} >= {
            "GatewayHigh429Rate",
            "FarmTrialFailureRateHigh",
        }
        assert all(r["health"] == "ok" for g in groups for r in g["rules"]), groups
    finally:
        prom.stop()
        store.close()
        pool_store.close()
        farm.close()
        gw.stop()
