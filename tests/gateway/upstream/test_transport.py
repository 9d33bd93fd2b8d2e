"""gateway.upstream.client (fair slots, retry loop) on gateway.upstream.transport (aiohttp), against real
servers on
127.0.0.1: scripted asyncio servers that read each request and answer with the bytes a test gives them,
the fake upstream (also behind TLS with a certificate made by openssl), and a CONNECT proxy."""

from __future__ import annotations

import asyncio
import gzip
import json
import shutil
import socket
import ssl
import subprocess
import time
from email.utils import formatdate

import aiohttp
import pytest
from aiohttp import web

from gateway.config import GatewaySettings, ProviderConfig, RetryConfig
from gateway.errors import (
    BadRequest,
    GatewayError,
    UpstreamDisconnected,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.limits.slots import FairSlots
from gateway.upstream.client import UpstreamClient, client_retry_after, pool_warnings
from testkit.gateway.fake_upstream import FakeUpstream, Fault

FAST_RETRY = RetryConfig(max_retries=2, backoff_base_s=0.01, backoff_cap_s=0.02, jitter_s=0.0)
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
JSON = {"Content-Type": "application/json"}


class Scripted:
    """A server that answers request i with ``answers[i]`` (bytes, or an async callable given the writer),
    keeps the connection unless told to close (``b""``: read the request, answer nothing, close), and
    records the connections and requests it saw."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{self.port}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(
                    next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))[15:]
                )
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                answer = self.answers.pop(0)
                if callable(answer):
                    await answer(writer)
                else:
                    writer.write(answer)
                    await writer.drain()
                if answer == b"" or (isinstance(answer, bytes) and b"Connection: close" in answer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def head_lines(self, i: int) -> list[str]:
        return self.requests[i][0].decode("latin-1").split("\r\n")

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def ok(body: bytes, extra: str = "", status: str = "200 OK") -> bytes:
    return f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def provider(url: str, **kw) -> ProviderConfig:
    kw.setdefault("connect_timeout_s", 2.0)
    kw.setdefault("read_timeout_s", 2.0)
    kw.setdefault("max_connections", 4)
    return ProviderConfig(kind="openai", base_url=url, **kw)


async def started(
    url: str, retry: RetryConfig = FAST_RETRY, key: str | None = "sk-test", **kw
) -> UpstreamClient:
    cfg = provider(url, **kw)
    client = UpstreamClient("up", cfg, retry, key, slots=FairSlots(cfg.max_connections))
    await client.start()
    return client


def assert_gateway_kind(err: BaseException, kind: type[GatewayError]) -> None:
    assert type(err) is kind, f"{type(err).__name__}: {err}"
    assert not isinstance(err, (aiohttp.ClientError, asyncio.TimeoutError))


@pytest.fixture
async def scripted():
    servers: list[Scripted] = []

    async def make(answers: list) -> tuple[Scripted, str]:
        srv = Scripted(answers)
        servers.append(srv)
        return srv, await srv.start()

    yield make
    for srv in servers:
        await srv.close()


# --- the wire --------------------------------------------------------------------------------------
async def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request(scripted):
    srv, url = await scripted([ok(b"one"), ok(b"two", "X-Request-Id: r2\r\n"), ok(b"three")])
    client = await started(url)
    try:
        got = []
        for i in range(3):
            res = await client.send("/chat/completions", b'{"i": %d}' % i, JSON, project="p")
            got.append((res.status, await res.response.read(), res.headers.get("x-request-id")))
            res.response.release()
            assert (res.retries, res.slot_wait_s) == (0, 0.0)
        assert got == [(200, b"one", None), (200, b"two", "r2"), (200, b"three", None)]
        assert srv.connections == 1
        lines = srv.head_lines(1)
        assert lines[0] == "POST /v1/chat/completions HTTP/1.1" and srv.requests[1][1] == b'{"i": 1}'
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if line)}
        assert headers["host"] == f"127.0.0.1:{srv.port}"
        assert headers["authorization"] == "Bearer sk-test"
        assert headers["content-type"] == "application/json" and headers["content-length"] == "8"
        assert headers["user-agent"] == "kernelfarm-gateway"
        assert "gzip" in headers["accept-encoding"]
        assert "cookie" not in headers
        assert client.slots.free == 4
    finally:
        await client.close()


async def _body(client) -> bytes:
    """One request's whole answer body (the connection back in the pool after)."""
    res = await client.send("/x", b"{}", JSON)
    try:
        return await res.response.read()
    finally:
        res.response.release()


async def test_a_chunked_body_arrives_piece_by_piece_then_the_connection_is_reused(scripted):
    step = asyncio.Event()

    async def chunked(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
        )
        writer.write(b"5\r\nfirst\r\n")
        await writer.drain()
        await step.wait()  # the second piece only after the client has read the first
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    srv, url = await scripted([chunked, ok(b"after")])
    client = await started(url)
    try:
        res = await client.send("/x", b"{}", JSON)
        r = res.response
        assert r.headers["content-type"] == "text/event-stream"
        assert await r.readany() == b"first"
        step.set()
        assert await r.content.readany() == b"second" and await r.readany() == b""
        r.release()
        assert await _body(client) == b"after" and srv.connections == 1
    finally:
        await client.close()


async def test_a_body_that_ends_with_the_connection_is_read_whole_and_not_reused(scripted):
    srv, url = await scripted([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", ok(b"next")])
    client = await started(url)
    try:
        assert await _body(client) == b"until the end"
        assert await _body(client) == b"next" and srv.connections == 2
    finally:
        await client.close()


async def test_a_gzip_encoded_body_is_decompressed(scripted):
    payload = json.dumps({"text": "kernel " * 2000}).encode()
    packed = gzip.compress(payload)
    srv, url = await scripted([ok(packed, "Content-Encoding: gzip\r\nContent-Type: application/json\r\n")])
    client = await started(url)
    try:
        assert len(packed) < len(payload) // 10
        assert await _body(client) == payload
    finally:
        await client.close()


# --- failures ----------------------------------------------------------------------------------------
async def test_connect_refused_is_unreachable_after_the_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once closed
    client = await started(f"http://127.0.0.1:{port}/v1")
    reasons: list[str] = []
    try:
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON, reasons.append, project="p")
        assert_gateway_kind(ei.value, UpstreamUnreachable)
        assert ei.value.status == 502 and ei.value.error_class == "unreachable"
        assert f"127.0.0.1:{port}" in ei.value.message and "after 2 retries" in ei.value.message
        assert "unreachable" in ei.value.message
        assert reasons == ["connect_error", "connect_error"] and ei.value.slot_wait_s == 0.0
        assert client.slots.free == 4  # no slot held across or after the retries
    finally:
        await client.close()


async def test_connect_timeout_is_unreachable_after_the_retries():
    # A listener with a full accept queue that never accepts: further SYNs go unanswered.
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers = []
    for _ in range(4):
        f = socket.socket()
        f.setblocking(False)
        try:
            f.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(f)
    await asyncio.sleep(0.05)
    client = await started(f"http://127.0.0.1:{port}/v1", connect_timeout_s=0.2)
    reasons: list[str] = []
    try:
        t0 = time.perf_counter()
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON, reasons.append)
        assert_gateway_kind(ei.value, UpstreamUnreachable)
        assert "connect timeout of 0.2 s" in ei.value.message
        assert reasons == ["connect_timeout", "connect_timeout"] and time.perf_counter() - t0 >= 0.55
    finally:
        await client.close()
        for f in fillers:
            f.close()
        lsock.close()


async def test_read_timeouts_before_the_head_and_mid_body_are_not_retried(scripted):
    async def silent(_w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(3)

    async def half(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await w.drain()
        await asyncio.sleep(3)

    srv, url = await scripted([silent, half])
    client = await started(url, read_timeout_s=0.3)
    try:
        t0 = time.perf_counter()
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON)
        assert_gateway_kind(ei.value, UpstreamTimeout)
        assert ei.value.status == 504 and "read timeout of 0.3 s" in ei.value.message
        assert 0.25 <= time.perf_counter() - t0 < 2 and len(srv.requests) == 1  # not retried

        res = await client.send("/x", b"{}", JSON)
        assert await res.response.readany() == b"0123456789"
        with pytest.raises(GatewayError) as ei:
            await res.response.readany()
        assert_gateway_kind(ei.value, UpstreamTimeout)
        assert client.slots.free == 4  # a failed read frees the slot; release() after it is harmless
        res.response.release()
        assert client.slots.free == 4
    finally:
        await client.close()


async def test_a_connection_dropped_mid_body_is_disconnected(scripted):
    async def drop(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789")
        await w.drain()
        w.transport.abort()

    srv, url = await scripted([drop])
    client = await started(url)
    try:
        res = await client.send("/x", b"{}", JSON)
        with pytest.raises(GatewayError) as ei:
            await res.response.read()
        assert_gateway_kind(ei.value, UpstreamDisconnected)
        assert ei.value.status == 502 and ei.value.error_class == "upstream_disconnected"
        assert client.slots.free == 4
    finally:
        await client.close()


async def test_a_connection_dropped_before_the_head_is_retried_and_a_malformed_answer_is_not(scripted):
    srv, url = await scripted([b"", ok(b"second try"), b"NOT HTTP AT ALL\r\n\r\n"])
    client = await started(url)
    reasons: list[str] = []
    try:
        res = await client.send("/x", b"{}", JSON, reasons.append)
        assert await res.response.read() == b"second try"
        res.response.release()
        assert (res.retries, reasons, len(srv.requests)) == (1, ["disconnected"], 2)
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON)
        assert_gateway_kind(ei.value, UpstreamDisconnected)
        assert "not valid HTTP" in ei.value.message and len(srv.requests) == 3
    finally:
        await client.close()


async def test_bodies_and_heads_over_the_caps_are_too_large(scripted):
    cap = 64 * 1024
    big = b"x" * (cap + 1)

    async def chunked_big(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(3):
            w.write(b"%x\r\n" % (cap // 2) + b"y" * (cap // 2) + b"\r\n")
        w.write(b"0\r\n\r\n")
        await w.drain()

    bomb = gzip.compress(b"\0" * (cap * 4))
    srv, url = await scripted(
        [
            ok(big),  # Content-Length over the cap: refused at the head
            chunked_big,  # no length: counted while reading
            ok(bomb, "Content-Encoding: gzip\r\n"),  # small on the wire, over the cap decompressed
            ok(b"{}", "X-Huge: " + "h" * 20000 + "\r\n"),  # a header line over the cap
        ]
    )
    client = await started(url, max_response_bytes=cap)
    try:
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON)
        assert_gateway_kind(ei.value, UpstreamTooLarge)
        assert f"{cap + 1} bytes" in ei.value.message and ei.value.status == 502
        for _ in range(2):
            res = await client.send("/x", b"{}", JSON)
            with pytest.raises(GatewayError) as ei:
                await res.response.read()
            assert_gateway_kind(ei.value, UpstreamTooLarge)
            assert f"limit of {cap} bytes" in ei.value.message
        assert len(bomb) < cap
        with pytest.raises(GatewayError) as ei:
            await client.send("/x", b"{}", JSON)
        assert_gateway_kind(ei.value, UpstreamTooLarge)
        assert "response head" in ei.value.message
        assert len(srv.requests) == 4 and client.slots.free == 4  # none retried, no slot lost
    finally:
        await client.close()


async def test_headers_that_cannot_be_sent_are_a_bad_request_naming_them(scripted):
    srv, url = await scripted([ok(b"fine")])
    client = await started(url)
    try:
        for headers, name in [
            ({"anthropic-beta": "x\r\nX-Injected: 1"}, "anthropic-beta"),
            ({"openai-beta": "caf\u00e9"}, "openai-beta"),
            ({"anthropic-version": "\u2603"}, "anthropic-version"),
            ({"bad name": "v"}, "bad name"),
            ({"Authorization": "Bearer client-key"}, "Authorization"),
        ]:
            with pytest.raises(BadRequest) as ei:
                await client.send("/x", b"{}", headers)
            assert ei.value.status == 400 and repr(name) in ei.value.message
        assert srv.requests == [] and client.slots.free == 4
        res = await client.send("/x", b"{}", {"anthropic-beta": "tools-2024-04-04"})
        assert await res.response.read() == b"fine"
        res.response.release()
    finally:
        await client.close()


async def test_close_drops_the_connection_and_the_upstream_sees_the_request_cancelled():
    fake = FakeUpstream()
    await fake.start()
    fake.faults.append(Fault(stall_after_events=2))
    client = await started(fake.base_url)
    try:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
        res = await client.send("/chat/completions", body.encode(), JSON)
        assert (await res.response.readany()).startswith(b"data: ")
        assert client.slots.free == 3  # a stream holds its slot to its end
        res.response.close()
        assert client.slots.free == 4
        await asyncio.wait_for(fake.cancelled_event.wait(), 5)
    finally:
        await client.close()
        await fake.close()


# --- https and proxies -----------------------------------------------------------------------------------
@pytest.fixture
def cert(tmp_path):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    crt, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return crt, key


@pytest.fixture
async def tls_fake(cert):
    crt, key = cert
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(crt, key)
    fake = FakeUpstream(record=False)
    await fake.start()
    site = web.TCPSite(fake._runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield fake, f"https://127.0.0.1:{port}/v1", str(crt)
    await fake.close()


@pytest.fixture
def no_proxy_env(monkeypatch):
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    return monkeypatch


async def _chat_ok(client: UpstreamClient) -> None:
    res = await client.send("/chat/completions", CHAT, JSON)
    answer = json.loads(await res.response.read())
    res.response.release()
    assert res.status == 200 and answer["object"] == "chat.completion"


async def test_https_with_a_ca_file_or_the_system_store_and_an_untrusted_certificate_refused(
    tls_fake, no_proxy_env
):
    fake, url, ca = tls_fake
    untrusted = await started(url)
    reasons: list[str] = []
    try:
        with pytest.raises(GatewayError) as ei:
            await untrusted.send("/chat/completions", CHAT, JSON, reasons.append)
        assert_gateway_kind(ei.value, UpstreamUnreachable)
        assert "not trusted" in ei.value.message and "ca_file" in ei.value.message
        assert reasons == []  # a certificate problem is not retried
    finally:
        await untrusted.close()

    own = await started(url, ca_file=ca)  # a provider's own CA bundle (config: ca_file)
    try:
        for _ in range(2):
            await _chat_ok(own)
        assert fake.requests == 2
    finally:
        await own.close()

    no_proxy_env.setenv("SSL_CERT_FILE", ca)  # the system trust store, as an operator sets it
    system = await started(url)
    try:
        await _chat_ok(system)
    finally:
        await system.close()


class ConnectProxy:
    """An HTTP proxy that only tunnels (CONNECT host:port), recording each tunnel's target."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        method, target, _ = head.split(b"\r\n", 1)[0].decode().split(" ")
        if method != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
            writer.close()
            return
        self.tunnels.append(target)
        host, port = target.rsplit(":", 1)
        up_r, up_w = await asyncio.open_connection(host, int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except ConnectionError:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_https_proxy_and_no_proxy_from_the_environment_are_honoured(tls_fake, no_proxy_env):
    fake, url, ca = tls_fake
    proxy = ConnectProxy()
    no_proxy_env.setenv("HTTPS_PROXY", await proxy.start())
    try:
        client = await started(url, ca_file=ca)
        try:
            await _chat_ok(client)
            await _chat_ok(client)
        finally:
            await client.close()
        port = url.split(":")[2].split("/")[0]
        assert proxy.tunnels == [f"127.0.0.1:{port}"]  # one tunnel, kept alive for both requests

        no_proxy_env.setenv("NO_PROXY", "127.0.0.1")
        direct = await started(url, ca_file=ca)
        try:
            await _chat_ok(direct)
        finally:
            await direct.close()
        assert len(proxy.tunnels) == 1 and fake.requests == 3
    finally:
        await proxy.close()


async def test_http_proxy_from_the_environment_gets_the_absolute_url(scripted, no_proxy_env):
    srv, proxy_url = await scripted([ok(b"via the proxy")])
    no_proxy_env.setenv("HTTP_PROXY", proxy_url.removesuffix("/v1"))
    client = await started("http://upstream.invalid:8080/v1")  # resolvable only by the proxy
    try:
        res = await client.send("/chat/completions", CHAT, JSON)
        assert await res.response.read() == b"via the proxy"
        res.response.release()
        assert srv.head_lines(0)[0] == "POST http://upstream.invalid:8080/v1/chat/completions HTTP/1.1"
    finally:
        await client.close()


# --- fairness ----------------------------------------------------------------------------------------------
class Slow:
    """An upstream that answers each request after ``delay_s``, recording the order requests arrived in."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.arrivals: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        app = web.Application()
        app.router.add_post("/v1/x", self._handle)
        self.runner = web.AppRunner(app)

    async def _handle(self, request: web.Request) -> web.Response:
        self.arrivals.append((await request.json())["who"])
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return web.json_response({"ok": True})

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"


async def test_a_project_flooding_the_pool_does_not_starve_another_projects_single_request():
    slow = Slow(0.2)
    url = await slow.start()
    client = await started(url, max_connections=2)

    async def one(project: str, who: str) -> float:
        res = await client.send("/x", json.dumps({"who": who}).encode(), JSON, project=project)
        await res.response.read()
        res.response.release()
        return res.slot_wait_s

    try:
        flood = [asyncio.create_task(one("A", f"A{i}")) for i in range(10)]
        await asyncio.sleep(0.05)  # A holds both slots, eight more of its requests wait
        assert client.slots.held("A") == 2 and client.slots.waiting == 8
        t0 = time.perf_counter()
        b_wait = await one("B", "B")
        b_total = time.perf_counter() - t0
        await asyncio.gather(*flood)
        # B went out as soon as one of A's requests finished, not behind A's eight waiting ones.
        assert slow.arrivals.index("B") == 2, slow.arrivals
        assert 0.05 <= b_wait < 0.6 and b_total < 1.0  # first-come-first-served: ~0.95 s
        assert slow.max_in_flight == 2 and client.slots.free == 2
    finally:
        await client.close()
        await slow.runner.cleanup()


async def test_fair_slots_share_freed_slots_and_survive_cancelled_waiters():
    slots = FairSlots(1)
    assert await slots.acquire("A") == 0.0
    a2 = asyncio.create_task(slots.acquire("A"))
    c1 = asyncio.create_task(slots.acquire("C"))
    b1 = asyncio.create_task(slots.acquire("B"))
    await asyncio.sleep(0.01)
    c1.cancel()  # gave up while waiting
    await asyncio.sleep(0)
    slots.release("A")
    await asyncio.sleep(0.01)
    # A and B now hold none: B (never served) goes before A (served once); C's cancelled wait is skipped.
    assert b1.done() and not a2.done()
    slots.release("B")
    await asyncio.sleep(0.01)
    assert a2.done() and slots.held("A") == 1 and slots.free == 0
    # A slot granted to a waiter that is cancelled before it runs is passed on, not lost.
    d = asyncio.create_task(slots.acquire("D"))
    e = asyncio.create_task(slots.acquire("E"))
    await asyncio.sleep(0.01)
    slots.release("A")  # granted to D...
    d.cancel()  # ...which is cancelled before it could run
    await asyncio.sleep(0.01)
    assert e.done() and slots.held("E") == 1 and slots.held("D") == 0
    slots.release("E")
    assert slots.free == 1 and slots.waiting == 0


def test_pool_warnings_name_the_providers_whose_pool_is_below_their_projects_concurrency():
    settings = GatewaySettings(
        providers={
            "small": {"kind": "openai", "base_url": "http://127.0.0.1:1/v1", "max_connections": 10},
            "big": {"kind": "anthropic", "base_url": "http://127.0.0.1:1", "max_connections": 100},
        },
        models={
            "s": {"provider": "small", "upstream_model": "s"},
            "b": {"provider": "big", "upstream_model": "b"},
        },
        projects={
            "flood": {"models": ["s", "b"], "max_concurrency": 40},
            "one": {"models": ["s"], "max_concurrency": 2},
        },
    )
    (line,) = pool_warnings(settings)
    assert "'small'" in line and "max_connections 10" in line and "42" in line and "flood 40" in line


# --- retries and Retry-After -----------------------------------------------------------------------------
def test_client_retry_after_is_whole_seconds_and_at_least_one():
    assert client_retry_after({}) is None
    assert client_retry_after({"Retry-After": "0"}) == "1"
    assert client_retry_after({"Retry-After": "2.1"}) == "3"
    assert client_retry_after({"retry-after-ms": "10"}) == "1"
    assert client_retry_after({"retry-after-ms": "90200"}) == "91"
    assert client_retry_after({"Retry-After": formatdate(time.time() - 3600, usegmt=True)}) == "1"
    in_30s = formatdate(time.time() + 30, usegmt=True)
    assert client_retry_after({"Retry-After": in_30s}) in ("29", "30", "31")


async def test_400_is_never_retried_and_429_5xx_are(scripted):
    err = b'{"error": {"message": "bad"}}'
    srv, url = await scripted(
        [
            ok(err, status="400 Bad Request"),
            ok(b"", "Retry-After: 0\r\n", status="429 Too Many Requests"),
            ok(b"", status="503 Service Unavailable"),
            ok(b"done"),
            *[ok(b"busy", status="503 Service Unavailable")] * 3,
        ]
    )
    client = await started(url)
    reasons: list[str] = []
    try:
        res = await client.send("/x", b"{}", JSON, reasons.append)
        assert (res.status, res.body, res.retries, res.response) == (400, err, 0, None)
        assert len(srv.requests) == 1 and reasons == []

        res = await client.send("/x", b"{}", JSON, reasons.append)
        assert res.status == 200 and await res.response.read() == b"done"
        res.response.release()
        assert (res.retries, res.retry_reasons, reasons) == (2, ["429", "503"], ["429", "503"])

        res = await client.send("/x", b"{}", JSON)  # retries exhausted: the last answer is passed on
        assert (res.status, res.body, res.retries) == (503, b"busy", 2)
        assert len(srv.requests) == 7 and client.slots.free == 4
    finally:
        await client.close()


async def test_a_long_retry_after_is_handed_to_the_client_not_waited_out(scripted):
    srv, url = await scripted([ok(b"", "Retry-After: 90\r\n", status="429 Too Many Requests")])
    client = await started(url)
    try:
        t0 = time.perf_counter()
        res = await client.send("/x", b"{}", JSON)
        assert (res.status, res.retries) == (429, 0) and time.perf_counter() - t0 < 1
        assert client_retry_after(res.headers) == "90"
    finally:
        await client.close()
