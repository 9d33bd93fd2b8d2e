"""gateway.http1, the upstream transport, against scripted HTTP servers on 127.0.0.1 (asyncio servers
that read each request and answer with the bytes a test gives them) and, for https, the fake upstream
behind TLS with a self-signed certificate made by openssl."""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess

import pytest

from gateway.http1 import ConnectFailed, Disconnected, Pool, ReadTimeout
from gateway.testing.fake_upstream import FakeUpstream


class Scripted:
    """A server that answers request i with `answers[i]` (bytes, or a callable given the writer), keeps
    the connection unless told to close, and records the connections and requests it saw."""

    def __init__(self, answers: list) -> None:
        self.answers = list(answers)
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

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

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()


def ok(body: bytes, extra: str = "") -> bytes:
    return f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


async def _pool(answers: list, **kw) -> tuple[Scripted, Pool]:
    srv = Scripted(answers)
    url = await srv.start()
    return srv, Pool(url, connect_timeout=kw.get("connect", 2.0), read_timeout=kw.get("read", 2.0), limit=4)


async def test_keep_alive_reuses_one_connection_and_sends_a_well_formed_request():
    srv, pool = await _pool([ok(b"one"), ok(b"two", "X-Request-Id: r2\r\n"), ok(b"three")])
    try:
        got = []
        for i in range(3):
            r = await pool.post("/chat/completions", b'{"i": %d}' % i, {"Content-Type": "application/json"})
            got.append((r.status, await r.read(), r.headers.get("x-request-id")))
            r.release()
        assert got == [(200, b"one", None), (200, b"two", "r2"), (200, b"three", None)]
        assert srv.connections == 1
        head, body = srv.requests[1]
        lines = head.decode().split("\r\n")
        assert lines[0] == "POST /v1/chat/completions HTTP/1.1" and body == b'{"i": 1}'
        assert f"Host: 127.0.0.1:{pool.port}" in lines and "Accept-Encoding: identity" in lines
        assert "Content-Length: 8" in lines and "Content-Type: application/json" in lines
    finally:
        await pool.close()
        await srv.close()


async def test_a_chunked_body_arrives_piece_by_piece():
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

    srv, pool = await _pool([chunked, ok(b"after")])
    try:
        r = await pool.post("/x", b"{}", {})
        assert r.headers["content-type"] == "text/event-stream"
        assert await r.content.readany() == b"first"
        step.set()
        assert await r.readany() == b"second" and await r.readany() == b""
        r.release()
        r = await pool.post("/x", b"{}", {})  # the connection was clean: reused
        assert await r.read() == b"after" and srv.connections == 1
        r.release()
    finally:
        await pool.close()
        await srv.close()


async def test_a_body_that_ends_with_the_connection_is_read_whole_and_not_reused():
    srv, pool = await _pool([b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end", ok(b"next")])
    try:
        r = await pool.post("/x", b"{}", {})
        assert await r.read() == b"until the end"
        r.release()
        r = await pool.post("/x", b"{}", {})
        assert await r.read() == b"next" and srv.connections == 2
        r.release()
    finally:
        await pool.close()
        await srv.close()


async def test_an_idle_connection_the_server_closed_is_replaced_without_an_error():
    srv, pool = await _pool([ok(b"one"), b"", ok(b"two")])  # b"": the server reads, answers nothing, closes
    try:
        r = await pool.post("/x", b"{}", {})
        assert await r.read() == b"one"
        r.release()
        r = await pool.post("/x", b"{}", {})  # lands on the closing connection, then on a new one
        assert await r.read() == b"two" and srv.connections == 2
        r.release()
    finally:
        await pool.close()
        await srv.close()


async def test_broken_responses_timeouts_and_refusals_raise_named_errors():
    srv, pool = await _pool([b"NOT HTTP AT ALL\r\n\r\n"], read=0.3)
    try:
        with pytest.raises(Disconnected, match="not valid HTTP"):
            await pool.post("/x", b"{}", {})
    finally:
        await pool.close()
        await srv.close()

    async def silent(_writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    srv, pool = await _pool([silent], read=0.3)
    try:
        with pytest.raises(ReadTimeout, match="within 0.3 s"):
            await pool.post("/x", b"{}", {})
    finally:
        await pool.close()
        await srv.close()

    await srv.start()
    port = srv.server.sockets[0].getsockname()[1]
    await srv.close()  # nothing listens there now
    refused = Pool(f"http://127.0.0.1:{port}", connect_timeout=2, read_timeout=2, limit=1)
    with pytest.raises(ConnectFailed, match=f"127.0.0.1:{port}"):
        await refused.post("/x", b"{}", {})
    with pytest.raises(ValueError, match="line break"):
        await refused.post("/x", b"{}", {"anthropic-beta": "x\r\nX-Injected: 1"})


async def test_a_large_body_pauses_reading_until_it_is_read_and_arrives_intact():
    big = bytes(range(256)) * (3 * 4096)  # 3 MiB
    srv, pool = await _pool([ok(big)])
    try:
        r = await pool.post("/x", b"{}", {})
        for _ in range(1000):  # let the socket fill the buffer past the high-water mark (<= 5 s)
            if r._conn.paused:
                break
            await asyncio.sleep(0.005)
        assert r._conn.paused, "reading did not pause with more than 1 MiB unread"
        assert await r.read() == big
        r.release()
    finally:
        await pool.close()
        await srv.close()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
async def test_https_trusted_by_the_system_store_or_a_ca_file_and_an_untrusted_one_refused(
    tmp_path, monkeypatch
):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    fake = FakeUpstream(record=False)
    await fake.start()
    from aiohttp import web

    site = web.TCPSite(fake._runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    try:
        untrusted = Pool(f"https://127.0.0.1:{port}/v1", connect_timeout=5, read_timeout=5, limit=1)
        with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await untrusted.post("/chat/completions", body, {"Content-Type": "application/json"})

        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the system trust store, as an operator sets it
        pool = Pool(f"https://127.0.0.1:{port}/v1", connect_timeout=5, read_timeout=5, limit=1)
        for _ in range(2):
            r = await pool.post("/chat/completions", body, {"Content-Type": "application/json"})
            answer = json.loads(await r.read())
            r.release()
            assert r.status == 200 and answer["object"] == "chat.completion"
        assert len(pool._idle) == 1  # one TLS connection, kept alive
        await pool.close()

        monkeypatch.delenv("SSL_CERT_FILE")  # a provider's own CA bundle (config: ca_file)
        own = Pool(
            f"https://127.0.0.1:{port}/v1", connect_timeout=5, read_timeout=5, limit=1, ca_file=str(cert)
        )
        r = await own.post("/chat/completions", body, {"Content-Type": "application/json"})
        assert r.status == 200 and json.loads(await r.read())["object"] == "chat.completion"
        r.release()
        await own.close()
    finally:
        await fake.close()
