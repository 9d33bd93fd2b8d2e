"""``farm gateway serve`` refuses a bad setup before it serves, in one line naming the fix, with exit status 2
for the configuration and 4 for infrastructure (gateway.http.startup, gateway/README.md "Start-up errors"):
a database URL that is not one, an unknown or sync driver, a database that is down, missing or silent, a
``redis_url`` where nothing answers, a port another gateway serves (with ``--workers`` or not). ``--debug``
adds the traceback. A killed supervisor's metrics folder is removed by the next one. Real processes, a
real PostgreSQL and Redis, free ports."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.http.startup import port_lock_path
from tests.gateway.http.test_workers import Serve, _children, _config
from tests.gateway.serving import free_port

pytestmark = pytest.mark.slow  # gateway processes of their own


def _with(cfg: Path, **changes: object) -> Path:
    data = yaml.safe_load(cfg.read_text()) | changes
    cfg.write_text(yaml.safe_dump(data))
    return cfg


def _refused(gw: Serve, timeout: float = 30) -> tuple[int, str]:
    try:
        code = gw.proc.wait(timeout=timeout)
    finally:
        gw.stop()
    return code, gw.output()


def _one_line(out: str) -> str:
    """The output, asserted to be exactly one ``Error:`` line and no traceback."""
    assert "Traceback" not in out, out[-3000:]
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), out[-3000:]
    return lines[0]


def _silent_server() -> tuple[socket.socket, int]:
    """A port that accepts connections (the kernel's backlog) and never answers: a hung database."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    return sock, sock.getsockname()[1]


@pytest.mark.parametrize(
    ("case", "url", "status", "words"),
    [
        ("not a URL", "notaurl", 2, ["database_url 'notaurl' is not a database URL", "sqlite+aiosqlite"]),
        ("unknown driver", "mysql+nodriver://u:p@127.0.0.1/x", 2, ["unknown database driver 'mysql+no"]),
        ("sync driver", "postgresql+psycopg2://u:p@127.0.0.1/x", 2, ["is not an async driver"]),
        ("down", "postgresql+asyncpg://u:pw@127.0.0.1:{free}/x", 4, ["cannot connect to the data", "u:***@"]),
    ],
)
@pytest.mark.parametrize("workers", [[], ["--workers", "2"]], ids=["one process", "--workers 2"])
def test_a_bad_or_unreachable_database_is_one_line_and_its_status(
    tmp_path, redis_server, case, url, status, words, workers
):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", redis_server.url)
    cfg = _with(cfg, database_url=url.format(free=free_port()))
    code, out = _refused(Serve(cfg, tmp_path, "bad-db", *workers))
    line = _one_line(out)
    assert code == status, (case, out)
    for w in words:
        assert w in line, (case, line)
    assert "pw" not in line  # the password is never printed


@pytest.mark.service("postgresql")
def test_a_database_that_does_not_exist_is_named_with_the_fix(tmp_path, pg_server):
    cfg = _with(_config(tmp_path, "http://127.0.0.1:9/v1", None), database_url=pg_server.url("no_such_db"))
    code, out = _refused(Serve(cfg, tmp_path, "missing-db"))
    line = _one_line(out)
    assert code == 4 and "database 'no_such_db' does not exist" in line and "createdb no_such_db" in line, out


def test_a_silent_database_costs_its_deadline_then_one_line(tmp_path):
    sock, port = _silent_server()
    try:
        cfg = _with(
            _config(tmp_path, "http://127.0.0.1:9/v1", None),
            database_url=f"postgresql+asyncpg://u:p@127.0.0.1:{port}/x",
            database_connect_timeout_s=1,
        )
        started = time.monotonic()
        code, out = _refused(Serve(cfg, tmp_path, "silent-db"))
        took = time.monotonic() - started
    finally:
        sock.close()
    line = _one_line(out)
    assert code == 4 and "did not answer within 1 s" in line, out
    assert took < 20, took  # the 1 s deadline plus a process start, never asyncpg's own 60 s


def test_debug_adds_the_traceback(tmp_path):
    cfg = _with(
        _config(tmp_path, "http://127.0.0.1:9/v1", None),
        database_url=f"postgresql+asyncpg://u:p@127.0.0.1:{free_port()}/x",
    )
    code, out = _refused(Serve(cfg, tmp_path, "debug", "--debug"))
    assert code == 4 and "Traceback" in out
    assert out.strip().splitlines()[-1].startswith("Error: cannot connect")


def test_a_redis_url_where_nothing_answers_is_refused_unless_degraded_is_asked_for(tmp_path):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", f"redis://127.0.0.1:{free_port()}/0")
    code, out = _refused(Serve(cfg, tmp_path, "no-redis"))
    line = _one_line(out)
    assert code == 4 and "nothing answers at redis_url" in line and "redis_start_degraded: true" in line, out

    gw = Serve(_with(cfg, redis_start_degraded=True), tmp_path, "degraded")

    async def degraded() -> None:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 30
            while True:
                assert gw.proc.poll() is None, gw.output()[-3000:]
                try:
                    async with s.get(gw.url + "/readyz") as r:
                        if (await r.json()).get("status") == "degraded":
                            return
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, gw.output()[-3000:]
                await asyncio.sleep(0.05)

    try:
        asyncio.run(degraded())
    finally:
        gw.stop()


@pytest.mark.parametrize("second", [["--workers", "2"], []], ids=["--workers 2", "one process"])
async def test_a_port_another_gateway_serves_is_refused_and_the_first_goes_on(tmp_path, redis_server, second):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", redis_server.url)
    first = Serve(cfg, tmp_path, "first", "--workers", "2")
    try:
        async with aiohttp.ClientSession() as s:
            await first.ready(s)
            code, out = _refused(Serve(cfg, tmp_path, "second", *second, port=first.port))
            line = _one_line(out)
            assert code == 4 and f"already serves 127.0.0.1:{first.port}" in line, out
            assert f"pid {first.proc.pid}" in line and "--port" in line
            async with s.get(first.url + "/workerz") as r:  # only the first supervisor's workers answer
                assert (await r.json())["pid"] in _children(first.proc.pid)
        assert port_lock_path("127.0.0.1", first.port).exists()
        first.stop()
        assert not port_lock_path("127.0.0.1", first.port).exists()  # removed by its holder as it exits
    finally:
        first.stop()


async def test_a_killed_supervisors_metrics_folder_is_removed_by_the_next(tmp_path, redis_server):
    cfg = _config(tmp_path, "http://127.0.0.1:9/v1", redis_server.url)
    before = set(Path(tempfile.gettempdir()).glob("farm-gateway-metrics-*"))
    first = Serve(cfg, tmp_path, "killed", "--workers", "2")
    try:
        async with aiohttp.ClientSession() as s:
            await first.ready(s)
        made = set(Path(tempfile.gettempdir()).glob("farm-gateway-metrics-*")) - before
        mine = [f for f in made if str(first.proc.pid) in first.output() and str(f) in first.output()]
        assert len(mine) == 1, (made, first.output()[-2000:])
        os.kill(first.proc.pid, signal.SIGKILL)  # no cleanup: the folder stays behind
        first.proc.wait()
        assert mine[0].exists()
    finally:
        first.stop()
    nxt = Serve(cfg, tmp_path, "next", "--workers", "2")
    try:
        async with aiohttp.ClientSession() as s:
            await nxt.ready(s)
        assert not mine[0].exists()
        assert f"removed the metrics folder {mine[0]}" in nxt.output()
    finally:
        nxt.stop()
