"""Helpers for the observability tests: the shipped dashboards and rules, PromQL names, a real Prometheus,
and a gateway with its fake upstream on a background event loop (so sync tests and Ray can run beside it).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[2]
GRAFANA = REPO / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")

# tests/conftest.py checks the mark before the test runs: missing, it fails in CI and skips elsewhere
needs_promtool = needs_prometheus = pytest.mark.service("prometheus")


# ---- dashboards -----------------------------------------------------------------------------------
def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(board: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in board["panels"]:
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def queries() -> list[tuple[str, str, dict[str, Any]]]:
    """(dashboard file, panel title, target) for every Prometheus query of every shipped dashboard."""
    return [
        (name, panel["title"], target)
        for name, board in dashboards().items()
        for panel in panels(board)
        for target in panel.get("targets", [])
        if target.get("expr")
    ]


def substitute(expr: str, *, rate_interval: str = "4s", range_: str = "1h") -> str:
    """What Grafana sends: its interval macros filled in, every template variable at `All` (.*)."""
    expr = expr.replace("$__rate_interval", rate_interval).replace("${__rate_interval}", rate_interval)
    expr = expr.replace("$__range", range_).replace("${__range}", range_)
    expr = expr.replace("$__interval", "1s").replace("${__interval}", "1s")
    return re.sub(r"\$\{?[A-Za-z_]\w*\}?", ".*", expr)


_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
    "and", "or", "unless", "atan2", "inf", "nan", "start", "end",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """Names of the vector selectors in a PromQL expression that `promtool` has already parsed.

    Strings, label matchers, ranges, grouping clauses and numbers are cut out first; what is left is
    function and aggregation names (followed by `(`), keywords and the metric names.
    """
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"\{[^{}]*\}", " ", s)
    s = re.sub(r"\[[^\[\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", s)
    s = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", s)
    s = re.sub(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+)", " ", s)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][\w:]*", s):
        if re.match(r"\s*\(", s[m.end() :]) or m.group(0).lower() in _KEYWORDS:
            continue
        names.add(m.group(0))
    return names


def exported_sample_names(exposition: str) -> set[str]:
    """Every sample name a /metrics page can carry, from its declared families (samples or not)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_count", "_sum", "_created"),
        "summary": ("", "_count", "_sum", "_created"),
        "gauge": ("",),
        "info": ("_info",),
    }
    names: set[str] = set()
    for fam in text_string_to_metric_families(exposition):
        names.update(fam.name + s for s in suffixes.get(fam.type, ("",)))
        names.update(s.name for s in fam.samples)
    return names


def http_get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- a real Prometheus ----------------------------------------------------------------------------
class Prometheus:
    """`prometheus` on 127.0.0.1 with a config derived from the shipped one, storage in a temp dir."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = workdir / "prometheus.log"
        self._log = self.log_path.open("wb")
        assert PROMETHEUS is not None
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                urllib.request.urlopen(f"{self.url}/-/ready", timeout=1).close()
                return
            except (urllib.error.URLError, OSError):
                time.sleep(0.1)
        raise TimeoutError(f"prometheus not ready in {timeout} s:\n{self.log_tail()}")

    def api(self, path: str, **params: Any) -> Any:
        url = f"{self.url}/api/v1/{path}"
        data = urllib.parse.urlencode(params).encode() if params else None
        try:
            with urllib.request.urlopen(url, data=data, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:
            body = json.load(e)
        if body.get("status") != "success":
            raise ValueError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets")["activeTargets"]

    def wait_targets_up(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            targets = self.targets()
            if targets and all(t["health"] == "up" for t in targets):
                return
            time.sleep(0.2)
        health = [(t["scrapeUrl"], t["health"], t.get("lastError")) for t in targets]
        raise TimeoutError(f"targets not up in {timeout} s: {health}")

    def wait_scraped_after(self, t: float, timeout: float = 20) -> None:
        """Until every target has been scraped at or after wall time `t` (read from `up`'s timestamps)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.api("query", query="min(timestamp(up))")["result"]
            if result and float(result[0]["value"][1]) >= t:
                return
            time.sleep(0.2)
        raise TimeoutError(f"not every target was scraped after {t} within {timeout} s")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self._log.close()


def has_finite_value(result: dict[str, Any]) -> bool:
    """A query result (vector or matrix) with at least one sample that is a number, not NaN/Inf."""
    for series in result["result"]:
        values = series.get("values") or [series["value"]]
        if any(math.isfinite(float(v)) for _, v in values):
            return True
    return False


# ---- the gateway on a background loop -------------------------------------------------------------
def _gateway_test_helpers() -> Any:
    """tests/gateway/conftest.py as a plain module (its make_settings builds the test gateway config)."""
    name = "kf_gateway_test_helpers"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "tests" / "gateway" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


class LiveGateway:
    """A fake upstream and a gateway app served from an event loop on its own thread."""

    def __init__(self, db_path: Path, *, upstream_latency_s: float = 0.0, **overrides: Any) -> None:
        from testkit.gateway.fake_upstream import FakeUpstream

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="live-gateway", daemon=True)
        self.thread.start()
        self.fake = FakeUpstream(latency_s=upstream_latency_s, record=False)
        self.keys: dict[str, str] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.call(lambda: self._start(db_path, overrides), timeout=30)

    async def _start(self, db_path: Path, overrides: dict[str, Any]) -> None:
        from gateway.http.app import GATEWAY, create_app

        helpers = _gateway_test_helpers()
        await self.fake.start()
        app = create_app(helpers.make_settings(self.fake, db_path, **overrides))
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        for project in ("alpha", "beta"):
            self.keys[project], _ = await app[GATEWAY].keys.create(project, "observability-test")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def submit(self, make: Callable[[], Awaitable[Any]]) -> Future:
        async def run() -> Any:
            return await make()

        return asyncio.run_coroutine_threadsafe(run(), self.loop)

    def call(self, make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
        return self.submit(make).result(timeout=timeout)

    def stop(self) -> None:
        async def close() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            await self.fake.close()

        try:
            self.call(close, timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.loop.close()
