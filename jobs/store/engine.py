"""Opening the farm store: an SQLAlchemy engine for a URL or a plain SQLite path, with the SQLite
pragmas the farm runs on, read-only opening of a file this process cannot write, and the schema check
(jobs.store.schema) against every table of jobs.store.tables."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import create_engine, event, insert
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import SQLAlchemyError

from jobs.errors import NoSuchStore
from jobs.settings import DEFAULT_DB
from jobs.store.errors import store_error
from jobs.store.finite_json import finite_json
from jobs.store.schema import ensure_schema
from jobs.store.tables import Base


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")  # first: the statements below may wait for a lock
    if cur.execute("PRAGMA query_only").fetchone()[0]:  # opened read-only (mode=ro): nothing to set
        cur.close()
        return
    # WAL + NORMAL: a commit costs no fsync of the main file, and readers never block the writer.
    try:
        cur.execute("PRAGMA journal_mode=WAL")  # kept by the file: set by its first connection
    except Exception as e:  # a new file another process is creating (first starts at once): SQLite does
        if "locked" not in str(e):  # not wait here; that process, or a later connection, switches it
            raise
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(
    url: str | None = None, *, check_schema: bool = True, create: bool = True, source: str | None = None
) -> Engine:
    """`url` is an SQLAlchemy URL or a plain file path; None means the default SQLite file.

    The store's schema is checked (jobs.store.schema.ensure_schema): a new, empty store is created
    at the newest revision; an out-of-date one raises StoreSchemaError naming `farm db upgrade`.
    `check_schema=False` is for that command, which migrates it. `create=False` is for the commands that
    only read: an SQLite store whose file does not exist raises NoSuchStore (exit 2) instead of being
    created (`source` says where the name came from: "the default", "FARM_DB"). A PostgreSQL database
    is made by its server, never by the farm: `create` does not change how one is opened."""
    given = url = url or DEFAULT_DB  # errors name the store as given, never the URL made of a path
    if not create and (missing := _missing_sqlite_file(url)) is not None:
        raise NoSuchStore(given, source) from missing
    if "://" not in url:
        try:
            Path(url).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise store_error(err, given) from err
        url = f"sqlite:///{url}"
    try:
        engine = create_engine(_read_only_if_unwritable(url), json_serializer=finite_json)
    except (SQLAlchemyError, ImportError, ValueError) as err:
        raise store_error(err, given) from err
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if check_schema:
        try:
            ensure_schema(engine, Base.metadata, url=given)
        except (SQLAlchemyError, OSError) as err:
            engine.dispose()
            raise store_error(err, given) from err
        except BaseException:
            engine.dispose()
            raise
    return engine


def _missing_sqlite_file(url: str) -> FileNotFoundError | None:
    """Why the SQLite store `url` (a file path or an sqlite URL) does not exist, or None when it exists or
    is not an SQLite file (a server database, an in-memory one, a URL that fails later, with its own
    message)."""
    path: str | None = url
    if "://" in url:
        try:
            parsed = make_url(url)
        except Exception:  # noqa: BLE001 - store_error names it when the engine is made
            return None
        path = parsed.database if parsed.drivername.startswith("sqlite") else None
        if path and path.startswith("file:"):  # an SQLite URI filename: file:PATH?mode=...
            path, _, query = path[len("file:") :].partition("?")
            if "mode=memory" in query or "mode=memory" in str(parsed.query):
                return None
            path = unquote(path)
    if not path or path == ":memory:" or Path(path).exists():
        return None
    return FileNotFoundError(errno.ENOENT, "no such file", path)


def _read_only_if_unwritable(url: str) -> str:
    """An SQLite file this process cannot write (a results file on a read-only share) is opened read-only,
    so the commands that only read it work; one in a folder it cannot write either, with no WAL file
    beside it, is opened as immutable (SQLite could not make the WAL index it needs to read)."""
    parsed = make_url(url)
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:" or parsed.query:
        return url
    file = Path(path)
    if not file.is_file() or (os.access(file, os.W_OK) and os.access(file.parent, os.W_OK)):
        return url
    query = "mode=ro"
    if not os.access(file.parent, os.W_OK) and not Path(f"{path}-wal").exists():
        query += "&immutable=1"
    return f"sqlite:///file:{quote(str(file.resolve()))}?{query}&uri=true"


def insert_or_ignore(conn: Connection, table: Any):
    """INSERT ... ON CONFLICT DO NOTHING, on the databases the store runs on."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    return insert(table)
