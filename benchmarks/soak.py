"""Soak: many requests through the gateway against a faulty upstream, with a SIGKILL of the gateway half-way.

Three kinds of process, as in gateway_bench: the fake upstream (testkit/gateway/fake_upstream.py in its
random fault mode), the gateway (``python -m gateway.ops.cli serve``) and this process, the aiohttp clients.

- Requests: ``requests`` of them, ``concurrency`` at a time, a fixed mix drawn from ``seed`` of chat
  completions, Responses and Messages (each streamed and not; OpenAI wire format with a Bearer key, Anthropic
  with x-api-key and anthropic-version) and a few count_tokens. A share (``bad_rate``) carries the fake's
  bad-request marker: the fake answers those 400, and the gateway must not send them again.
- Faults, drawn per upstream POST by the fake from ``seed``: 10 % 429, 5 % 503, 1 % stalls of ``stall_s``
  (past the providers' ``read_timeout_s``: before the status line, or after a few events / the first body
  byte) and 1 % connections closed after a few events (mid-body when not streamed).
- The kill: when half of the requests have their answer, the gateway gets SIGKILL and is started again at
  once on the same database and port. Decision: a client whose request fails on the connection (refused,
  reset, or an answer cut short) has received no response; it waits until the new process answers
  ``/readyz`` and sends the request again, as a new request (a fresh body, so neither the fake nor the ledger
  can take it for a retry). Only answers read whole count as received.
- Each logical request ends with the first response whose status line and whole body were read; every such
  response must carry ``x-request-id``. At the end the gateway is stopped gracefully (SIGINT: its ledger is
  flushed) and the ledger read back from the SQLite file.

Targets (each printed PASS/FAIL): every received response has its ledger row (by ``x-request-id``); no
gateway-caused 5xx (a 5xx, or an error event in a streamed 200, whose text does not say "upstream"); no
upstream POST answered 400 sent again; the most concurrent upstream requests the fake saw per path at most
the provider's ``max_connections``, and over all paths at most the project's ``max_concurrency`` plus the
count_tokens provider's connections (count_tokens is not admitted by the project limiter). Retry attempts per
request come from the ledger's ``retries`` column.

Until the ledger spools its rows before a response is finished, the rows still waiting in the writer's
buffer when the SIGKILL lands are lost: "missing ledger rows" then fails, as it should.

    .venv/bin/python -m benchmarks.soak [--requests N] [--concurrency C] [--seed S] [--no-kill]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from benchmarks.loops import install_uvloop
from testkit.gateway.fake_upstream import BAD_REQUEST_MARKER

ROOT = Path(__file__).resolve().parents[1]
SECRET = "soak-secret-0123456789abcdef"
PROJECT = "soak"
DEFAULT_FAULTS = {"429": 0.10, "503": 0.05, "stall": 0.01, "close": 0.01}

# kind -> (gateway path, public model, provider, API style, streamed, share of the mix)
KINDS: dict[str, tuple[str, str, str, str, bool, float]] = {
    "chat": ("/v1/chat/completions", "soak-gpt", "p_chat", "openai", False, 0.17),
    "chat_stream": ("/v1/chat/completions", "soak-gpt", "p_chat", "openai", True, 0.17),
    "responses": ("/v1/responses", "soak-resp", "p_resp", "openai", False, 0.14),
    "responses_stream": ("/v1/responses", "soak-resp", "p_resp", "openai", True, 0.14),
    "messages": ("/v1/messages", "soak-claude", "p_msgs", "anthropic", False, 0.17),
    "messages_stream": ("/v1/messages", "soak-claude", "p_msgs", "anthropic", True, 0.16),
    "count_tokens": ("/v1/messages/count_tokens", "soak-claude-ct", "p_ct", "anthropic", False, 0.05),
}


@dataclass
class SoakConfig:
    requests: int = 10_000
    concurrency: int = 64
    seed: int = 20250601
    fault_rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_FAULTS))
    bad_rate: float = 0.005  # requests the fake answers 400 (must not be retried)
    kill: bool = True  # SIGKILL the gateway when half of the requests are answered, then restart it
    read_timeout_s: float = 0.5  # the providers' read timeout
    stall_s: float = 1.2  # how long the fake stalls (past the read timeout)
    # Caps low enough to bind: with the fake answering after upstream_latency_s, the providers' pools and
    # the project's limit are full most of the time, so the concurrency check is not vacuous.
    upstream_latency_s: float = 0.015
    project_concurrency: int = 12  # the project's max_concurrency
    provider_connections: int = 4  # max_connections of the chat, responses and messages providers
    count_tokens_connections: int = 2  # max_connections of the count_tokens provider
    max_resends: int = 20  # connection failures one request may see before it is given up
    workdir: Path | None = None  # temp dir (config, database, logs); default: a fresh one
    verbose: bool = True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


class _Proc:
    """A server subprocess with its output in a log file (a pipe nobody reads would block it)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.cmd, self.env, self.log = name, cmd, env, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as out:
            out.write(f"--- start {' '.join(self.cmd)}\n")
            out.flush()
            self.proc = subprocess.Popen(
                self.cmd, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 30) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    async def wait_http(self, session: aiohttp.ClientSession, url: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{_tail(self.log)}")
            try:
                async with session.get(url) as r:
                    if r.status == 200:
                        return
            except (TimeoutError, aiohttp.ClientError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {url} not ready within {timeout:g} s:\n{_tail(self.log)}")
            await asyncio.sleep(0.02)


def gateway_config(cfg: SoakConfig, fake_port: int, gw_port: int, db: Path) -> dict:
    base = f"http://127.0.0.1:{fake_port}/v1"

    def provider(kind: str, conns: int) -> dict:
        return {
            "kind": kind,
            "base_url": base,
            "read_timeout_s": cfg.read_timeout_s,
            "connect_timeout_s": 2,
            "max_connections": conns,
        }

    n = cfg.provider_connections
    return {
        "host": "127.0.0.1",
        "port": gw_port,
        "database_url": f"sqlite+aiosqlite:///{db}",
        "providers": {
            "p_chat": provider("openai", n),
            "p_resp": provider("openai", n),
            "p_msgs": provider("anthropic", n),
            "p_ct": provider("anthropic", cfg.count_tokens_connections),
        },
        "models": {
            "soak-gpt": {"provider": "p_chat", "upstream_model": "gpt-up"},
            "soak-resp": {"provider": "p_resp", "upstream_model": "gpt-up-resp"},
            "soak-claude": {"provider": "p_msgs", "upstream_model": "claude-up"},
            "soak-claude-ct": {"provider": "p_ct", "upstream_model": "claude-up"},
        },
        "projects": {
            PROJECT: {
                "models": ["soak-gpt", "soak-resp", "soak-claude", "soak-claude-ct"],
                "max_concurrency": cfg.project_concurrency,
                "queue_timeout_s": 60,
                "default_task": "soak",
            }
        },
        # short waits so the soak measures the gateway, not its backoff
        "retry": {"max_retries": 3, "backoff_base_s": 0.01, "backoff_cap_s": 0.1, "jitter_s": 0.01},
    }


def caps(cfg: SoakConfig) -> dict[str, int]:
    """Upstream path -> the most concurrent requests the gateway may have on it; "all": over every path."""
    conns = {"p_chat": cfg.provider_connections, "p_resp": cfg.provider_connections}
    conns |= {"p_msgs": cfg.provider_connections, "p_ct": cfg.count_tokens_connections}
    out = {path: conns[prov] for path, _m, prov, *_ in KINDS.values()}
    out["all"] = min(sum(conns.values()), cfg.project_concurrency + cfg.count_tokens_connections)
    return out


def _body(kind: str, i: int, attempt: int, bad: bool) -> bytes:
    _path, model, _prov, _style, stream, _w = KINDS[kind]
    text = f"soak request {i} send {attempt}: summarise the FP8 GEMM anomaly in one line."
    if bad:
        text += f" {BAD_REQUEST_MARKER}"
    if kind.startswith("responses"):
        body: dict[str, Any] = {"model": model, "input": text, "max_output_tokens": 64}
    else:
        body = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 64}
    if kind == "count_tokens":
        body.pop("max_tokens")
    elif stream:
        body["stream"] = True
    return json.dumps(body).encode()


def gateway_caused(status: int, body: bytes, stream: bool) -> bool:
    """A 5xx whose body does not say the upstream failed, or a streamed 200 ending in such an error event."""
    if status >= 500:
        return b"upstream" not in body.lower()
    if status == 200 and stream:
        for line in body.split(b"\n"):
            if line.startswith(b"data:") and b'"error"' in line and b"upstream" not in line.lower():
                return True
    return False


def _stream_error(body: bytes) -> bool:
    return any(line.startswith(b"data:") and b'"error"' in line for line in body.split(b"\n"))


@dataclass
class _Client:
    cfg: SoakConfig
    gw_url: str
    key: str
    plan: list[tuple[str, bool]]
    up: asyncio.Event = field(default_factory=asyncio.Event)
    half: asyncio.Event = field(default_factory=asyncio.Event)
    killed_at: float | None = None
    done: int = 0
    received: list[dict] = field(default_factory=list)
    conn_errors: int = 0
    conn_errors_unexpected: int = 0  # while the gateway was meant to be up
    given_up: int = 0
    sends: int = 0

    def headers(self, style: str) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        if style == "anthropic":
            h |= {"x-api-key": self.key, "anthropic-version": "2023-06-01"}
        else:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    async def one(self, s: aiohttp.ClientSession, i: int) -> None:
        kind, bad = self.plan[i]
        path, _model, _prov, style, stream, _w = KINDS[kind]
        headers = self.headers(style)
        attempt = 0
        while True:
            await self.up.wait()
            self.sends += 1
            try:
                async with s.post(
                    self.gw_url + path, data=_body(kind, i, attempt, bad), headers=headers
                ) as r:
                    data = await r.read()
                    status, rid = r.status, r.headers.get("x-request-id")
                    limit = r.headers.get("x-farm-limit")
            except (TimeoutError, aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
                self.conn_errors += 1
                if self.up.is_set():
                    self.conn_errors_unexpected += 1
                    await asyncio.sleep(0.05)
                attempt += 1
                if attempt > self.cfg.max_resends:
                    self.given_up += 1
                    return
                continue
            break
        self.received.append(
            {
                "i": i,
                "kind": kind,
                "bad": bad,
                "status": status,
                "request_id": rid,
                "limit": limit,
                "resends": attempt,
                "gateway_caused": gateway_caused(status, data, stream),
                "stream_error": stream and status == 200 and _stream_error(data),
            }
        )
        self.done += 1
        if self.done >= len(self.plan) // 2:
            self.half.set()


async def _create_key(cfg_path: Path, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.ops.cli", "keys", "create", "--config", str(cfg_path),
        "--project", PROJECT, "--name", "soak",
        cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    if proc.returncode != 0 or not out.strip():
        raise RuntimeError(f"keys create failed ({proc.returncode}): {err.decode()[-2000:]}")
    return out.decode().strip().splitlines()[-1]


def _plan(cfg: SoakConfig) -> list[tuple[str, bool]]:
    rng = random.Random(cfg.seed)
    kinds = list(KINDS)
    weights = [KINDS[k][5] for k in kinds]
    plan = []
    for _ in range(cfg.requests):
        kind = rng.choices(kinds, weights)[0]
        plan.append((kind, kind != "count_tokens" and rng.random() < cfg.bad_rate))
    return plan


def _metric(text: str, name: str) -> float | None:
    """A sample's value from Prometheus text (``name`` or, for a counter, ``name_total``); None if absent."""
    for line in text.splitlines():
        if line.split(" ", 1)[0].split("{", 1)[0] in (name, name + "_total"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _ledger(db: Path) -> dict[str, tuple[int, int | None, str]]:
    con = sqlite3.connect(db)
    try:
        rows = con.execute("SELECT request_id, retries, http_status, status FROM gateway_ledger").fetchall()
    finally:
        con.close()
    return {rid: (retries, http_status, status) for rid, retries, http_status, status in rows}


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    """Run the soak and return its figures (``report`` formats them); raises when a server does not start."""
    work = cfg.workdir or Path(tempfile.mkdtemp(prefix="gwsoak-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_GATEWAY_")}
    env |= {"PYTHONPATH": str(ROOT), "FARM_GATEWAY_SECRET": SECRET}
    fake_port, gw_port = _free_port(), _free_port()
    db = work / "soak.db"
    cfg_path = work / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(gateway_config(cfg, fake_port, gw_port, db)))
    fake = _Proc(
        "fake upstream",
        [sys.executable, "-m", "testkit.gateway.fake_upstream", str(fake_port), "--fault-rates",
         json.dumps(cfg.fault_rates), "--seed", str(cfg.seed), "--stall-s", str(cfg.stall_s),
         "--latency-s", str(cfg.upstream_latency_s)],
        env, work / "fake.log",
    )  # fmt: skip
    gw = _Proc(
        "gateway",
        [sys.executable, "-m", "gateway.ops.cli", "serve", "--config", str(cfg_path), "--port", str(gw_port)],
        env,
        work / "gateway.log",
    )
    gw_url = f"http://127.0.0.1:{gw_port}"
    fake_url = f"http://127.0.0.1:{fake_port}"
    say = print if cfg.verbose else (lambda *a, **k: None)
    t_setup = time.perf_counter()
    fake.start()
    try:
        key = await _create_key(cfg_path, env)  # first: it creates the tables the gateway then finds
        gw.start()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as ctl:
            await fake.wait_http(ctl, f"{fake_url}/_fake/stats")
            await gw.wait_http(ctl, f"{gw_url}/readyz")
            setup_s = time.perf_counter() - t_setup
            client = _Client(cfg, gw_url, key, _plan(cfg))
            client.up.set()
            restart: dict[str, float | None] = {}

            async def killer() -> None:
                await client.half.wait()
                say(
                    f"  {client.done} answered: SIGKILL to the gateway (pid {gw.proc.pid}), restarting",
                    flush=True,
                )
                client.up.clear()
                client.killed_at = time.perf_counter()
                gw.kill()
                t0 = time.perf_counter()
                gw.start()
                await gw.wait_http(ctl, f"{gw_url}/readyz")
                restart["gap_s"] = time.perf_counter() - client.killed_at
                restart["start_s"] = time.perf_counter() - t0
                restart["answered_at_kill"] = client.done
                client.up.set()
                say(f"  gateway ready again after {restart['gap_s']:.2f} s", flush=True)

            todo = iter(range(cfg.requests))
            connector = aiohttp.TCPConnector(limit=cfg.concurrency)
            timeout = aiohttp.ClientTimeout(total=120, sock_connect=5)
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as s:

                async def worker() -> None:
                    for i in todo:
                        await client.one(s, i)

                kill_task = asyncio.create_task(killer()) if cfg.kill else None
                t0 = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(cfg.concurrency)))
                wall_s = time.perf_counter() - t0
                if kill_task is not None:
                    if not kill_task.done():
                        kill_task.cancel()
                    await asyncio.gather(kill_task, return_exceptions=True)
            async with ctl.get(f"{fake_url}/_fake/stats") as r:
                upstream = await r.json()
            async with ctl.get(f"{gw_url}/metrics") as r:  # of the process now running (the restarted one)
                replayed = _metric(await r.text(), "gateway_ledger_replayed_rows")
                restart["replayed_rows"] = int(replayed) if replayed is not None else None
        code = gw.stop(signal.SIGINT)  # graceful: flushes the ledger
        if code != 0:
            say(f"  (gateway stopped with exit code {code}:\n{_tail(gw.log, 10)})")
        rows = _ledger(db)
    finally:
        gw.stop(signal.SIGKILL, timeout=5)
        fake.stop(signal.SIGTERM, timeout=5)
    return figures(cfg, client, upstream, rows, wall_s, setup_s, restart, work)


def figures(
    cfg: SoakConfig,
    client: _Client,
    upstream: dict,
    rows: dict[str, tuple[int, int | None, str]],
    wall_s: float,
    setup_s: float,
    restart: dict[str, float | None],
    work: Path,
) -> dict[str, Any]:
    got = client.received
    ids = [g["request_id"] for g in got if g["request_id"]]
    found = [rows[rid] for rid in ids if rid in rows]
    retries = [r[0] for r in found]
    status_mismatch = sum(
        1 for g in got if g["request_id"] in rows and rows[g["request_id"]][1] != g["status"]
    )
    statuses = Counter(g["status"] for g in got)
    cap = caps(cfg)
    seen = dict(upstream.get("max_in_flight_by_path", {}))
    seen["all"] = upstream.get("max_in_flight", 0)
    over_cap = {p: n for p, n in seen.items() if n > cap.get(p, 0)}
    f: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "workdir": str(work),
        "wall_s": round(wall_s, 2),
        "setup_s": round(setup_s, 2),
        "requests_per_s": round(len(got) / wall_s, 1) if wall_s else None,
        "received": len(got),
        "given_up": client.given_up,
        "sends": client.sends,
        "without_request_id": len(got) - len(ids),
        "ledger_rows_total": len(rows),
        "ledger_rows_found": len(found),
        "missing_rows": len(ids) - len(found),
        "ledger_status_mismatch": status_mismatch,
        "gateway_caused_5xx": sum(1 for g in got if g["gateway_caused"]),
        "retried_400": upstream.get("retried_400"),
        "upstream_400": upstream.get("answered_400"),
        "client_400": statuses.get(400, 0),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "limiter_429": sum(1 for g in got if g["limit"]),
        "stream_error_events": sum(1 for g in got if g["stream_error"]),
        "conn_errors": client.conn_errors,
        "conn_errors_unexpected": client.conn_errors_unexpected,
        "resent_requests": sum(1 for g in got if g["resends"]),
        "restart": {k: round(v, 2) if v is not None else None for k, v in restart.items()},
        "upstream_requests": upstream.get("requests"),
        "upstream_requests_by_path": upstream.get("requests_by_path"),
        "faults_injected": upstream.get("injected"),
        "max_upstream_concurrency": seen,
        "concurrency_caps": cap,
        "over_cap": over_cap,
        "retries_mean": round(sum(retries) / len(retries), 3) if retries else None,
        "retries_max": max(retries) if retries else None,
        "retried_requests": sum(1 for r in retries if r),
    }
    f["targets"] = {
        "missing_rows": f["missing_rows"] == 0 and f["without_request_id"] == 0 and f["given_up"] == 0,
        "gateway_caused_5xx": f["gateway_caused_5xx"] == 0,
        "retried_400": f["retried_400"] == 0,
        "max_upstream_concurrency": not over_cap,
    }
    f["passed"] = all(f["targets"].values())
    return f


def report(f: dict[str, Any]) -> str:
    c = f["config"]
    t = f["targets"]

    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    rates = ", ".join(f"{k} {v:.0%}" for k, v in c["fault_rates"].items())
    lines = [
        f"soak: {f['received']:,} of {c['requests']:,} requests answered @{c['concurrency']} "
        f"in {f['wall_s']:.1f} s ({f['requests_per_s']} req/s; setup {f['setup_s']:.1f} s), seed {c['seed']}",
        f"upstream faults per POST: {rates}; bad requests {c['bad_rate']:.1%}; read timeout "
        f"{c['read_timeout_s']:g} s, stalls {c['stall_s']:g} s; upstream answers after "
        f"{c['upstream_latency_s'] * 1000:g} ms",
    ]
    if c["kill"]:
        r = f["restart"]
        lines.append(
            f"SIGKILL after {r.get('answered_at_kill', '?')} answers; "
            f"ready again after {r.get('gap_s', '?')} s; "
            f"{f['conn_errors']} connection errors ({f['conn_errors_unexpected']} while up), "
            f"{f['resent_requests']} requests sent again after the restart; the new process wrote "
            f"{r.get('replayed_rows', 'n/a')} rows of the old one from the ledger spool"
        )
    lines += [f"{'':52} {'measured':>10} {'target':>7}", "-" * 76]

    def row(name: str, value: Any, target: str = "", ok: bool | None = None) -> None:
        lines.append(f"{name:52} {value!s:>10} {target:>7}  {'' if ok is None else mark(ok)}".rstrip())

    row("responses received (status line + body)", f["received"])
    row("  without x-request-id", f["without_request_id"], "0", f["without_request_id"] == 0)
    row("  ledger rows with their request ids", f["ledger_rows_found"])
    row("  missing ledger rows", f["missing_rows"], "0", t["missing_rows"])
    row("  ledger http_status differs from client's", f["ledger_status_mismatch"])
    row("gateway-caused 5xx", f["gateway_caused_5xx"], "0", t["gateway_caused_5xx"])
    row("retried 400s (upstream POSTs sent again)", f["retried_400"], "0", t["retried_400"])
    row("  upstream 400s answered / clients got 400", f"{f['upstream_400']}/{f['client_400']}")
    cap, seen = f["concurrency_caps"], f["max_upstream_concurrency"]
    for path in sorted(cap, key=lambda p: (p == "all", p)):
        n = seen.get(path, 0)
        row(f"max upstream concurrency {path}", n, f"<= {cap[path]}", n <= cap[path])
    row("retries per request (ledger): mean / max", f"{f['retries_mean']} / {f['retries_max']}")
    row("  requests retried at least once", f["retried_requests"])
    row("statuses clients got", " ".join(f"{k}:{v}" for k, v in f["statuses"].items()))
    row("  429 from the gateway's own limits", f["limiter_429"])
    row("  streams ended by an error event", f["stream_error_events"])
    row("upstream POSTs / faults injected", f["upstream_requests"])
    lines.append("    " + ", ".join(f"{k} {v}" for k, v in sorted((f["faults_injected"] or {}).items())))
    lines.append(f"overall: {mark(f['passed'])}  (logs, config and database in {f['workdir']})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--seed", type=int, default=SoakConfig.seed)
    ap.add_argument("--no-kill", action="store_true", help="no SIGKILL and restart of the gateway")
    args = ap.parse_args(argv)
    install_uvloop()
    cfg = SoakConfig(
        requests=args.requests, concurrency=args.concurrency, seed=args.seed, kill=not args.no_kill
    )
    f = asyncio.run(run_soak(cfg))
    print(report(f))
    return f


if __name__ == "__main__":
    main()
