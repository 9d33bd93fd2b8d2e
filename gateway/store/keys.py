"""Per-project API keys: stored only as HMAC-SHA256(server secret, key), compared in constant time.

A key looks like ``kf_<12 hex id>_<secret>``. The id is public (it appears in ``keys list`` and in the
ledger); the rest is shown once at creation and never stored or logged.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Row, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.errors import StoreUnavailable
from gateway.store.db import api_keys, within_deadline

KEY_PREFIX = "kf_"
_ID_LEN = 12
KEY_RE = re.compile(r"^kf_([0-9a-f]{12})_[A-Za-z0-9_-]{20,}$")  # group 1: the public key id
_KEY_RE = KEY_RE

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


def _utc(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``12h``, ``30d``, ``2w`` (bare numbers are seconds)."""
    m = _DURATION_RE.match(text.lower())
    if not m:
        raise ValueError(f"invalid duration {text!r}: use e.g. 90s, 15m, 12h, 30d, 2w")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


_HEADER_LABEL = {"authorization": "'Authorization: Bearer'", "x-api-key": "'x-api-key'"}
MISSING_KEY_MESSAGE = "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
INVALID_KEY_MESSAGE = "invalid, expired or revoked API key"
_RETRY_S = 1.0  # after a failed lookup, how long the store is not asked again (the last known good serves)


@dataclass(frozen=True, slots=True)
class Credential:
    """The key a request carries and where it came from.

    ``ignored`` names the other header when both ``Authorization: Bearer`` and ``x-api-key`` carried
    different values (Claude Code with both ANTHROPIC_AUTH_TOKEN and ANTHROPIC_API_KEY set sends both)."""

    key: str | None
    header: str | None = None  # "authorization" | "x-api-key"
    ignored: str | None = None  # "authorization" | "x-api-key"

    def invalid_message(self) -> str:
        """The 401 text for a key the store refused."""
        if self.ignored is None or self.header is None:
            return INVALID_KEY_MESSAGE
        used, ignored = _HEADER_LABEL[self.header], _HEADER_LABEL[self.ignored]
        return (
            f"{INVALID_KEY_MESSAGE} (both 'Authorization: Bearer' and 'x-api-key' were sent with different "
            f"values; the gateway used {used} and ignored {ignored}: send only the gateway key, e.g. unset "
            "ANTHROPIC_API_KEY for Claude Code)"
        )


def credential_from_headers(headers: Mapping[str, str]) -> Credential:
    """The client's key from ``x-api-key`` or ``Authorization: Bearer`` (``headers`` must be case-insensitive,
    as aiohttp's ``request.headers``). When both carry different values, the one shaped like a gateway key
    wins; when both or neither are, ``Authorization`` wins (Claude Code's ANTHROPIC_AUTH_TOKEN, where the
    client configs put the key)."""
    api_key = headers.get("x-api-key")
    api_key = api_key.strip() if api_key else ""
    auth = headers.get("Authorization")
    bearer = auth[7:].strip() if auth and auth[:7].lower() == "bearer " else ""
    if api_key and bearer and api_key != bearer:
        if KEY_RE.match(api_key) is not None and KEY_RE.match(bearer) is None:
            return Credential(api_key, "x-api-key", "authorization")
        return Credential(bearer, "authorization", "x-api-key")
    if bearer:
        return Credential(bearer, "authorization")
    if api_key:
        return Credential(api_key, "x-api-key")
    return Credential(None)


def key_from_headers(headers: Mapping[str, str]) -> str | None:
    """``credential_from_headers(headers).key``."""
    return credential_from_headers(headers).key


@dataclass(frozen=True, slots=True)
class KeyInfo:
    id: str
    project: str
    name: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    rotated_to: str | None

    def state(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        if self.rotated_to is not None:
            return "rotating"
        return "active"

    def usable(self, now: datetime) -> bool:
        return self.state(now) in ("active", "rotating")

    def usable_at(self, clock: Clock) -> bool:
        """``usable(clock())``, the clock read only for a key that expires (the request path's key, each
        request: a key without an expiry needs no time)."""
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or clock() < self.expires_at


def _row_to_info(row) -> KeyInfo:
    return KeyInfo(
        id=row.id,
        project=row.project,
        name=row.name,
        created_at=_utc(row.created_at),
        expires_at=_utc(row.expires_at),
        revoked_at=_utc(row.revoked_at),
        rotated_to=row.rotated_to,
    )


class KeyStore:
    def __init__(
        self,
        engine: AsyncEngine,
        secret: bytes | None = None,
        *,
        cache_ttl_s: float = 1.0,
        clock: Clock = utcnow,
        stale_ttl_s: float = 0.0,
        lookup_timeout_s: float = 10.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._secret = secret  # None until set_secret: only get/list/revoke work without it
        self._cache_ttl = cache_ttl_s
        # Last known good: while the store cannot answer (down, or past ``lookup_timeout_s``), a key verified
        # within ``stale_ttl_s`` still authenticates; for ``_RETRY_S`` after a failed lookup the store is not
        # asked again (a hung database would otherwise cost every request its deadline)
        self._stale_ttl = max(stale_ttl_s, cache_ttl_s)
        self._lookup_timeout = lookup_timeout_s
        self._mono = monotonic
        self._store_down_until = 0.0
        self.stale_served = 0  # authentications answered from the last known good while the store was away
        self.unavailable = 0  # authentications refused (503) because the store could not answer
        self._clock = clock
        # SHA-256 of a key that matched its row -> (info, monotonic fetch time); holds no plaintext key. The
        # HMAC with the server secret (what the store holds) is computed only on a miss: it costs 4x more.
        self._cache: dict[bytes, tuple[KeyInfo, float]] = {}
        # key id -> the store lookup in flight: requests that miss the cache together share one query
        self._loading: dict[str, asyncio.Future[tuple[KeyInfo, str] | None]] = {}
        self._generation = 0  # bumped by revoke/rotate: a lookup begun before one is not cached
        self._revoked: set[str] = set()  # key ids revoked while this process ran (never served stale)
        # awaited after revoke/rotate with (key id, revoked): gateway.redis.channels publishes the change, so
        # every process sharing its Redis forgets that key at once (not just this one)
        self.on_change: Callable[[str, bool], Awaitable[None]] | None = None

    def set_secret(self, secret: bytes) -> None:
        """The server secret (from gateway.store.secret.resolve_secret); a store built without one gets it
        here."""
        if not secret:
            raise ValueError("empty server secret")
        self._secret = secret
        self.forget_all()

    def _digest(self, key: str) -> str:
        if self._secret is None:
            raise RuntimeError(
                "KeyStore has no server secret yet (gateway.store.secret.resolve_secret gives it)"
            )
        return hmac.digest(self._secret, key.encode(), "sha256").hex()

    async def create(
        self, project: str, name: str = "", expires_in: timedelta | None = None
    ) -> tuple[str, KeyInfo]:
        key_id = secrets.token_hex(_ID_LEN // 2)
        key = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
        now = self._clock()
        info = KeyInfo(
            id=key_id,
            project=project,
            name=name,
            created_at=now,
            expires_at=now + expires_in if expires_in is not None else None,
            revoked_at=None,
            rotated_to=None,
        )
        async with self._engine.begin() as conn:
            await conn.execute(
                api_keys.insert().values(
                    id=info.id,
                    project=info.project,
                    name=info.name,
                    key_hash=self._digest(key),
                    created_at=info.created_at,
                    expires_at=info.expires_at,
                )
            )
        return key, info

    async def get(self, key_id: str) -> KeyInfo | None:
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(api_keys).where(api_keys.c.id == key_id))).first()
        return _row_to_info(row) if row else None

    async def list(self, project: str | None = None) -> list[KeyInfo]:
        q = select(api_keys).order_by(api_keys.c.project, api_keys.c.created_at)
        if project:
            q = q.where(api_keys.c.project == project)
        async with self._engine.connect() as conn:
            rows = (await conn.execute(q)).all()
        return [_row_to_info(r) for r in rows]

    async def revoke(self, key_id: str) -> bool:
        async with self._engine.begin() as conn:
            res = await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id, api_keys.c.revoked_at.is_(None))
                .values(revoked_at=self._clock())
            )
        await self._changed(key_id, revoked=True)
        return res.rowcount > 0

    async def rotate(self, key_id: str, grace: timedelta) -> tuple[str, KeyInfo]:
        """A new key for the same project and name; the old one keeps working for ``grace`` only."""
        old = await self.get(key_id)
        if old is None:
            raise KeyError(key_id)
        now = self._clock()
        if not old.usable(now):
            raise ValueError(f"key {key_id} is {old.state(now)}; only an active key can be rotated")
        remaining = old.expires_at - now if old.expires_at is not None else None
        new_key, new_info = await self.create(old.project, old.name, remaining)
        old_expiry = now + grace
        if old.expires_at is not None:
            old_expiry = min(old_expiry, old.expires_at)
        async with self._engine.begin() as conn:
            await conn.execute(
                update(api_keys)
                .where(api_keys.c.id == key_id)
                .values(expires_at=old_expiry, rotated_to=new_info.id)
            )
        await self._changed(key_id, revoked=False)
        return new_key, new_info

    async def _changed(self, key_id: str, *, revoked: bool) -> None:
        """A key changed: forget it here, and tell the other processes (``on_change``)."""
        self.forget_key(key_id, revoked=revoked)
        if self.on_change is not None:
            await self.on_change(key_id, revoked)

    def forget_key(self, key_id: str, *, revoked: bool) -> None:
        """Another process (or this one) changed ``key_id``: it is looked up again before it is served, and
        a revoked one is never served from the last known good."""
        if revoked:
            self._revoked.add(key_id)
        for tag in [t for t, (info, _at) in self._cache.items() if info.id == key_id]:
            del self._cache[tag]
        self._loading.pop(key_id, None)
        self._generation += 1

    def forget_all(self) -> None:
        """Drop what this process knows about keys (a new secret, or key changes that may have been
        missed): nothing is served from the last known good after this."""
        self._cache.clear()
        self._loading.clear()
        self._generation += 1

    async def authenticate(self, key: str) -> KeyInfo | None:
        """The key's info if it is valid now, else None. Never raises on a malformed key."""
        m = _KEY_RE.match(key)
        if m is None:
            return None
        if self._revoked and m.group(1) in self._revoked:
            return None  # revoked while this process ran: no lookup needed, the database or not
        mono = self._mono()
        tag = hashlib.sha256(key.encode()).digest()
        cached = self._cache.get(tag)
        if cached is not None and mono - cached[1] <= self._cache_ttl:
            info = cached[0]  # this key matched its row's hash when it was cached
        else:
            generation = self._generation
            try:
                if mono < self._store_down_until:
                    raise self._unavailable("did not answer a moment ago")
                loaded = await self._load(m.group(1))
            except StoreUnavailable:
                if cached is None or mono - cached[1] > self._stale_ttl or cached[0].id in self._revoked:
                    self.unavailable += 1
                    raise  # a key not verified lately: a 503 with Retry-After
                self.stale_served += 1
                info = cached[0]  # the last known good
                return info if info.usable_at(self._clock) else None
            if loaded is None:
                return None
            info, row_hash = loaded
            if not hmac.compare_digest(row_hash, self._digest(key)):
                return None
            if generation == self._generation:
                self._cache[tag] = (info, mono)
        return info if info.usable_at(self._clock) else None

    def _unavailable(self, why: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"the gateway's key store is unavailable ({why}); retry shortly", retry_after="1"
        )

    async def _load(self, key_id: str) -> tuple[KeyInfo, str] | None:
        """The key row's info and hash, one query per key id however many requests wait for it (when the
        cache entry of a busy key expires, every request in flight would otherwise query the store)."""
        fut = self._loading.get(key_id)
        if fut is None:
            fut = asyncio.ensure_future(self._query(key_id))
            self._loading[key_id] = fut
            fut.add_done_callback(
                lambda f: self._loading.pop(key_id) if self._loading.get(key_id) is f else None
            )
        return await asyncio.shield(fut)  # a waiter cancelled does not cancel the others' query

    async def _query(self, key_id: str) -> tuple[KeyInfo, str] | None:
        async def lookup() -> Row[Any] | None:
            async with self._engine.connect() as conn:
                return (await conn.execute(select(api_keys).where(api_keys.c.id == key_id))).first()

        try:
            row = await within_deadline(self._lookup_timeout, lookup)
        except TimeoutError:  # a hung database: the request's deadline, not the database's
            self._store_down_until = self._mono() + _RETRY_S
            raise self._unavailable(f"no answer within {self._lookup_timeout:g} s") from None
        except (DBAPIError, OSError) as e:  # the database, not the key: a 503, not a 500
            self._store_down_until = self._mono() + _RETRY_S
            raise self._unavailable(e.__class__.__name__) from None
        return (_row_to_info(row), row.key_hash) if row is not None else None
