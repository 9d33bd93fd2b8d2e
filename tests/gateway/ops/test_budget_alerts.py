"""Budget alerts that reach someone, end to end: two gateway instances of two workers each (``serve
--workers 2``, one Redis, one database), a real Prometheus scraping both with the shipped alerts.yml, a real
Alertmanager (Debian's) configured by gateway.ops.alerting from the gateway's config, and a Slack-compatible
webhook receiver on 127.0.0.1. A project crossing 50% of its token budget is one message; then crossing 80%
(spent through the other instance) is one more; a project crossing 80% of its cost budget at once is one
message, not the 50% band's too. Short scrape, evaluation and group intervals; every wait is on an event
(a webhook message, an evaluation count) with a generous bound."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway.config import load_settings
from gateway.ops.alerting import prometheus_config, write_configs
from testkit.gateway.fake_upstream import FakeUpstream
from tests.gateway.serving import ROOT, ServeProcess, create_key, free_port
from tests.gateway.shared_redis import REDIS_TIMEOUT_S
from tests.observability.promkit import Prometheus

pytestmark = [pytest.mark.slow, pytest.mark.service("prometheus"), pytest.mark.service("alertmanager")]

SECRET = "alerts-secret-0123456789abcdef"
WAIT_S = 120  # the bound on each wait (a loaded 2-core machine); the waits end on the event itself
TOKEN_BUDGET = 1000
COST_BUDGET = 1.0  # US dollars: 1000 tokens of gpt-beta at 1000 $/Mtok


class Receiver:
    """An incoming webhook on 127.0.0.1: every message posted, in order, and an event per message."""

    def __init__(self) -> None:
        self.messages: list[dict] = []
        self.arrived = asyncio.Condition()
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/hooks/team", self._post)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/hooks/team"

    async def _post(self, request: web.Request) -> web.Response:
        body = await request.json()
        async with self.arrived:
            self.messages.append(body)
            self.arrived.notify_all()
        return web.Response(text="ok")

    async def wait_for(self, count: int, what: str) -> None:
        async with self.arrived:
            try:
                await asyncio.wait_for(self.arrived.wait_for(lambda: len(self.messages) >= count), WAIT_S)
            except TimeoutError:
                raise AssertionError(
                    f"no webhook message for {what} in {WAIT_S} s: {self.titles()}"
                ) from None

    def titles(self) -> list[str]:
        return [a["title"] for m in self.messages for a in m.get("attachments", [])]


class Alertmanager:
    """Debian's prometheus-alertmanager on a free port of 127.0.0.1, no cluster, storage in ``workdir``."""

    def __init__(self, config: Path, workdir: Path, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = (workdir / "alertmanager.log").open("wb")
        self.proc = subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={config}", f"--storage.path={workdir / 'am-data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    async def ready(self, s: aiohttp.ClientSession) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            assert self.proc.poll() is None, f"alertmanager exited: {Path(self.log.name).read_text()[-2000:]}"
            try:
                async with s.get(f"{self.url}/-/ready") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, "alertmanager not ready"
            await asyncio.sleep(0.1)

    async def sent(self, s: aiohttp.ClientSession) -> tuple[float, float]:
        """(messages sent, attempts failed) to the Slack integration, by Alertmanager's own metrics (its
        notifications_total also counts a group left with only resolved alerts, which it does not send)."""
        values = {
            "alertmanager_notification_latency_seconds_count": 0.0,
            "alertmanager_notifications_failed_total": 0.0,
        }
        async with s.get(f"{self.url}/metrics") as r:
            for line in (await r.text()).splitlines():
                name = line.split("{", 1)[0]
                if name in values and 'integration="slack"' in line:
                    values[name] = float(line.rsplit(" ", 1)[1])
        return values["alertmanager_notification_latency_seconds_count"], values[
            "alertmanager_notifications_failed_total"
        ]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.log.close()


def _gateway_config(tmp: Path, upstream: str, redis_url: str, webhook: str) -> Path:
    cfg = {
        "host": "127.0.0.1",
        "database_url": f"sqlite+aiosqlite:///{tmp / 'gw.db'}",
        "ledger_flush_interval_s": 0.1,
        "providers": {"oa": {"kind": "openai", "base_url": upstream}},
        "models": {"gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"},
                   "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"}},
        "prices": {"gpt-beta": {"input_per_mtok": 1000.0, "output_per_mtok": 1000.0}},
        "projects": {"alpha": {"models": ["gpt-fake"], "daily_token_budget": TOKEN_BUDGET},
                     "beta": {"models": ["gpt-beta"], "daily_cost_budget_usd": COST_BUDGET}},
        "retry": {"max_retries": 0},
        "redis_url": redis_url,
        "redis_key_prefix": f"a{uuid.uuid4().hex[:12]}",
        "redis_timeout_s": REDIS_TIMEOUT_S,
        "alerting": {"slack_webhook_url": webhook},
        "uvloop": False,
    }  # fmt: skip
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_GATEWAY_", "PROMETHEUS_MULTIPROC"))}
    return env | {"PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": SECRET}


async def _spend(s: aiohttp.ClientSession, url: str, key: str, model: str, chars: int) -> None:
    body = {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": "x" * chars}]}
    async with s.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
    ) as r:
        assert r.status == 200, await r.text()


async def _after_evaluations(prom: Prometheus, n: int) -> None:
    """Until Prometheus has evaluated the gateway's rule group ``n`` more times (each evaluation has its own
    ``lastEvaluation`` in the rules API)."""
    seen: set[str] = set()
    deadline = time.monotonic() + WAIT_S
    while True:
        groups = (await asyncio.to_thread(prom.api, "rules"))["groups"]
        seen.update(g["lastEvaluation"] for g in groups if g["name"] == "kernelfarm-gateway")
        if len(seen) > n:
            return
        assert time.monotonic() < deadline, f"prometheus did not evaluate the rules {n} more times"
        await asyncio.sleep(0.2)


async def test_a_project_crossing_a_budget_band_is_one_message_at_the_webhook(tmp_path, redis_server):
    fake, receiver = FakeUpstream(record=False), Receiver()
    await fake.start()
    await receiver.start()
    cfg = _gateway_config(tmp_path, fake.base_url, redis_server.url, receiver.url)
    env = _env()
    am_port = free_port()
    am_cfg, _ = write_configs(
        load_settings(cfg), f"127.0.0.1:{am_port}", tmp_path / "monitor",
        group_wait="1s", group_interval="1s", repeat_interval="1h",
    )  # fmt: skip
    am = Alertmanager(am_cfg, tmp_path, am_port)
    instances = [ServeProcess(cfg, tmp_path / f"gw{i}.log", env, "--workers", "2") for i in range(2)]
    prom = None
    try:
        async with aiohttp.ClientSession() as s:
            await am.ready(s)
            for gw in instances:
                await gw.ready(s, timeout=WAIT_S)
            prom_cfg = prometheus_config(f"127.0.0.1:{am_port}")
            prom_cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
            targets = [f"127.0.0.1:{gw.port}" for gw in instances]
            prom_cfg["scrape_configs"] = [
                {"job_name": "kernelfarm-gateway", "static_configs": [{"targets": targets}]}
            ]
            prom = Prometheus(prom_cfg, tmp_path / "prometheus")
            await asyncio.to_thread(prom.wait_ready, WAIT_S)
            await asyncio.to_thread(prom.wait_targets_up, WAIT_S)
            alpha = await create_key(cfg, env, project="alpha")
            beta = await create_key(cfg, env, project="beta")
            a, b = instances[0].url, instances[1].url

            await _spend(s, a, alpha, "gpt-fake", 4700)  # ~600 tokens: 60% of alpha's token budget
            await receiver.wait_for(1, "alpha's tokens at 50%")
            await _spend(s, b, alpha, "gpt-fake", 2000)  # ~860 in all, spent through the other instance
            await receiver.wait_for(2, "alpha's tokens at 80%")
            await _spend(s, a, beta, "gpt-beta", 6700)  # ~$0.85: 85% of beta's cost budget at once
            await receiver.wait_for(3, "beta's cost at 80%")
            await _after_evaluations(prom, 5)  # time for a duplicate to show, if there were one
            sent = await am.sent(s)

        assert receiver.titles() == [
            "GatewayDailyBudgetUsed alpha tokens 50%",
            "GatewayDailyBudgetUsed alpha tokens 80%",
            "GatewayDailyBudgetUsed beta cost 80%",
        ]
        texts = [a["text"] for m in receiver.messages for a in m["attachments"]]
        assert "alpha: 8" in texts[1] and "of today's token budget used" in texts[1], texts
        assert "beta: 8" in texts[2] and "of today's cost budget used" in texts[2], texts
        assert sent == (3, 0), sent  # Alertmanager sent these three and no other, none failed
    finally:
        for gw in instances:
            gw.stop()
        if prom is not None:
            prom.stop()
        am.stop()
        await receiver.runner.cleanup()
        await fake.close()
