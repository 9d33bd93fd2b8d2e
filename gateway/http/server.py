"""The gateway's HTTP server: aiohttp's, answering requests it cannot parse in JSON, logged in one line.

aiohttp answers a request it cannot parse (a header line over 8 KiB, a bad method, a malformed chunk or
Content-Length, a Content-Encoding it cannot decode) itself, before any route runs, in plain text, and logs
it with a traceback. Here such a request gets a JSON error that both SDKs read (``protocol_error_response``:
nothing of the request is known, not even which API it speaks) and one INFO log line
(``MalformedRequestsOneLine``).

``GatewayRunner`` is an ``AppRunner`` whose connections do that; ``serve_forever`` runs an app on it until
SIGINT/SIGTERM, as ``aiohttp.web.run_app`` does (graceful stop: in-flight requests finish within
``shutdown_timeout``, then the app's cleanup, which flushes the ledger).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

from gateway.config import UnavailableError
from gateway.errors import protocol_error_response


def _processing_error(exc: BaseException | None) -> HttpProcessingError | None:
    """The HttpProcessingError behind ``exc`` (aiohttp wraps a body's decoding error in a
    RequestPayloadError, raised again when it drains the unread body), if any."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, HttpProcessingError):
            return exc
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


class MalformedRequestsOneLine(logging.Filter):
    """aiohttp logs a request it cannot parse (a bad header line, a body that does not match its
    Content-Encoding) with a traceback at ERROR; that is a client's fault, so it becomes one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = _processing_error(record.exc_info[1] if record.exc_info else None)
        if exc is not None and 400 <= (exc.code or 0) < 500:
            message = " ".join(str(exc.message).split())[:300]
            record.msg = f"{record.getMessage()}: HTTP {exc.code} {message}"
            record.args = ()
            record.exc_info = record.exc_text = None
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def install_log_filter() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestsOneLine) for f in server_log.filters):
        server_log.addFilter(MalformedRequestsOneLine())


class _JsonErrors(RequestHandler):
    """A connection whose errors outside any route are JSON."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it; raises if a response has begun
        if status >= 500:
            text = "internal gateway error"
        else:
            detail = " ".join(str(message or exc or "").split())[:300]
            text = f"malformed HTTP request: {detail}" if detail else "malformed HTTP request"
        resp = protocol_error_response(status, text)
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> RequestHandler:  # the protocol factory: one handler per connection
        return _JsonErrors(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer unparsable requests in JSON (``_JsonErrors``)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; only its connections' class differs
        return server


def serve_forever(
    app: web.Application,
    host: str,
    port: int,
    *,
    loop: asyncio.AbstractEventLoop | None = None,
    reuse_port: bool = False,
    announce: Callable[[str], Any] | None = print,
    **runner_kwargs: Any,
) -> None:
    """Serve ``app`` on ``host:port`` until SIGINT or SIGTERM, then stop gracefully (``runner_kwargs``:
    ``shutdown_timeout``, ``access_log``, ... as for ``web.AppRunner``)."""

    async def main() -> None:
        runner = GatewayRunner(app, handle_signals=True, **runner_kwargs)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port, reuse_port=reuse_port or None)
            try:
                await site.start()
            except OSError as e:  # the port is taken (by something other than a gateway: startup.py)
                raise UnavailableError(
                    f"cannot listen on {host}:{port}: {e.strerror or e}; stop what serves it, or choose "
                    "another port with --port"
                ) from None
            if announce is not None:
                announce(f"======== Running on {site.name} ========\n(Press CTRL+C to quit)")
            await asyncio.Event().wait()  # until a signal raises GracefulExit
        finally:
            await runner.cleanup()

    loop = loop or asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not task.done():
                task.cancel()  # main's finally: the graceful cleanup
                with suppress(asyncio.CancelledError):
                    loop.run_until_complete(task)
        finally:
            rest = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in rest:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
