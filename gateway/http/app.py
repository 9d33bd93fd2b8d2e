"""The aiohttp application: the services of one gateway, its routes, and errors for unknown routes.

The request path itself is gateway.http.pipeline (authenticate -> admit -> send -> account), used by the proxy
endpoints (gateway.http.endpoints.proxy) and the summaries endpoint (gateway.summaries.batcher).

Build one with ``create_app(settings)``; everything it holds hangs off the app (no module state), so tests
can run several side by side. Serve it with handler cancellation on, so a client that goes away cancels
its upstream request (``serve`` below does).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.config import GatewaySettings
from gateway.core.metrics import GatewayMetrics
from gateway.core.pricing import PriceTable
from gateway.errors import (
    ApiStyle,
    GatewayError,
    MethodNotAllowed,
    NotFound,
    StoreUnavailable,
    error_response,
)
from gateway.http.endpoints.proxy import ENDPOINTS, Endpoint, Proxy
from gateway.http.endpoints.summaries import PipelineModelCalls, SummariesEndpoint
from gateway.http.endpoints.usage import UsageEndpoint
from gateway.http.pipeline import Pipeline
from gateway.http.server import install_log_filter, serve_forever
from gateway.http.services import Services
from gateway.limits.base import Limiters
from gateway.limits.local import Limits
from gateway.store.db import create_engine, ensure_ready, within_deadline
from gateway.store.keys import KeyStore, utcnow
from gateway.store.ledger import LedgerWriter
from gateway.store.ledger_queries import usage_today
from gateway.store.secret import resolve_secret
from gateway.store.spool import default_spool_dir
from gateway.summaries.batcher import SUMMARIES_PATH, SummaryBatcher
from gateway.summaries.schema import USAGE_PATH
from gateway.translate.api import ANTHROPIC_VERSION
from gateway.upstream.client import UpstreamClient, pool_warnings
from gateway.upstream.health import HealthChecks
from gateway.upstream.routing import Router

if TYPE_CHECKING:
    from gateway.redis.state import SharedState

log = logging.getLogger("gateway")

MAX_BODY_BYTES = 64 * 1024 * 1024
_T = TypeVar("_T")


class Gateway:
    """The services behind one app: key store, limits, upstream clients, ledger writer, metrics."""

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        clock: Callable[[], datetime] = utcnow,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.engine = create_engine(settings.database_url)
        # the server secret is resolved in start (gateway.store.secret: FARM_GATEWAY_SECRET or the secret
        # file)
        self.keys = KeyStore(
            self.engine,
            cache_ttl_s=settings.key_cache_ttl_s,
            clock=clock,
            stale_ttl_s=settings.key_stale_ttl_s,
            lookup_timeout_s=settings.key_lookup_timeout_s,
        )
        self.ledger = LedgerWriter(
            self.engine,
            interval_s=settings.ledger_flush_interval_s,
            batch_size=settings.ledger_batch_size,
            spool_dir=settings.ledger_spool_dir or default_spool_dir(settings.database_url),
        )
        self.metrics = GatewayMetrics(registry)
        self.metrics.bind_ledger(self.ledger)
        self.metrics.bind_keys(self.keys)
        self.limits: Limiters = Limits({})
        # gateway.redis.state.SharedState with `redis_url` (built in start): limits (gateway.limits.redis),
        # key revocations and the summaries cache shared by every process using that Redis; None: all of it in
        # this process
        self.shared: SharedState | None = None
        self.clients: dict[str, UpstreamClient] = {}
        # the deployments of every public model (gateway.upstream.routing), built in start once the clients
        # are
        self.router: Router | None = None
        self.health: HealthChecks | None = None
        # built in start, once every service is: the request path, the proxy and the summaries endpoint
        self.pipeline: Pipeline | None = None
        self.proxy: Proxy | None = None
        self.batcher: SummaryBatcher | None = None
        self.summaries: SummariesEndpoint | None = None
        self.usage: UsageEndpoint | None = None
        self.ready = False

    # --- lifecycle -------------------------------------------------------------------------------
    async def start(self, _app: web.Application | None = None) -> None:
        # StartupError: the database unreachable, missing or silent, or its schema to upgrade (SchemaError)
        await ensure_ready(self.engine, self.settings.database_url, self.settings.database_connect_timeout_s)
        self.keys.set_secret(await resolve_secret(self.settings, self.engine))  # ConfigError: wrong secret
        await self.ledger.start()  # first: replays a dead process's spool, so the budgets below count it
        today = await usage_today(self.engine)
        if self.settings.redis_url:
            # imports redis only when configured
            from gateway.limits.redis import SharedLimits
            from gateway.redis.state import SharedState

            self.shared = SharedState(self.settings, keys=self.keys)
            self.limits = SharedLimits(
                self.shared,
                self.settings.projects,
                today,
                seed_source=lambda: _from_ledger(usage_today, self.engine),
                before_connect=self.ledger.review_pending,
            )
            self.ledger.before_write = self.limits.mark_rows
            await self.shared.start()  # Redis down: starts degraded, on this process's share of the limits
            self.metrics.bind_shared(self.shared, self.limits)
        else:
            self.limits = Limits(self.settings.projects, today.tokens, today.cost)
        self.metrics.bind_limits(self.limits)
        for name, cfg in self.settings.providers.items():
            if cfg.kind == "local":  # the offline drafter: nothing to connect to
                continue
            api_key = os.environ.get(cfg.api_key_env) if cfg.api_key_env else None
            if cfg.api_key_env and not api_key:
                log.warning("provider %s: environment variable %s is not set", name, cfg.api_key_env)
            slots = self.limits.provider(name, cfg.max_connections)
            client = UpstreamClient(name, cfg, self.settings.retry, api_key, slots=slots)
            await client.start()
            self.clients[name] = client
        # ValueError: a deployment's bad key; deployments' rpm/tpm counted where the projects' limits are
        self.router = Router(self.settings, self.clients, self.metrics, limits=self.limits)
        self.health = HealthChecks(self.router, {"anthropic-version": ANTHROPIC_VERSION})
        self.health.start()  # with routing.health_check_interval_s only
        services = Services(
            settings=self.settings,
            keys=self.keys,
            limits=self.limits,
            router=self.router,
            metrics=self.metrics,
            ledger=self.ledger,
            prices=_prices(self.settings),
            shared=self.shared,
        )
        self.pipeline = Pipeline(services)
        self.proxy = Proxy(self.pipeline)
        self.batcher = SummaryBatcher(self.settings, self.shared, PipelineModelCalls(self.pipeline))
        self.summaries = SummariesEndpoint(self.pipeline, self.batcher)
        self.usage = UsageEndpoint(self.pipeline, self.engine)
        for warning in pool_warnings(self.settings):  # projects that can starve each other of connections
            log.warning("%s", warning)
        self.ready = True
        log.info(
            "gateway ready: %d providers, %d models, %d projects",
            len(self.clients),
            len(self.settings.models),
            len(self.settings.projects),
        )

    async def stop(self, _app: web.Application | None = None) -> None:
        self.ready = False
        if self.health is not None:
            await self.health.stop()
        if self.batcher is not None:
            await self.batcher.stop()
        if self.shared is not None:
            await self.shared.stop()  # sends the last releases and settlements first
        await self.ledger.stop()
        for client in self.clients.values():
            await client.close()
        await self.engine.dispose()

    # --- plain routes ----------------------------------------------------------------------------
    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _select_one(self) -> None:
        async with self.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))

    async def readyz(self, request: web.Request) -> web.Response:
        problems = []
        if not self.ready:
            problems.append("not started")
        problems += self.ledger.problems()  # not running, behind, flushes failing, spool not writable
        try:  # within the key lookup's deadline: a hung database makes /readyz late by that much at most
            await within_deadline(self.settings.key_lookup_timeout_s, self._select_one)
        except TimeoutError:
            problems.append(f"store unreachable: no answer within {self.settings.key_lookup_timeout_s:g} s")
        except Exception as e:
            problems.append(f"store unreachable: {e.__class__.__name__}")
        ledger = self.ledger.stats()
        shared = {"shared_state": self.shared.status()} if self.shared is not None else {}
        if problems:
            return web.json_response(
                {"status": "unavailable", "problems": problems, "ledger": ledger, **shared}, status=503
            )
        if self.shared is not None and not self.shared.up:  # still serving, on per-process limits
            return web.json_response({"status": "degraded", "ledger": ledger, **shared})
        return web.json_response({"status": "ready", "ledger": ledger, **shared})

    async def metrics_route(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models_route(self, request: web.Request) -> web.StreamResponse:
        style: ApiStyle = "anthropic" if "anthropic-version" in request.headers else "openai"
        assert self.pipeline is not None  # routes are served once start has run
        return await self.pipeline.serve(request, "models", style, self._models, ledger=False)

    async def _models(self, request: web.Request, _rec) -> web.Response:
        assert self.pipeline is not None
        _info, project = await self.pipeline.authenticate(request)
        if "anthropic-version" in request.headers:
            data = [
                {"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}
                for m in project.models
            ]
            return web.json_response(
                {
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None,
                }
            )
        data = [
            {"id": m, "object": "model", "created": 0, "owned_by": self.settings.models[m].provider}
            for m in project.models
        ]
        return web.json_response({"object": "list", "data": data})

    # --- the model routes: served by what start built ----------------------------------------------
    def proxy_route(self, ep: Endpoint):
        name, style = ep.name, ep.style

        async def handle(request: web.Request) -> web.StreamResponse:
            # the pipeline directly (Proxy.handle, inlined): one coroutine less on every request
            assert self.pipeline is not None and self.proxy is not None
            return await self.pipeline.serve(request, name, style, self.proxy.handlers[name])

        return handle

    async def summaries_route(self, request: web.Request) -> web.StreamResponse:
        assert self.summaries is not None
        return await self.summaries.handle(request)

    async def usage_route(self, request: web.Request) -> web.StreamResponse:
        assert self.usage is not None
        return await self.usage.handle(request)


def _prices(settings: GatewaySettings) -> PriceTable:
    """The price table of the config; a public model without a price is named once in the log."""
    prices = PriceTable(settings.prices)
    routes = [
        (name, d.upstream_model)
        for name, route in settings.models.items()
        for d in getattr(route, "deployments", None) or [route]
    ]
    for name in dict.fromkeys(prices.unpriced(routes)):  # once per public model
        log.warning(
            "model %s has no price (add it to `prices:` in the config): its ledger rows get no cost "
            "and it counts nothing against daily cost budgets",
            name,
        )
    return prices


async def _from_ledger(read: Callable[[AsyncEngine], Awaitable[_T]], engine: AsyncEngine) -> _T:
    """The day's usage from the ledger, to seed the shared budgets (gateway.limits.redis): the database
    failing is a StoreUnavailable there (the shared limits then stay on this process's share)."""
    try:
        return await read(engine)
    except (DBAPIError, OSError, TimeoutError) as e:  # the database, as gateway.store.keys translates it
        raise StoreUnavailable(f"the ledger could not be read: {e.__class__.__name__}: {e}") from e


GATEWAY = web.AppKey("gateway", Gateway)


def _style_of(request: web.Request) -> ApiStyle:
    """The API a request speaks, for the shape of an error answer that no endpoint handled."""
    if "anthropic-version" in request.headers or request.path.startswith("/v1/messages"):
        return "anthropic"
    return "openai"


def _refuse(request: web.Request, err: GatewayError, allow: str | None = None) -> web.Response:
    log.info("%s %s -> %d", request.method, request.path, err.status)
    resp = error_response(_style_of(request), err.status, err.message)
    if allow is not None:
        resp.headers["Allow"] = allow
    return resp


async def _no_route(request: web.Request) -> web.Response:
    return _refuse(request, NotFound(f"no route {request.method} {request.path}"))


def _wrong_method(allowed: list[str]):
    allow = ",".join(allowed)

    async def handle(request: web.Request) -> web.Response:
        err = MethodNotAllowed(
            f"{request.method} is not allowed on {request.path} (allowed: {', '.join(allowed)})"
        )
        return _refuse(request, err, allow)

    return handle


def _add_routes(app: web.Application, path: str, **handlers) -> None:
    """``path``'s handlers by method (``post=...``, ``get=...``: a GET also answers HEAD), then a route for
    every other method: a 405 with ``Allow`` in the caller's API shape instead of aiohttp's plain text (a
    route, not a middleware: a middleware costs every request a wrapper)."""
    allowed = sorted({m.upper() for m in handlers} | ({"HEAD"} if "get" in handlers else set()))
    for method, handler in handlers.items():
        if method == "get":
            app.router.add_get(path, handler)  # and HEAD
        else:
            app.router.add_route(method.upper(), path, handler)
    app.router.add_route("*", path, _wrong_method(allowed))


def create_app(
    settings: GatewaySettings,
    *,
    clock: Callable[[], datetime] = utcnow,
    registry: CollectorRegistry | None = None,
) -> web.Application:
    install_log_filter()
    gw = Gateway(settings, clock=clock, registry=registry)
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[GATEWAY] = gw
    app.on_startup.append(gw.start)
    app.on_cleanup.append(gw.stop)
    for path, ep in ENDPOINTS.items():
        _add_routes(app, path, post=gw.proxy_route(ep))
    _add_routes(app, "/v1/models", get=gw.models_route)
    _add_routes(app, SUMMARIES_PATH, post=gw.summaries_route)
    _add_routes(app, USAGE_PATH, post=gw.usage_route)
    _add_routes(app, "/metrics", get=gw.metrics_route)
    _add_routes(app, "/healthz", get=gw.healthz)
    _add_routes(app, "/readyz", get=gw.readyz)
    app.router.add_route("*", "/{path:.*}", _no_route)  # last: any other path is a 404 in the API's shape
    return app


def run_one(
    settings: GatewaySettings,
    host: str | None = None,
    port: int | None = None,
    *,
    reuse_port: bool = False,
    worker: tuple[int, int] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve one gateway process until SIGINT/SIGTERM. ``worker``: (index, count) of a worker of
    ``serve --workers`` (its ``/workerz`` says so); ``on_ready`` is called once the gateway has started."""
    uvloop = None
    if settings.uvloop:
        try:
            import uvloop  # type: ignore[import-not-found]
        except ImportError:
            log.info("uvloop is not installed: using the default asyncio event loop")
    app = create_app(settings)
    gw = app[GATEWAY]
    index, count = worker if worker is not None else (None, 1)
    info = {"pid": os.getpid(), "worker": index, "workers": count}

    async def workerz(_request: web.Request) -> web.Response:
        return web.json_response(info)

    app.router.add_get("/workerz", workerz)
    if (
        gw.metrics.multiprocess
    ):  # PROMETHEUS_MULTIPROC_DIR: the gauges are copied into it (gateway.core.metrics)
        mirror: list[asyncio.Task] = []

        async def start_mirror(_app: web.Application) -> None:
            mirror.append(asyncio.create_task(gw.metrics.mirror_forever()))

        async def stop_mirror(_app: web.Application) -> None:
            for t in mirror:
                t.cancel()
            await asyncio.gather(*mirror, return_exceptions=True)
            gw.metrics.sync()  # the ledger's last flush included

        app.on_startup.append(start_mirror)
        app.on_cleanup.append(stop_mirror)
    if on_ready is not None:

        async def ready(_app: web.Application) -> None:
            on_ready()

        app.on_startup.append(ready)
    # Everything built so far lives as long as the process: keep it out of the collector's scans, and
    # collect the youngest generation less often (aiohttp makes a few hundred objects per request; the
    # default threshold of 700 had the collector take about 25 us per request at 1500 requests/s).
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    serve_forever(
        app,
        host or settings.host,
        port if port is not None else settings.port,
        loop=uvloop.new_event_loop() if uvloop is not None else None,
        reuse_port=reuse_port,
        announce=None if worker else print,
        handler_cancellation=True,
        access_log=logging.getLogger("gateway.access") if settings.access_log else None,
        shutdown_timeout=30,
    )
