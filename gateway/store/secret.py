"""The server secret that keys are hashed with, resolved the same way by the gateway and the CLI.

- ``FARM_GATEWAY_SECRET`` (or ``secret:`` in the config) when set.
- Else, for a SQLite file database, ``<database folder>/gateway.secret``: generated on first use
  (``secrets.token_urlsafe(32)``, mode 0600, announced in one log line that names the file) and read on
  every later start. A file readable by group or others is refused.
- Else (PostgreSQL and the like, usually shared by several hosts, where a file on one of them would not be
  the others' secret) the start is refused: set FARM_GATEWAY_SECRET on every gateway and CLI host.
- An in-memory SQLite database gets a random secret for the process (its keys die with it anyway).

The database records a fingerprint of the secret, HMAC-SHA256(secret, "kernelfarm-secret-fingerprint")
(neither the secret nor a plain hash of it), in ``gateway_meta``; a start with another secret is refused with
the fix, instead of every key silently answering 401. ``reset_secret`` (``farm gateway keys reset-secret``)
revokes every key and records the current secret.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import stat
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import func, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.config import ConfigError, GatewaySettings
from gateway.store.db import api_keys, meta

log = logging.getLogger("gateway.store.secret")

SECRET_FILE_NAME = "gateway.secret"
FINGERPRINT_NAME = "secret_fingerprint"
_FINGERPRINT_LABEL = b"kernelfarm-secret-fingerprint"
ENV_NAME = "FARM_GATEWAY_SECRET"


def fingerprint(secret: bytes) -> str:
    """What the database keeps to recognise the secret: HMAC-SHA256(secret, a fixed label), hex."""
    return hmac.digest(secret, _FINGERPRINT_LABEL, "sha256").hex()


def secret_file(database_url: str) -> Path | None:
    """Where the generated secret lives for this database: next to a SQLite file; None otherwise."""
    u = make_url(database_url)
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database).parent / SECRET_FILE_NAME


def _is_memory(database_url: str) -> bool:
    u = make_url(database_url)
    return u.get_backend_name() == "sqlite" and (not u.database or u.database == ":memory:")


def _read(path: Path) -> bytes:
    try:
        mode = path.stat().st_mode
        value = path.read_bytes().strip()
    except OSError as e:
        raise ConfigError(f"cannot read the gateway secret file {path}: {e.strerror or e}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the gateway secret file {path} is open to other users (mode {stat.S_IMODE(mode):o}): "
            f"run `chmod 600 {path}`"
        )
    if not value:
        raise ConfigError(f"the gateway secret file {path} is empty: delete it to generate a new one")
    return value


def _create(path: Path) -> bytes:
    """A new random secret written to ``path`` (mode 0600) unless another process just did: then that one."""
    value = secrets.token_urlsafe(32).encode()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(value + b"\n")
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # atomic, and never replaces a secret another process wrote meanwhile
    except FileExistsError:
        return _read(path)
    except OSError as e:
        raise ConfigError(
            f"cannot write the gateway secret file {path} ({e.strerror or e}): set {ENV_NAME} instead"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    log.warning(
        "%s is not set: generated a new gateway secret in %s (mode 0600); keys are hashed with it, so keep "
        "it with the database",
        ENV_NAME,
        path,
    )
    return value


def configured_secret(settings: GatewaySettings) -> tuple[bytes, str]:
    """(the secret, where it came from) by the rules above, without looking at the database."""
    explicit = settings.secret_bytes()
    if explicit is not None:
        return explicit, ENV_NAME
    if _is_memory(settings.database_url):
        return secrets.token_urlsafe(32).encode(), "a random secret for this in-memory database"
    path = secret_file(settings.database_url)
    if path is None:
        raise ConfigError(
            f"{ENV_NAME} is not set and the database is not a SQLite file: set {ENV_NAME} to the same "
            "secret on every gateway and CLI host sharing this database (e.g. `openssl rand -hex 32`)"
        )
    if path.exists():
        return _read(path), str(path)
    return _create(path), str(path)


def _mismatch(source: str) -> ConfigError:
    return ConfigError(
        f"the gateway keys in this database were made with another secret than the one from {source}, "
        "so every key would be refused: set FARM_GATEWAY_SECRET to the secret the keys were made with"
        + ("" if source == ENV_NAME else f" (or restore that {SECRET_FILE_NAME} file)")
        + ", or start over with this secret: `farm gateway keys reset-secret` revokes every key, then "
        "create new ones"
    )


async def _check_once(engine: AsyncEngine, fp: str, source: str) -> None:
    async with engine.begin() as conn:
        await conn.run_sync(meta.create, checkfirst=True)
        stored = (await conn.execute(select(meta.c.value).where(meta.c.name == FINGERPRINT_NAME))).scalar()
        if stored is not None:
            if not hmac.compare_digest(stored, fp):
                raise _mismatch(source)
            return
        older = (await conn.execute(select(func.count()).select_from(api_keys))).scalar_one()
        if older and source != ENV_NAME:
            # Keys from before fingerprints were recorded: they were made with FARM_GATEWAY_SECRET or the
            # old built-in dev secret, never with a generated file; only an explicit secret is trusted.
            raise ConfigError(
                f"this database has {older} keys made before the gateway recorded its secret, with "
                f"{ENV_NAME} or the old built-in dev secret (no longer accepted), and {ENV_NAME} is not set: "
                f"set {ENV_NAME} to the secret they were made with, or revoke them all and record the "
                f"secret from {source} with `farm gateway keys reset-secret`, then create new keys"
            )
        await conn.execute(meta.insert().values(name=FINGERPRINT_NAME, value=fp))


async def resolve_secret(settings: GatewaySettings, engine: AsyncEngine) -> bytes:
    """The server secret for this gateway or CLI; raises ConfigError (one line, naming the fix) when it
    cannot be had or is not the one the database's keys were made with. Records it on first use."""
    secret, source = configured_secret(settings)
    fp = fingerprint(secret)
    for attempt in range(3):  # two first starts at once: one inserts, the other then compares
        try:
            await _check_once(engine, fp, source)
            return secret
        except (IntegrityError, OperationalError):
            if attempt == 2:
                raise
            await asyncio.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


async def reset_secret(settings: GatewaySettings, engine: AsyncEngine) -> tuple[int, str]:
    """Revoke every key and record the current secret; (keys revoked, where the secret comes from)."""
    secret, source = configured_secret(settings)
    async with engine.begin() as conn:
        await conn.run_sync(meta.create, checkfirst=True)
        res = await conn.execute(
            update(api_keys).where(api_keys.c.revoked_at.is_(None)).values(revoked_at=datetime.now(UTC))
        )
        await conn.execute(meta.delete().where(meta.c.name == FINGERPRINT_NAME))
        await conn.execute(meta.insert().values(name=FINGERPRINT_NAME, value=fingerprint(secret)))
    return res.rowcount, source
