"""The upstream HTTP transport: one aiohttp ``ClientSession`` per provider, behind a small interface.

``Transport.post(path, body, headers)`` sends one POST and returns a ``TransportResponse`` once the head has
arrived; its body is read whole (``read()``) or as it arrives (``readany()``, b"" at the end), then the
response is ``release()``-d (the connection goes back to the pool when the body was read to its end) or
``close()``-d (the connection is dropped: the upstream sees the request cancelled).

Errors are translated here, at the boundary: every exception ``post``, ``read`` and ``readany`` raise is a
``gateway.errors`` kind, never an aiohttp or asyncio one (cancellation excepted)::

    UpstreamUnreachable    refused / DNS / TLS / proxy failure, or no connection within connect_timeout_s
    UpstreamTimeout        no byte within read_timeout_s (before the head or between two body pieces)
    UpstreamDisconnected   the connection dropped, or the response is not valid HTTP/1.1
    UpstreamTooLarge       a response header line over MAX_HEADER_LINE, or a body over max_response_bytes
    BadRequest             a request header the transport cannot send (not ASCII, or a control character)

A failure the retry loop may retry carries ``retry_reason`` (``connect_timeout``, ``connect_error``,
``disconnected``: nothing of the response arrived); everything else has ``retry_reason = None``.

The aiohttp client, set up once per provider: a ``TCPConnector`` with ``limit = max_connections``, keep-alive,
happy eyeballs and a DNS cache; https with the system's trust store (``SSL_CERT_FILE``/``SSL_CERT_DIR`` are
honoured) or the provider's ``ca_file``; compressed answers (gzip, deflate, and br/zstd when their modules
are installed) decompressed; no cookies, no redirects followed, no ``raise_for_status``. ``HTTP(S)_PROXY``
and ``NO_PROXY`` are honoured as aiohttp's ``trust_env=True`` does, with the same code (including proxy
credentials from ``~/.netrc``), but looked up once at ``start()``: aiohttp looks them up on every request in
a worker thread (and ``~/.netrc`` in another), which tripled the CPU a request costs. Everything per request
is prebuilt: the URL of each path, the timeouts, the provider's default headers.
"""

from __future__ import annotations

import asyncio
import re
import ssl
from collections.abc import Mapping
from typing import Protocol

import aiohttp
from aiohttp import client_exceptions as ce
from aiohttp.helpers import get_env_proxy_for_url
from multidict import CIMultiDictProxy
from yarl import URL

from gateway.errors import (
    BadRequest,
    GatewayError,
    UpstreamDisconnected,
    UpstreamError,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)

USER_AGENT = "kernelfarm-gateway"
MAX_HEADER_LINE = 16 * 1024  # bytes in a response's status line or one header field
MAX_HEADERS = 128  # header fields in a response
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024
HEAD_DEADLINE_SLACK_S = 0.5  # past connect + read timeouts: the head deadline (see AiohttpTransport.post)

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FORBIDDEN_VALUE_CHARS = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CHECKED: set[tuple[str, str]] = set()  # (name, value) pairs check_headers passed
_CHECKED_MAX = 4096


class TransportResponse(Protocol):
    """A response whose head has arrived."""

    status: int
    headers: CIMultiDictProxy[str]

    async def read(self) -> bytes: ...

    async def readany(self) -> bytes: ...

    def at_eof(self) -> bool:
        """True when the whole body has been read (the next ``readany`` would return b"")."""
        ...

    def release(self) -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """Sends POSTs to one upstream (the scheme, host, port and path prefix of its ``base_url``)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> TransportResponse: ...


def _fail(cls: type[UpstreamError], message: str, retry_reason: str | None = None) -> UpstreamError:
    err = cls(message)
    err.retry_reason = retry_reason
    return err


def retry_reason(err: GatewayError) -> str | None:
    """Why the retry loop may retry this failure (a metrics label), or None when it must not."""
    return err.retry_reason if isinstance(err, UpstreamError) else None


def check_headers(headers: Mapping[str, str]) -> None:
    """BadRequest naming the first header that cannot go out as it is: a name that is not an HTTP token, a
    value with a line break or another control character, or with a character outside ASCII (aiohttp would
    send it as UTF-8, which the upstream reads as Latin-1)."""
    for item in headers.items():
        if item in _CHECKED:  # the same few headers come with every request: checked once
            continue
        name, value = item
        if not _TOKEN.fullmatch(name):
            raise BadRequest(
                f"header name {name!r} is not a valid HTTP header name", error_class="bad_header"
            )
        if not value.isascii() or _FORBIDDEN_VALUE_CHARS.search(value) is not None:
            raise BadRequest(
                f"header {name!r}: its value has a line break, a control character or a non-ASCII "
                "character and cannot be sent upstream",
                error_class="bad_header",
            )
        if len(_CHECKED) >= _CHECKED_MAX:  # many distinct values (a client varying one): start over
            _CHECKED.clear()
        _CHECKED.add(item)


class AiohttpResponse:
    """``TransportResponse`` over an ``aiohttp.ClientResponse``; counts the body against the cap."""

    __slots__ = ("_resp", "_t", "_content", "_seen", "status", "headers")

    def __init__(self, resp: aiohttp.ClientResponse, transport: AiohttpTransport) -> None:
        self._resp = resp
        self._t = transport
        self._content = resp.content
        self._seen = 0
        self.status = resp.status
        self.headers = resp.headers

    @property
    def content(self) -> AiohttpResponse:
        """``content.readany()`` works too, as on an aiohttp response."""
        return self

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call (waiting for some); b"" at the end."""
        try:
            data = await self._content.readany()
        except Exception as e:
            self._resp.close()
            raise self._t.translate(e, head=False) from None
        if data:
            self._seen += len(data)
            if self._seen > self._t.max_response_bytes:
                self._resp.close()
                raise self._t.too_large(f"more than {self._t.max_response_bytes} bytes")
        return data

    def at_eof(self) -> bool:
        return self._content.at_eof()

    async def read(self) -> bytes:
        """The rest of the body."""
        first = await self.readany()
        if not first:
            return b""
        parts = [first]
        while chunk := await self.readany():
            parts.append(chunk)
        return first if len(parts) == 1 else b"".join(parts)

    def release(self) -> None:
        self._resp.release()  # aiohttp drops the connection instead when the body was not read to its end

    def close(self) -> None:
        self._resp.close()


class AiohttpTransport:
    """``Transport`` on an aiohttp ``ClientSession`` of its own (one per provider)."""

    def __init__(
        self,
        name: str,
        base_url: str,
        *,
        connect_timeout: float = 10.0,
        read_timeout: float = 120.0,
        max_connections: int = 256,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        ca_file: str | None = None,
        default_headers: Mapping[str, str] | None = None,
        happy_eyeballs_delay: float = 0.25,
        keepalive_timeout: float = 15.0,
    ) -> None:
        u = URL(base_url.rstrip("/"))
        if u.scheme not in ("http", "https") or not u.host:
            raise ValueError(f"base_url {base_url!r}: expected http(s)://host[:port][/path]")
        self.name = name
        self.base_url = u
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self.max_response_bytes = max_response_bytes
        self.ca_file = ca_file
        self.happy_eyeballs_delay = happy_eyeballs_delay
        self.keepalive_timeout = keepalive_timeout
        self._default_headers = {"User-Agent": USER_AGENT, **(default_headers or {})}
        check_headers(self._default_headers)
        # connect, send, then the read timeout for the head; aiohttp's own timers fire first when they can
        self._head_deadline_s = connect_timeout + read_timeout + HEAD_DEADLINE_SLACK_S
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=connect_timeout, sock_connect=connect_timeout, sock_read=read_timeout
        )
        self._urls: dict[str, URL] = {}
        self._session: aiohttp.ClientSession | None = None
        self.proxy: URL | None = None
        self._proxy_headers: dict[str, str] | None = None
        self._where = f"{u.host}:{u.port}"

    async def start(self) -> None:
        sslctx: ssl.SSLContext | bool = False
        if self.base_url.scheme == "https":
            sslctx = ssl.create_default_context(cafile=self.ca_file)
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            keepalive_timeout=self.keepalive_timeout,
            happy_eyeballs_delay=self.happy_eyeballs_delay,
            ssl=sslctx,
            use_dns_cache=True,
        )
        try:
            proxy, proxy_auth = get_env_proxy_for_url(self.base_url)  # HTTP(S)_PROXY, NO_PROXY, ~/.netrc
        except LookupError:
            proxy, proxy_auth = None, None
        self.proxy = proxy
        if proxy_auth is not None:
            self._proxy_headers = {"Proxy-Authorization": proxy_auth.encode()}
        self._session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            headers=self._default_headers,
            timeout=self._timeout,
            auto_decompress=True,
            raise_for_status=False,
            trust_env=False,  # the environment was read above, once
            max_line_size=MAX_HEADER_LINE,
            max_field_size=MAX_HEADER_LINE,
            max_headers=MAX_HEADERS,
        )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(str(self.base_url) + path, encoded=False)
        return url

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> AiohttpResponse:
        session = self._session
        if session is None:
            raise RuntimeError(f"upstream transport {self.name!r} is not started")
        # aiohttp re-arms no read timer after an interim 1xx head: an upstream that sends "100 Continue" and
        # then nothing would hold the request forever. The head gets a deadline of its own: one timer handle
        # (8K instructions a request under gateway-ir; asyncio.timeout cost 32K, 3% of the gateway).
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        expired: list[bool] = []
        deadline = loop.call_at(loop.time() + self._head_deadline_s, _expire, task, expired)
        try:
            resp = await session.request(
                "POST",
                self._urls.get(path) or self.url(path),
                data=body,
                headers=headers,
                allow_redirects=False,
                proxy=self.proxy,
                proxy_headers=self._proxy_headers,
            )
        except asyncio.CancelledError:
            if expired and task is not None and task.uncancel() == 0:  # our deadline, not the caller's cancel
                raise self.translate(TimeoutError(), head=True) from None
            raise
        except Exception as e:
            if isinstance(e, ValueError) and not isinstance(e, aiohttp.ClientError):
                # a header aiohttp refuses to serialise (UpstreamClient checks them before, this is the net)
                raise BadRequest(
                    f"a request header cannot be sent upstream: {e}", error_class="bad_header"
                ) from None
            raise self.translate(e, head=True) from None
        finally:
            deadline.cancel()
        length = resp.content_length
        if length is not None and length > self.max_response_bytes:
            resp.close()
            raise self.too_large(f"a body of {length} bytes (Content-Length)")
        return AiohttpResponse(resp, self)

    # --- error translation -----------------------------------------------------------------------
    def too_large(self, what: str) -> UpstreamError:
        return _fail(
            UpstreamTooLarge,
            f"upstream {self.name!r} sent {what}, over the gateway's limit of "
            f"{self.max_response_bytes} bytes",
        )

    def translate(self, e: Exception, *, head: bool) -> GatewayError:
        """The gateway.errors kind for an exception from aiohttp (or the socket under it; one of the
        gateway's own passes as it is). ``head``: the response head had not arrived yet (the request may
        be retried when nothing came back)."""
        name, where = self.name, self._where
        if isinstance(e, GatewayError):
            return e
        if isinstance(e, ce.ConnectionTimeoutError):
            return _fail(
                UpstreamUnreachable,
                f"upstream {name!r} is unreachable: no connection to {where} within the connect timeout "
                f"of {self.connect_timeout:g} s",
                "connect_timeout",
            )
        if isinstance(e, (ce.ServerTimeoutError, TimeoutError)):
            what = "response" if head else "body bytes"
            return _fail(
                UpstreamTimeout,
                f"upstream {name!r} sent no {what} within the read timeout of {self.read_timeout:g} s",
            )
        if isinstance(e, ce.ClientConnectorCertificateError):
            return _fail(
                UpstreamUnreachable,
                f"upstream {name!r} is unreachable: the TLS certificate of {where} is not trusted "
                f"({e.certificate_error}); set the provider's ca_file, or SSL_CERT_FILE, to the CA that "
                "signed it",
            )
        if isinstance(e, ce.ClientHttpProxyError):
            return _fail(
                UpstreamUnreachable,
                f"upstream {name!r} is unreachable: the proxy {self.proxy} refused the tunnel "
                f"(HTTP {e.status} {e.message})",
                "connect_error",
            )
        if isinstance(e, ce.InvalidURL):
            return _fail(UpstreamUnreachable, f"upstream {name!r} is unreachable: invalid URL {e}")
        if isinstance(e, ce.ClientConnectorError):  # refused, unreachable, DNS, TLS handshake, proxy down
            via = f" via the proxy {self.proxy}" if self.proxy is not None else ""
            return _fail(
                UpstreamUnreachable,
                f"upstream {name!r} is unreachable: cannot connect to {where}{via}: {e.os_error or e}",
                "connect_error",
            )
        if isinstance(e, ce.ClientResponseError):  # the head is not valid HTTP/1.1, or over the caps
            detail = str(e.message) or e.__class__.__name__
            if "Got more than" in detail or "Too many headers" in detail or "too large" in detail.lower():
                return _fail(
                    UpstreamTooLarge,
                    f"upstream {name!r} sent a response head over the gateway's limits "
                    f"({MAX_HEADER_LINE} bytes a line, {MAX_HEADERS} fields): {detail}",
                )
            return _fail(
                UpstreamDisconnected, f"upstream {name!r} sent a response that is not valid HTTP: {detail}"
            )
        if isinstance(e, ce.ClientPayloadError):  # the body broke off, or its framing or encoding is invalid
            return _fail(UpstreamDisconnected, f"upstream {name!r} broke off the response body: {_cause(e)}")
        if isinstance(e, (ce.ClientConnectionError, OSError)):  # dropped, reset
            if head:
                return _fail(
                    UpstreamDisconnected,
                    f"upstream {name!r} closed the connection before answering ({_cause(e)})",
                    "disconnected",
                )
            return _fail(
                UpstreamDisconnected, f"upstream {name!r} dropped the connection mid-body ({_cause(e)})"
            )
        return _fail(UpstreamDisconnected, f"upstream {name!r}: {e.__class__.__name__}: {e}")


def _expire(task: asyncio.Task | None, expired: list[bool]) -> None:
    """The head deadline of ``AiohttpTransport.post`` passed: cancel the request, saying why."""
    if task is not None and not task.done():
        expired.append(True)
        task.cancel()


def _cause(e: BaseException) -> str:
    text = str(e) or e.__class__.__name__
    inner = e.__cause__
    if inner is not None and str(inner) and str(inner) not in text:
        text += f": {inner}"
    return text
