"""The store's one error mapping: what the database or its driver raised, as a StoreError of one line
naming the store, the problem and the fix (the CLI exits 4 on it); and the one conflict a write reports
to its caller (BaselineMoved)."""

from __future__ import annotations

from sqlalchemy.exc import NoSuchModuleError

from jobs.errors import StoreError
from schemakit import display_url


def store_error(err: BaseException, url: str) -> StoreError:
    """What the database or its driver raised, as one line naming the store, the problem and the fix."""
    where = display_url(url)
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    first = text[0] if text else err.__class__.__name__
    low = first.lower()
    if isinstance(err, NoSuchModuleError) or "can't load plugin" in low:
        scheme = url.split("://", 1)[0]
        return StoreError(
            f"unknown database URL scheme {scheme!r} in {where}: use a file path, sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB (--db or FARM_DB)"
        )
    if isinstance(err, ImportError):
        return StoreError(
            f"no database driver for {where} ({first}): for PostgreSQL use postgresql+psycopg://... "
            "(`pip install 'psycopg[binary]'`, which `make` installs)"
        )
    if "file is not a database" in low or "malformed" in low:
        return StoreError(
            f"the farm store {where} is not a readable SQLite database ({first}): it is damaged or not a "
            "store; restore it from a copy or point --db (FARM_DB) at another file"
        )
    if "readonly" in low or "read-only" in low or "read only" in low:
        return StoreError(
            f"the farm store {where} is read-only ({first}): only reading commands (jobs list, report, "
            "compare, baseline list) work on it; copy it somewhere writable, or point --db at another store"
        )
    if "unable to open database file" in low or isinstance(err, OSError):
        return StoreError(
            f"cannot open the farm store {where} ({first}): check that its folder exists and is "
            "writable, or point --db (FARM_DB) at another store"
        )
    return StoreError(f"the farm store {where} failed: {first} (rerun with `farm --debug` for details)")


class BaselineMoved(RuntimeError):
    """A named baseline moved between reading it and moving it (another `farm baseline set`)."""
