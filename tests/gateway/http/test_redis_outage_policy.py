"""``redis_outage`` (issue 48): what a gateway with ``--workers 2`` does while its Redis is down, against a
real redis-server stopped mid-test (SIGKILL) and started again.

- ``share`` (the default; as before): every worker serves, each on its share of the limits;
- ``refuse``: every worker answers 503 with Retry-After, in the caller's format (OpenAI's error object on
  the OpenAI paths, Anthropic's on ``/v1/messages``), and serves again once Redis is back.

Which worker answered is known: each probe asks ``/workerz`` and then the model on one connection."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import yaml

from testkit.gateway.fake_upstream import FakeUpstream
from tests.gateway.http.test_workers import Serve, _config, _create_key, _worker_pids

pytestmark = pytest.mark.slow

CHAT = ("/v1/chat/completions", {"model": "gpt-fake", "messages": [{"role": "user", "content": "hi"}]})
MESSAGES = (
    "/v1/messages",
    {"model": "claude-fake", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]},
)


async def _probe(url: str, key: str, call: tuple[str, dict]) -> tuple[int, int, dict, dict]:
    """(worker pid, status, headers, body) of one call, on a fresh connection."""
    path, body = call
    conn = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.get(url + "/workerz") as r:
            pid = (await r.json())["pid"]
        async with s.post(url + path, json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            return pid, r.status, dict(r.headers), await r.json()


async def _every_worker(
    url: str, key: str, call: tuple[str, dict], pids: set[int], want, timeout: float = 60
):
    """Probe until each worker in ``pids`` has answered as ``want(status, headers, body)`` says; every answer
    seen on the way is returned (the caller checks them all)."""
    seen: dict[int, bool] = {}
    answers = []
    deadline = time.monotonic() + timeout
    while not all(seen.get(p) for p in pids):
        assert time.monotonic() < deadline, (seen, answers[-3:])
        pid, status, headers, body = await _probe(url, key, call)
        answers.append((pid, status, headers, body))
        seen[pid] = want(status, headers, body)
        if not seen[pid]:
            await asyncio.sleep(0.05)
    return answers


def _refused_openai(status: int, headers: dict, body: dict) -> bool:
    err = body.get("error") if isinstance(body, dict) else None
    return (
        status == 503
        and int(headers.get("Retry-After", "0")) >= 1
        and isinstance(err, dict)
        and err.get("code") == "limits_unavailable"
        and "redis_outage: refuse" in err.get("message", "")
        and "type" not in body  # OpenAI's shape: no top-level "type"
    )


def _refused_anthropic(status: int, headers: dict, body: dict) -> bool:
    return (
        status == 503
        and int(headers.get("Retry-After", "0")) >= 1
        and body.get("type") == "error"
        and body["error"].get("type") == "api_error"
        and "redis_outage: refuse" in body["error"].get("message", "")
    )


def _served(status: int, headers: dict, body: dict) -> bool:
    return status == 200


@pytest.mark.parametrize("policy", ["share", "refuse"])
async def test_two_workers_share_or_refuse_while_redis_is_down(tmp_path, policy):
    import services
    from redis_server import Unavailable, start_server

    (tmp_path / "redis").mkdir()
    try:
        srv = start_server(tmp_path / "redis")
    except Unavailable as e:
        services.missing("redis", str(e))
    fake = FakeUpstream()
    await fake.start()
    cfg = _config(tmp_path, fake.base_url, srv.url)
    settings = yaml.safe_load(cfg.read_text())
    settings["providers"]["an"] = {"kind": "anthropic", "base_url": fake.base_url}
    settings["models"]["claude-fake"] = {"provider": "an", "upstream_model": "claude-upstream"}
    settings["projects"]["alpha"]["models"].append("claude-fake")
    settings |= {"redis_health_interval_s": 0.1, "redis_fallback_processes": 2, "redis_outage": policy}
    cfg.write_text(yaml.safe_dump(settings))
    gw: Serve | None = None
    try:
        key = await _create_key(cfg)
        gw = Serve(cfg, tmp_path, f"outage-{policy}", "--workers", "2")
        async with aiohttp.ClientSession() as s:
            await gw.ready(s)
            pids = await _worker_pids(s, gw.url, 2, timeout=60)  # a loaded host starts workers slowly
        for call in (CHAT, MESSAGES):  # Redis up: both workers serve
            await _every_worker(gw.url, key, call, pids, _served)

        await asyncio.to_thread(srv.kill)  # mid-test: SIGKILL
        if policy == "share":
            for call in (CHAT, MESSAGES):
                answers = await _every_worker(gw.url, key, call, pids, _served)
                assert all(a[1] == 200 for a in answers), [a[1:] for a in answers]
        else:
            answers = await _every_worker(gw.url, key, CHAT, pids, _refused_openai)
            answers += await _every_worker(gw.url, key, MESSAGES, pids, _refused_anthropic)
            assert not [a for a in answers if a[1] == 200], "a worker served on its share"
            served_before = fake.requests
            # nothing reached the upstream while refusing
            answers = await _every_worker(gw.url, key, CHAT, pids, _refused_openai)
            assert fake.requests == served_before

        await asyncio.to_thread(srv.start)  # back (empty): both workers serve again
        for call in (CHAT, MESSAGES):
            await _every_worker(gw.url, key, call, pids, _served)
    finally:
        if gw is not None:
            gw.stop()
        await fake.close()
        srv.kill()
