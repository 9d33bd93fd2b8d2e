"""The floor of any gateway built on aiohttp: a minimal proxy (aiohttp's server + one ClientSession) that
forwards chat completions to the fake upstream and does nothing else (no key, limit, ledger or metric).

``python -m benchmarks gateway`` runs it beside the gateway, so every run shows in the same seconds what
aiohttp alone reaches on the machine; ``python -m benchmarks gateway-ir`` counts its instructions.

    .venv/bin/python -m benchmarks.aiohttp_floor UPSTREAM_PORT PORT [--no-uvloop]
"""

from __future__ import annotations

import argparse

import aiohttp
from aiohttp import web

from benchmarks.loops import install_uvloop

_SESSION = web.AppKey("session", aiohttp.ClientSession)
_JSON = {"Content-Type": "application/json"}


def make_app(upstream_url: str) -> web.Application:
    """The minimal proxy: POST /v1/chat/completions to ``upstream_url``, whole or streamed (by the
    request's ``"stream": true``), chunks relayed as they come."""

    async def open_session(app: web.Application) -> None:
        app[_SESSION] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=256),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close_session(app: web.Application) -> None:
        await app[_SESSION].close()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        r = await request.app[_SESSION].post(upstream_url, data=body, headers=_JSON)
        if not r.headers.get("Content-Type", "").startswith("text/event-stream"):
            data = await r.read()
            r.release()
            return web.Response(body=data, status=r.status, content_type="application/json")
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        while chunk := await r.content.readany():
            await out.write(chunk)
        r.release()
        await out.write_eof()
        return out

    app = web.Application()
    app.on_startup.append(open_session)
    app.on_cleanup.append(close_session)
    app.router.add_post("/v1/chat/completions", relay)
    app.router.add_get("/healthz", lambda _: web.Response(text="ok"))
    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("upstream_port", type=int)
    ap.add_argument("port", type=int)
    ap.add_argument("--no-uvloop", action="store_true", help="the plain asyncio loop (as the gateway's)")
    args = ap.parse_args(argv)
    if not args.no_uvloop:
        install_uvloop()
    app = make_app(f"http://127.0.0.1:{args.upstream_port}/v1/chat/completions")
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
