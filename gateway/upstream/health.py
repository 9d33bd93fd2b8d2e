"""Active health checks of idle deployments (``routing.health_check_interval_s``): every interval, each
deployment of an API provider with nothing in flight and no attempt begun within the interval gets the
smallest model call (one output token, no retry). It counts as a request's attempt would: a 429, or more
failures in a row than ``allowed_fails``, cools the deployment down before a request meets it; an answer
ends a cooldown, and is a time to first byte for the ``latency`` strategy (gateway.upstream.strategies).
Each check costs that call's tokens at the provider, which is why they are off by default.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any

from gateway.errors import UpstreamError
from gateway.upstream.client import send_planned
from gateway.upstream.routing import Deployment, Router
from gateway.upstream.strategies import observe

log = logging.getLogger("gateway.upstream.health")

HEALTH_PROJECT = "_health"  # the fair share of the provider slots a check takes


def probe_request(kind: str, upstream_model: str) -> tuple[str, bytes]:
    """The smallest model call (one output token) in ``kind``'s format: its path and body (the body is the
    same for chat completions and Messages)."""
    body = {"model": upstream_model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    return ("/messages" if kind == "anthropic" else "/chat/completions"), json.dumps(body).encode()


class HealthChecks:
    """The checks of one router's deployments; ``headers``: sent with each (an anthropic provider's API
    version; the provider or deployment key is added by the client)."""

    def __init__(self, router: Router, headers: Mapping[str, str]) -> None:
        self.router = router
        self.headers = {"Content-Type": "application/json", **headers}
        self.retry = router.retry.model_copy(update={"max_retries": 0})
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.router.cfg.health_check_interval_s is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        interval = self.router.cfg.health_check_interval_s
        assert interval is not None
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_idle()
            except Exception:  # a bug here must not end the checks
                log.exception("deployment health checks failed")

    async def check_idle(self) -> list[Deployment]:
        """One round: check every idle deployment; the ones checked."""
        router = self.router
        interval = router.cfg.health_check_interval_s or 0.0
        now = router.clock()
        idle = [
            d
            for md in router.models.values()
            for d in md.deployments
            if d.client is not None and d.in_flight == 0 and now - d.last_begun >= interval
        ]
        await asyncio.gather(*(self.check(d) for d in idle))
        return idle

    async def check(self, d: Deployment) -> bool:
        """The smallest model call to ``d``; True when it answered."""
        path, body = probe_request(d.kind, d.upstream_model)
        try:
            result = await send_planned(
                _Pinned(self.router, d, body), self.retry, path, self.headers, project=HEALTH_PROJECT
            )
        except UpstreamError as e:
            log.info("health check of deployment %s/%s failed: %s", d.model, d.name, e.message)
            return False
        if result.response is None:
            log.info("health check of deployment %s/%s: HTTP %d", d.model, d.name, result.status)
            return False
        try:
            await result.response.read()
        except UpstreamError:
            return False
        finally:
            result.response.release()
        return True


class _Pinned:
    """The plan of one check (gateway.upstream.client.Plan): one attempt to one deployment, counted for
    its health and time to first byte as a request's attempt is."""

    __slots__ = ("router", "d", "body", "_t")

    def __init__(self, router: Router, d: Deployment, body: bytes) -> None:
        self.router, self.d, self.body, self._t = router, d, body, 0.0

    def first(self) -> Deployment:
        return self.d

    def request(self, target: Deployment, path: str, headers: Mapping[str, str]) -> tuple[str, bytes, Any]:
        return path, self.body, headers

    def begin(self, target: Deployment) -> None:
        self._t = target.last_begun = self.router.clock()

    def done(self, target: Deployment) -> None:
        pass

    def answered(self, target: Deployment) -> None:
        if target.fails or target.cooldown_until or target.probing:
            target.ok()
        observe(target, self.router.clock() - self._t)

    def failed(self, target: Deployment, kind: str, retry_after: float | None) -> None:
        target.failed(kind, retry_after, self.router.cfg, self.router.clock())

    def switch(self, target: Deployment, kind: str, same_model: bool) -> None:
        return None

    def again(self, target: Deployment) -> Deployment:
        return self.d

    def context_fallback(self, target: Deployment, status: int, body: bytes | None) -> None:
        return None
