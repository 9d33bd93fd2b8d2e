"""``farm gateway serve --workers N`` as real processes: N workers on one port sharing limits through Redis,
supervised (a killed worker comes back), stopped together by SIGTERM with the ledger flushed, metrics
summed over the workers; and the refusals: ``--workers 2`` without ``redis_url``, and a second process
without ``redis_url`` on a SQLite database that one already serves. Free ports, temporary folders."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import time
import uuid
from pathlib import Path

import aiohttp
import pytest
import yaml

from testkit.gateway.fake_upstream import FakeUpstream
from tests.gateway.serving import ROOT, ServeProcess, create_key
from tests.gateway.shared_redis import REDIS_TIMEOUT_S

SECRET = "workers-secret-0123456789abcdef"
MSGS = [{"role": "user", "content": "hi"}]

pytestmark = pytest.mark.slow


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FARM_GATEWAY_", "PROMETHEUS_MULTIPROC"))}
    return env | {"PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": SECRET}


def _config(tmp_path: Path, upstream: str, redis_url: str | None, name: str = "gateway") -> Path:
    cfg: dict = {
        "host": "127.0.0.1",
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        "ledger_spool_dir": str(tmp_path / "spool"),
        "ledger_flush_interval_s": 30,  # nothing is written before the stop: SIGTERM must flush
        "providers": {"oa": {"kind": "openai", "base_url": upstream}},
        "models": {"gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"}},
        "projects": {"alpha": {"models": ["gpt-fake"], "max_concurrency": 64, "rpm": 100_000}},
        "retry": {"max_retries": 0},
        "uvloop": False,
    }
    if redis_url:
        cfg |= {
            "redis_url": redis_url,
            "redis_key_prefix": f"w{uuid.uuid4().hex[:12]}",
            "redis_timeout_s": REDIS_TIMEOUT_S,
        }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Serve(ServeProcess):
    """``python -m gateway.ops.cli serve`` with its output in a log file."""

    def __init__(self, cfg: Path, tmp_path: Path, name: str, *args: str, port: int | None = None) -> None:
        super().__init__(cfg, tmp_path / f"{name}.log", _env(), *args, port=port)


def _children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


def _alive(pid: int) -> bool:
    """Whether any thread of ``pid`` is still running. The main thread of a killed process can be a zombie
    while its other threads are still exiting, and its sockets close only when the last one has: until
    then the kernel still queues new connections on its listening socket, and resets them."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            return True
    return False


async def _worker_pids(s: aiohttp.ClientSession, url: str, want: int, timeout: float = 20) -> set[int]:
    """The pids that answer ``/workerz`` on fresh connections (the kernel spreads them over the workers)."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(seen) < want:
        assert time.monotonic() < deadline, f"only {seen} answered"
        async with aiohttp.ClientSession() as fresh:  # a new connection, a new source port
            try:
                async with fresh.get(url + "/workerz") as r:
                    body = await r.json()
                    assert body["workers"] == want
                    seen.add(body["pid"])
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    return seen


async def _create_key(cfg: Path) -> str:
    return await create_key(cfg, _env())


async def _chat(s: aiohttp.ClientSession, url: str, key: str) -> int:
    async with aiohttp.ClientSession() as fresh:  # fresh connections reach both workers
        async with fresh.post(
            url + "/v1/chat/completions",
            json={"model": "gpt-fake", "messages": MSGS},
            headers={"Authorization": f"Bearer {key}"},
        ) as r:
            await r.read()
            return r.status


def _requests_total(text: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(r'^gateway_requests_total\{[^}]*status="ok"[^}]*\} (\S+)$', text, re.M)
    )


def _ledger_rows(tmp_path: Path) -> int:
    with sqlite3.connect(tmp_path / "gw.db") as db:
        return db.execute("SELECT count(*) FROM gateway_ledger").fetchone()[0]


async def test_two_workers_share_a_port_survive_a_kill_and_stop_together(redis_server, tmp_path):
    fake = FakeUpstream()
    await fake.start()
    cfg = _config(tmp_path, fake.base_url, redis_server.url)
    gw: Serve | None = None
    try:
        key = await _create_key(cfg)
        gw = Serve(cfg, tmp_path, "workers", "--workers", "2")
        async with aiohttp.ClientSession() as s:
            await gw.ready(s)
            # both workers answer on the one port, and they are the supervisor's children
            pids = await _worker_pids(s, gw.url, 2)
            children = _children(gw.proc.pid)  # the workers, and multiprocessing's resource tracker
            assert pids <= children, (pids, children)

            # requests through both; /metrics (served by either) counts all of them
            statuses = await asyncio.gather(*(_chat(s, gw.url, key) for _ in range(20)))
            assert statuses == [200] * 20
            for _ in range(4):  # whichever worker answers the scrape
                async with aiohttp.ClientSession() as fresh, fresh.get(gw.url + "/metrics") as r:
                    assert _requests_total(await r.text()) == 20
            # the values read live in each process (copied into the metrics folder every second) are there
            # once, combined: no per-process series
            want = {
                'gateway_in_flight{project="alpha"} 0.0',
                "gateway_shared_state_up 1.0",
                "gateway_ledger_pending_rows 20.0",  # the rows of both (written at the stop only)
                "gateway_ledger_written_rows_total 0.0",
            }
            deadline = time.monotonic() + 5
            while True:
                async with s.get(gw.url + "/metrics") as r:
                    lines = set((text := await r.text()).splitlines())
                if want <= lines:
                    break
                assert time.monotonic() < deadline, (want - lines, text[-3000:])
                await asyncio.sleep(0.1)

            # kill -9 one worker: the supervisor logs it and starts another; the port keeps serving
            victim = min(pids)
            os.kill(victim, signal.SIGKILL)
            while _alive(victim):  # until its socket is closed (connections queued on it are reset)
                await asyncio.sleep(0.01)
            statuses = await asyncio.gather(*(_chat(s, gw.url, key) for _ in range(10)))
            assert statuses == [200] * 10  # the other worker serves meanwhile
            deadline = time.monotonic() + 20
            while victim in (now := _children(gw.proc.pid)) or not now - children:
                assert time.monotonic() < deadline, f"not restarted:\n{gw.output()[-3000:]}"
                await asyncio.sleep(0.05)
            new_pids = await _worker_pids(s, gw.url, 2)
            assert victim not in new_pids and len(new_pids & pids) == 1
            assert re.search(rf"worker \d \(pid {victim}\) was killed by SIGKILL .*restarting", gw.output())
            assert await _chat(s, gw.url, key) == 200
            # the dead worker's counts stay in /metrics (its live gauges go)
            async with aiohttp.ClientSession() as fresh, fresh.get(gw.url + "/metrics") as r:
                assert _requests_total(await r.text()) == 31

        # SIGTERM to the supervisor: every worker stops, and the ledger is flushed (interval 30 s: only
        # the graceful stop writes it); the dead worker's spooled rows were replayed by its successor
        workers = _children(gw.proc.pid) - (children - pids)
        assert len(workers) == 2
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(timeout=30) == 0, gw.output()[-3000:]
        assert not any(_alive(p) for p in workers)
        assert _ledger_rows(tmp_path) == 31
        assert not list((tmp_path / "spool").glob("ledger-*.jsonl"))
        assert "supervisor: stopped" in gw.output()
    finally:
        if gw is not None:
            gw.stop()
        await fake.close()


async def test_workers_without_redis_url_is_refused_naming_it(tmp_path):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", None)
    gw = Serve(cfg, tmp_path, "noredis", "--workers", "2")
    try:
        assert gw.proc.wait(timeout=30) != 0
    finally:
        gw.stop()
    out = gw.output()
    assert "--workers 2 needs redis_url" in out and "on its own" in out, out[-2000:]


async def test_a_second_process_on_one_sqlite_database_without_redis_is_refused(tmp_path):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", None)
    first = Serve(cfg, tmp_path, "first")
    second: Serve | None = None
    try:
        async with aiohttp.ClientSession() as s:
            await first.ready(s)
            second = Serve(cfg, tmp_path, "second")
            assert second.proc.wait(timeout=30) != 0
            out = second.output()
            assert "another gateway process" in out and "redis_url" in out, out[-2000:]
            assert f"pid {first.proc.pid}" in out
            async with s.get(first.url + "/healthz") as r:  # the first one is untouched
                assert r.status == 200
        # once the first has stopped, a new process may serve the database
        first.stop()
        third = Serve(cfg, tmp_path, "third")
        try:
            async with aiohttp.ClientSession() as s:
                await third.ready(s)
        finally:
            third.stop()
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_two_workers_reconcile_the_budget_after_redis_dies_under_load(tmp_path):
    """Redis SIGKILLed while both workers serve, the load going on through the outage (each worker on its
    own share), Redis back empty: once both are back, the day's counters equal the ledger (before: the
    worker that did not rebuild them added its outage tokens, which the rebuild had read already: 43% more
    than the ledger in one run)."""
    import redis as redis_py
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
    settings["projects"]["alpha"]["daily_token_budget"] = 10_000_000
    settings |= {
        "ledger_flush_interval_s": 0.1,
        "redis_health_interval_s": 0.1,
        "redis_fallback_processes": 2,
    }
    cfg.write_text(yaml.safe_dump(settings))
    gw: Serve | None = None
    statuses: list[int] = []
    stop = asyncio.Event()

    async def scrape(s: aiohttp.ClientSession, name: str) -> float:
        async with s.get(gw.url + "/metrics") as r:
            m = re.search(rf"^{name} (\S+)$", await r.text(), re.M)
            return float(m.group(1)) if m else 0.0

    async def until(s: aiohttp.ClientSession, name: str, ok, timeout: float = 20) -> None:
        deadline = time.monotonic() + timeout
        while not ok(await scrape(s, name)):
            assert time.monotonic() < deadline, f"{name} never as wanted:\n{gw.output()[-3000:]}"
            await asyncio.sleep(0.05)

    async def load(s: aiohttp.ClientSession, key: str) -> None:
        while not stop.is_set():
            statuses.append(await _chat(s, gw.url, key))

    try:
        key = await _create_key(cfg)
        gw = Serve(cfg, tmp_path, "reconcile", "--workers", "2")
        async with aiohttp.ClientSession() as s:
            await gw.ready(s)
            await _worker_pids(s, gw.url, 2)
            loaders = [asyncio.create_task(load(s, key)) for _ in range(6)]
            while len(statuses) < 30:
                await asyncio.sleep(0.02)
            await asyncio.to_thread(srv.kill)
            await until(s, "gateway_shared_fallback_admissions_total", lambda v: v >= 40)  # both workers' sum
            await asyncio.to_thread(srv.start)  # empty
            await until(s, "gateway_shared_state_up", lambda v: v == 1)  # the minimum over the workers
            served = len(statuses)
            while len(statuses) < served + 20:  # counting on through Redis
                await asyncio.sleep(0.02)
            stop.set()
            await asyncio.gather(*loaders)
        assert set(statuses) == {200}, sorted(set(statuses))
        deadline = time.monotonic() + 20
        while _ledger_rows(tmp_path) < len(statuses):  # every answer's row, flushed every 0.1 s
            assert time.monotonic() < deadline, (_ledger_rows(tmp_path), len(statuses))
            await asyncio.sleep(0.05)
        with sqlite3.connect(tmp_path / "gw.db") as db:
            tokens, flagged = db.execute(
                "SELECT sum(input_tokens + output_tokens), sum(shared_pending IS 1) FROM gateway_ledger"
            ).fetchone()
        assert flagged >= 40
        prefix = settings["redis_key_prefix"]
        r = redis_py.Redis.from_url(srv.url)
        try:  # the last pushes may still be under way: until the counter is the ledger's, or 15 s
            deadline = time.monotonic() + 15
            while (used := int(r.get(f"{prefix}:p:alpha:used:{int(time.time() // 86400)}"))) != tokens:
                assert time.monotonic() < deadline, f"Redis counts {used} tokens, the ledger {tokens}"
                await asyncio.sleep(0.05)
        finally:
            r.close()
        async with aiohttp.ClientSession() as s:  # nothing left to add (another worker's gauge: <= 1 s old)
            await until(s, "gateway_shared_pending_requests", lambda v: v == 0)
    finally:
        stop.set()
        if gw is not None:
            gw.stop()
        await fake.close()
        srv.kill()


@pytest.mark.service("postgresql")
async def test_two_workers_ride_out_a_hung_postgresql_under_load(tmp_path, pg_server, redis_server):
    """PostgreSQL hung (every process stopped, connections open) for 2 s under load on ``--workers 2``:
    every request is answered 200 within 1.5 s (the key verified lately serves from the last known good
    after one lookup deadline), and once it resumes every answer has its ledger row."""
    import psycopg

    fake = FakeUpstream()
    await fake.start()
    url = await pg_server.create_database()
    cfg = _config(tmp_path, fake.base_url, redis_server.url)
    settings = yaml.safe_load(cfg.read_text())
    settings |= {"database_url": url, "ledger_flush_interval_s": 0.1, "key_lookup_timeout_s": 0.5}
    cfg.write_text(yaml.safe_dump(settings))
    gw: Serve | None = None
    results: list[tuple[int, float]] = []
    stop = asyncio.Event()

    async def load(s: aiohttp.ClientSession, key: str) -> None:
        while not stop.is_set():
            t0 = time.perf_counter()
            status = await _chat(s, gw.url, key)
            results.append((status, time.perf_counter() - t0))

    def rows() -> int:
        dsn = pg_server.server.admin_dsn.rsplit("/", 1)[0] + "/" + url.rsplit("/", 1)[1]
        with psycopg.connect(dsn) as conn:
            return conn.execute("SELECT count(*) FROM gateway_ledger").fetchone()[0]

    try:
        key = await _create_key(cfg)
        gw = Serve(cfg, tmp_path, "pg-hung", "--workers", "2")
        async with aiohttp.ClientSession() as s:
            await gw.ready(s)
            await _worker_pids(s, gw.url, 2)
            loaders = [asyncio.create_task(load(s, key)) for _ in range(4)]
            while len(results) < 40:  # both workers have verified the key
                await asyncio.sleep(0.02)
            before = len(results)
            with pg_server.server.frozen():
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                hung = len(results) - before
            stop.set()
            await asyncio.gather(*loaders)
        assert hung >= 10, f"only {hung} requests answered while PostgreSQL hung"
        assert {st for st, _ in results} == {200}, sorted({st for st, _ in results})
        slowest = max(t for _, t in results)
        assert slowest < 1.5, f"a request took {slowest:.2f} s"
        deadline = time.monotonic() + 20
        while (n := await asyncio.to_thread(rows)) < len(results):  # written once it is back
            assert time.monotonic() < deadline, (n, len(results))
            await asyncio.sleep(0.1)
        assert n == len(results)
    finally:
        stop.set()
        if gw is not None:
            gw.stop()
        await fake.close()
