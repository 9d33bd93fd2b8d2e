"""Pooled upstream clients (one gateway.http1 connection pool per provider) and the retry loop.

Retried: 408, 409, 429, 5xx and connection errors, with backoff ``base * 2**n`` capped, plus jitter;
an upstream ``Retry-After`` (or ``retry-after-ms``) is honoured up to ``max_retry_after_s``, and a longer
one is handed to the client instead of being waited out. The total wait across retries is capped too.
Never retried: any other 4xx, a read timeout, or anything after a stream's first byte went to the client.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime

from multidict import CIMultiDictProxy

from gateway.config import ProviderConfig, RetryConfig
from gateway.http1 import ConnectTimeout, Pool, ReadTimeout, Response, TransportError

log = logging.getLogger("gateway.upstream")

RETRYABLE_STATUS = frozenset({408, 409, 429})


def is_retryable_status(status: int) -> bool:
    return status in RETRYABLE_STATUS or status >= 500


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date); None when absent."""
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    ra = headers.get("Retry-After")
    if not ra:
        return None
    try:
        return max(0.0, float(ra))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(ra)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def client_retry_after(headers: Mapping[str, str]) -> str | None:
    """A plain ``Retry-After: <whole seconds>`` for the client from the upstream's headers (seconds,
    HTTP date or ``retry-after-ms``); None when the upstream sent none."""
    seconds = parse_retry_after(headers)
    if seconds is None:
        return None
    return str(math.ceil(seconds))


class UpstreamTimeout(Exception):
    """No data from the upstream within the read timeout (becomes a 504)."""


class UpstreamUnreachable(Exception):
    """The upstream could not be reached or dropped the connection (becomes a 502)."""


@dataclass(slots=True)
class UpstreamResult:
    """The final attempt. ``body`` is read already for an error status; ``response`` is open on success."""

    status: int
    headers: CIMultiDictProxy[str]
    response: Response
    body: bytes | None = None
    retries: int = 0
    retry_wait_s: float = 0.0
    retry_reasons: list[str] = field(default_factory=list)


class UpstreamClient:
    def __init__(self, name: str, cfg: ProviderConfig, retry: RetryConfig, api_key: str | None) -> None:
        self.name = name
        self.cfg = cfg
        self.retry = retry
        self.base_url = cfg.base_url.rstrip("/")
        self._auth_headers: dict[str, str] = {}
        if api_key:
            if cfg.kind == "anthropic":
                self._auth_headers["x-api-key"] = api_key
            else:
                self._auth_headers["Authorization"] = f"Bearer {api_key}"
        self._pool: Pool | None = None

    async def start(self) -> None:
        self._pool = Pool(
            self.base_url,
            connect_timeout=self.cfg.connect_timeout_s,
            read_timeout=self.cfg.read_timeout_s,
            limit=self.cfg.max_connections,
            ca_file=self.cfg.ca_file,
        )

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    def _backoff(self, attempt: int) -> float:
        r = self.retry
        return min(r.backoff_cap_s, r.backoff_base_s * (2**attempt)) + random.uniform(0, r.jitter_s)

    async def send(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        on_retry: Callable[[str], None] | None = None,
    ) -> UpstreamResult:
        assert self._pool is not None, "upstream client not started"
        hdrs = {**headers, **self._auth_headers}
        r = self.retry
        attempt = 0
        waited = 0.0
        reasons: list[str] = []
        while True:
            try:
                resp = await self._pool.post(path, body, hdrs)
            except ConnectTimeout as e:
                reason, err = "connect_timeout", e
            except ReadTimeout as e:
                raise UpstreamTimeout(
                    f"upstream {self.name!r} sent no response within the read timeout of "
                    f"{self.cfg.read_timeout_s:g} s"
                ) from e
            except TransportError as e:
                reason, err = "connect_error", e
            else:
                status = resp.status
                if status < 400 or not is_retryable_status(status):
                    if status >= 400:
                        body_bytes = await self._read_error(resp)
                        return UpstreamResult(
                            status, resp.headers, resp, body_bytes, attempt, waited, reasons
                        )
                    return UpstreamResult(status, resp.headers, resp, None, attempt, waited, reasons)
                body_bytes = await self._read_error(resp)
                reason, err = str(status), None
                retry_after = parse_retry_after(resp.headers)
                delay = retry_after if retry_after is not None else self._backoff(attempt)
                if (
                    attempt >= r.max_retries
                    or (retry_after is not None and retry_after > r.max_retry_after_s)
                    or waited + delay > r.max_total_wait_s
                ):
                    return UpstreamResult(status, resp.headers, resp, body_bytes, attempt, waited, reasons)
            if err is not None:
                delay = self._backoff(attempt)
                if attempt >= r.max_retries or waited + delay > r.max_total_wait_s:
                    raise UpstreamUnreachable(
                        f"upstream {self.name!r} is unreachable ({reason}: {err.__class__.__name__}"
                        f"{': ' + str(err) if str(err) else ''}) after {attempt} retries"
                    ) from err
            reasons.append(reason)
            if on_retry is not None:
                on_retry(reason)
            log.debug("retrying %s (%s) in %.2fs", self.name, reason, delay)
            await asyncio.sleep(delay)
            waited += delay
            attempt += 1

    async def _read_error(self, resp: Response) -> bytes:
        try:
            return await resp.read()
        except TransportError:
            return b""
        finally:
            resp.release()
