"""A fake upstream: a real aiohttp server speaking OpenAI chat, Responses and Anthropic Messages.

Streams included. Faults are queued per request (``fake.faults.append(Fault(...))``): an error status with
an optional Retry-After, a slow first byte, a stall before the headers or mid-body (held until
``fake.release`` is set), or a dropped connection. Used by tests/gateway and benchmarks/gateway_bench.py.

Random fault mode (benchmarks/soak.py): ``FakeUpstream(fault_rates={"429": 0.1, "503": 0.05, "stall": 0.01,
"close": 0.01}, seed=1)`` draws a fault per POST from ``random.Random(seed)``: an error status, a stall of
``stall_s`` (before the status line, or after some events / the first body byte), or the connection closed
after some events (mid-body when not streamed). A body containing ``BAD_REQUEST_MARKER`` is answered 400,
and a POST repeating a body answered 400 before is counted in ``retried_400``. ``stats()`` (also
``GET /_fake/stats``) gives the counts, including the most concurrent requests seen per path. As a process:
``python -m testkit.gateway.fake_upstream PORT --fault-rates '{"429": 0.1}' --seed 1 --stall-s 1.2``.

Usage it reports is deterministic and logged in ``fake.usage_log`` so tests can compare ledger rows.

Prompt caching: ``FakeUpstream(prompt_cache=PromptCache())`` reports a Messages request's cache reads and
writes as Anthropic does, from the ``cache_control`` breakpoints it carries (testkit.gateway.prompt_cache);
without it, the fixed ``cache_read_tokens`` / ``cache_write_tokens`` set by a test.

Tool calls: with ``fake.tool_call = {...}`` (the arguments), a chat or Messages request that defines tools is
answered (whole or streamed) with one call of its first tool, with those arguments, instead of text.

The answers are shaped in testkit.gateway.fake_apis (``FakeAPIs``, which ``FakeUpstream`` extends); this
module is the server: requests counted and recorded, faults queued or drawn and played on the wire, stats.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from testkit.gateway.fake_apis import FakeAPIs
from testkit.gateway.prompt_cache import PromptCache


@dataclass
class Fault:
    status: int = 200  # != 200: answer this error status
    retry_after: str | None = None
    first_byte_delay_s: float = 0.0  # sleep before the status line
    stall_before_headers: bool = False  # wait for ``release`` before the status line
    stall_after_events: int | None = None  # stream: after N events (non-stream: after headers) wait
    drop: bool = False  # close the connection without answering
    omit_usage: bool = False  # report no usage at all (the gateway must estimate)
    headers: dict[str, str] | None = None  # extra headers on an error answer (e.g. retry-after-ms)
    error_body: dict | None = None  # an error answer's JSON body instead of the default (a context error)
    usage: dict | None = None  # non-streamed answer: merged into the usage reported (e.g. absurd counts)
    # used by the random fault mode; the pause is timed (no ``release`` needed)
    close_after_events: int | None = None  # stream: close the connection after N events (else mid-body)
    pause_after_events: int | None = None  # stream: after N events (else after 1 body byte) sleep pause_s
    pause_s: float = 0.0

    def broken(self) -> bool:
        return self.close_after_events is not None or self.pause_after_events is not None


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict


BAD_REQUEST_MARKER = "fake-upstream-bad-request"  # fault mode: a body containing it is answered 400
FAULT_KINDS = ("429", "503", "stall", "close")


class FakeUpstream(FakeAPIs):
    def __init__(
        self,
        *,
        latency_s: float = 0.0,
        record: bool = True,
        fault_rates: dict[str, float] | None = None,
        seed: int = 0,
        stall_s: float = 1.2,
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self.latency_s = latency_s
        self.record = record
        self.faults: deque[Fault] = deque()
        # Non-streamed chat/messages answer text: called with the request body; None: numbered words.
        # A queue of texts (``replies``) is used first, one per request.
        self.reply: Callable[[dict], str] | None = None
        self.replies: deque[str] = deque()
        # When set: a chat/Messages request with tools is answered by a call of its first tool with these
        # arguments (its id: call_<n> / toolu_<n>).
        self.tool_call: dict | None = None
        self.agent = None  # FakeAPIs.agent
        self.seen: list[Seen] = []
        self.usage_log: list[tuple[str, bool, int, int]] = []  # (path, stream, input, output)
        # Prompt caching to report: OpenAI's cached tokens (a part of the input, at most all of it);
        # Anthropic's cache_read_input_tokens and cache_creation_input_tokens (besides input_tokens).
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        # Anthropic's prompt cache played on Messages requests (breakpoints, reads and writes counted as
        # Anthropic does, testkit.gateway.prompt_cache); None: the fixed counts above
        self.prompt_cache = prompt_cache
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests_by_path: dict[str, int] = {}
        self.in_flight_by_path: dict[str, int] = {}
        self.max_in_flight_by_path: dict[str, int] = {}
        # random fault mode (None: off): kind ("429", "503", "stall", "close") -> probability per POST
        self.fault_rates = dict(fault_rates) if fault_rates is not None else None
        self.stall_s = stall_s
        self._rng = random.Random(seed)
        self.injected: dict[str, int] = {}
        self.answered_400 = 0
        self.retried_400 = 0
        self._bodies_400: set[bytes] = set()
        self.requests = 0
        self.cancelled = 0
        self.cancelled_event = asyncio.Event()
        self.release = asyncio.Event()
        self._seq = 0
        self._runner: web.AppRunner | None = None
        self.port = 0
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/v1/messages", self._messages)
        app.router.add_post("/v1/messages/count_tokens", self._count_tokens)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/_fake/stats", self._stats)
        self.app = app

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        self._runner = web.AppRunner(self.app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self.base_url

    async def close(self) -> None:
        self.release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- plumbing --------------------------------------------------------------------------------
    async def _enter(self, request: web.Request, anthropic: bool) -> tuple[dict, int, Fault | None]:
        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        path = request.path
        self.requests_by_path[path] = self.requests_by_path.get(path, 0) + 1
        self.in_flight_by_path[path] = self.in_flight_by_path.get(path, 0) + 1
        self.max_in_flight_by_path[path] = max(
            self.max_in_flight_by_path.get(path, 0), self.in_flight_by_path[path]
        )
        body = await request.json()
        if self.record:
            self.seen.append(Seen(request.path, dict(request.headers), body))
        self._seq += 1
        fault = self.faults.popleft() if self.faults else None
        if fault is None and self.fault_rates is not None:
            fault = await self._draw_fault(request)
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if fault is not None:
            if fault.first_byte_delay_s:
                await asyncio.sleep(fault.first_byte_delay_s)
            if fault.stall_before_headers:
                await self.release.wait()
            if fault.drop:
                assert request.transport is not None
                request.transport.close()
                raise asyncio.CancelledError
        return body, self._seq, fault

    def _error(self, fault: Fault, anthropic: bool) -> web.Response:
        msg = f"fake upstream error {fault.status}"
        if anthropic:
            body = {"type": "error", "error": {"type": "api_error", "message": msg}}
        else:
            body = {"error": {"message": msg, "type": "server_error", "param": None, "code": None}}
        if fault.error_body is not None:
            body = fault.error_body
        headers = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        headers.update(fault.headers or {})
        return web.json_response(body, status=fault.status, headers=headers)

    async def _wrap(self, request: web.Request, anthropic: bool, make) -> web.StreamResponse:
        try:
            body, seq, fault = await self._enter(request, anthropic)
            if fault is not None and fault.status != 200:
                return self._error(fault, anthropic)
            return await make(request, body, seq, fault)
        except (asyncio.CancelledError, ConnectionResetError):
            self.cancelled += 1
            self.cancelled_event.set()
            raise
        finally:
            self.in_flight -= 1
            self.in_flight_by_path[request.path] -= 1

    async def _send_json(self, request: web.Request, obj: dict, fault: Fault | None, rid: str, hdr: str):
        if fault is not None and fault.broken():
            return await self._send_json_broken(request, obj, fault, rid, hdr)
        if fault is not None and fault.omit_usage:
            obj = {k: v for k, v in obj.items() if k != "usage"}
        if fault is not None and fault.usage and isinstance(obj.get("usage"), dict):
            obj = {**obj, "usage": {**obj["usage"], **fault.usage}}
        data = json.dumps(obj).encode()
        if fault is not None and fault.stall_after_events is not None:
            resp = web.StreamResponse(headers={"Content-Type": "application/json", hdr: rid})
            resp.content_length = len(data)
            await resp.prepare(request)
            await resp.write(data[:1])
            await self.release.wait()
            await resp.write(data[1:])
            await resp.write_eof()
            return resp
        return web.Response(body=data, content_type="application/json", headers={hdr: rid})

    async def _send_stream(
        self, request: web.Request, events: list[bytes], fault: Fault | None, rid: str, hdr: str
    ) -> web.StreamResponse:
        if fault is not None and fault.broken():
            return await self._send_stream_broken(request, events, fault, rid, hdr)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", hdr: rid})
        await resp.prepare(request)
        stall_at = fault.stall_after_events if fault is not None else None
        if fault is not None and fault.omit_usage:
            events = [e for e in events if b'"usage":{' not in e]
        for i, ev in enumerate(events):
            if stall_at is not None and i == stall_at:
                await self.release.wait()
            await resp.write(ev)
        await resp.write_eof()
        return resp

    # --- random fault mode -----------------------------------------------------------------------
    async def _draw_fault(self, request: web.Request) -> Fault | None:
        assert self.fault_rates is not None
        raw = await request.read()  # already read by request.json(): cached
        if raw in self._bodies_400:
            self.retried_400 += 1
        if BAD_REQUEST_MARKER.encode() in raw:
            self._bodies_400.add(raw)
            self.answered_400 += 1
            return self._injected("400", Fault(status=400))
        r = self._rng.random()
        for kind in FAULT_KINDS:
            rate = self.fault_rates.get(kind, 0.0)
            if r >= rate:
                r -= rate
                continue
            if kind == "429":
                fault = Fault(status=429, retry_after="0", headers={"retry-after-ms": "20"})
                return self._injected(kind, fault)
            if kind == "503":
                return self._injected(kind, Fault(status=503))
            if kind == "stall":
                if self._rng.random() < 0.5:
                    return self._injected("stall_before_headers", Fault(first_byte_delay_s=self.stall_s))
                n = self._rng.randint(1, 3)
                return self._injected("stall_mid_body", Fault(pause_after_events=n, pause_s=self.stall_s))
            if request.path.endswith("/count_tokens"):  # its answer is one small JSON: no middle to cut
                return self._injected("close_before_answer", Fault(drop=True))
            return self._injected("close_mid_body", Fault(close_after_events=self._rng.randint(1, 3)))
        return None

    def _injected(self, kind: str, fault: Fault) -> Fault:
        self.injected[kind] = self.injected.get(kind, 0) + 1
        return fault

    async def _send_stream_broken(
        self, request: web.Request, events: list[bytes], fault: Fault, rid: str, hdr: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", hdr: rid})
        await resp.prepare(request)
        for i, ev in enumerate(events):
            if i == fault.close_after_events:
                assert request.transport is not None
                request.transport.close()  # what was written still goes out, then the FIN
                raise asyncio.CancelledError
            if i == fault.pause_after_events:
                await asyncio.sleep(fault.pause_s)
            await resp.write(ev)
        await resp.write_eof()
        return resp

    async def _send_json_broken(
        self, request: web.Request, obj: dict, fault: Fault, rid: str, hdr: str
    ) -> web.StreamResponse:
        data = json.dumps(obj).encode()
        resp = web.StreamResponse(headers={"Content-Type": "application/json", hdr: rid})
        resp.content_length = len(data)
        await resp.prepare(request)
        if fault.close_after_events is not None:
            await resp.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError
        await resp.write(data[:1])
        await asyncio.sleep(fault.pause_s)
        await resp.write(data[1:])
        await resp.write_eof()
        return resp

    def stats(self) -> dict:
        """Counts for a soak: requests and the most concurrent requests per path, faults injected, 400s."""
        return {
            "requests": self.requests,
            "requests_by_path": dict(self.requests_by_path),
            "max_in_flight": self.max_in_flight,
            "max_in_flight_by_path": dict(self.max_in_flight_by_path),
            "injected": dict(self.injected),
            "answered_400": self.answered_400,
            "retried_400": self.retried_400,
            "cancelled": self.cancelled,
        }

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response(self.stats())


async def _main(port: int) -> None:  # pragma: no cover - used by the benchmark as a subprocess
    fake = FakeUpstream(record=False)
    await fake.start(port=port)
    print(f"FAKE_READY {fake.port}", flush=True)
    await asyncio.Event().wait()


async def _main_options(argv: list[str]) -> None:  # pragma: no cover - benchmarks/soak.py's subprocess
    import argparse

    ap = argparse.ArgumentParser(prog="python -m testkit.gateway.fake_upstream")
    ap.add_argument("port", nargs="?", type=int, default=0)
    ap.add_argument("--fault-rates", default=None, help='JSON, e.g. {"429": 0.1, "503": 0.05}')
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stall-s", type=float, default=1.2)
    ap.add_argument("--latency-s", type=float, default=0.0)
    args = ap.parse_args(argv)
    rates = json.loads(args.fault_rates) if args.fault_rates is not None else None
    fake = FakeUpstream(
        record=False, fault_rates=rates, seed=args.seed, stall_s=args.stall_s, latency_s=args.latency_s
    )
    await fake.start(port=args.port)
    print(f"FAKE_READY {fake.port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":  # pragma: no cover
    import os
    import sys

    if os.environ.get("FARM_GATEWAY_UVLOOP", "1").lower() not in ("0", "false", "no"):
        try:
            import uvloop  # type: ignore[import-not-found]

            uvloop.install()
        except ImportError:
            pass
    if any(a.startswith("--") for a in sys.argv[1:]):  # options: the fault mode (benchmarks/soak.py)
        sys.exit(asyncio.run(_main_options(sys.argv[1:])))
    asyncio.run(_main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
