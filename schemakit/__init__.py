"""A database schema versioned by Alembic migrations, checked and brought up to date the same way by every
program that keeps one: the farm's results store (jobs/store/schema.py, a sync ``Engine``) and the
gateway's database (gateway/store/db.py, an ``AsyncEngine``). This package knows neither: each passes a
``Migrations`` what differs (its tables, its migrations folder, its Alembic version table, its lock key,
its error class and the words of its messages).

What it does, for SQLite and PostgreSQL:

- ``state``: the revision the database records against the newest one the migrations folder has, and
  which of the program's tables exist; ``SchemaState.verdict`` says what that is (empty, at head, needs
  an upgrade, from a newer release, from before migrations) and ``SchemaState.problem`` says it in one
  line naming the fix;
- ``upgrade``: run the migrations up to a target, adopting a database from before migrations, under the
  migration lock;
- ``ensure``: what a start runs. A database at head passes; an empty one is created at head (zero
  setup); any other is refused with the program's error. A first look that is not at head is taken
  again under the migration lock before anything is decided: another first start may be creating the
  tables right then, and two catalog reads outside the lock (each its own snapshot) can see its tables
  without its version, which is what a database from before migrations looks like.

The migration lock is one transaction that only one migrating process holds at a time: SQLite's write lock
(``BEGIN IMMEDIATE``; the others wait out the connection's busy timeout) or a PostgreSQL advisory lock
(``pg_advisory_xact_lock``, released by the commit). The whole migration runs in it (both databases
have transactional DDL). Within a process one migration runs at a time, whatever the database: Alembic's
``op`` and ``context`` are process globals.

The logic is written once, as sync functions of a ``Connection``; an ``AsyncEngine`` runs them through
``AsyncConnection.run_sync`` (the ``*_async`` methods), as Alembic itself is run.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from enum import StrEnum
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection, Dialect, Engine, make_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["Migrations", "SchemaState", "Verdict", "Wording", "display_url", "head_revision"]

_PG_BIGINT = 2**63  # pg_advisory_xact_lock takes a bigint key


_PASSWORD = re.compile(r"(://[^/:@]*:)[^/]*@")  # "://user:password@" in a URL SQLAlchemy cannot parse


def display_url(url: str) -> str:
    """The database as the user gave it, without its password: a file path (no ``://``) as it is, a URL
    with its password shown as ``***`` (even one SQLAlchemy cannot parse, so an error still names it)."""
    if "://" not in url:
        return url
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a bad port, a bad scheme: shown as given, less the password
        return _PASSWORD.sub(r"\1***@", url)


@cache
def _scripts(folder: str):
    """Alembic's script directory of a migrations folder (parsed once a process)."""
    from alembic.script import ScriptDirectory

    if not (Path(folder) / "versions").is_dir():
        raise ValueError(f"schemakit: {folder} is not an Alembic migrations folder (no versions/ in it)")
    return ScriptDirectory(folder)


def head_revision(folder: str | Path) -> str:
    """The newest revision of an Alembic migrations folder (one with a ``versions`` folder inside)."""
    head = _scripts(str(folder)).get_current_head()
    if head is None:
        raise ValueError(f"schemakit: the migrations folder {folder} has no revisions")
    return head


class Verdict(StrEnum):
    EMPTY = "empty"  # none of the program's tables and no version: created without asking
    AT_HEAD = "at head"
    NEEDS_UPGRADE = "needs upgrade"  # an older revision this code knows
    NEWER_RELEASE = "from a newer release"  # a revision this code does not know
    BEFORE_MIGRATIONS = "from before migrations"  # the program's tables, no version


@dataclass(frozen=True)
class Wording:
    """The words of one program's messages, e.g. ``Wording("the farm store", "this farm", "farm db
    upgrade", "--db", "run this again")``."""

    subject: str  # what the database is to its users: "the gateway database"
    program: str  # "this gateway"
    command: str  # the command that upgrades it: "farm gateway db upgrade"
    same_option: str  # the option that names the database, for "with the same ...": "--config"
    retry: str  # what to do after the upgrade: "start again"

    @property
    def fix(self) -> str:
        return f"`{self.command}` (with the same {self.same_option})"


@dataclass(frozen=True)
class SchemaState:
    """A database's schema as read: a program subclasses it to set ``wording`` (its messages)."""

    current: str | None  # the revision the database records (None: not versioned)
    head: str  # the newest revision the migrations folder has
    tables: frozenset[str]  # the program's tables that exist
    known: bool = True  # whether the migrations folder has ``current``

    wording: ClassVar[Wording | None] = None

    @property
    def up_to_date(self) -> bool:
        return self.current == self.head

    @property
    def empty(self) -> bool:
        """None of the program's tables and no version: a new database, created without asking."""
        return self.current is None and not self.tables

    @property
    def verdict(self) -> Verdict:
        if self.up_to_date:
            return Verdict.AT_HEAD
        if self.current is None:
            return Verdict.EMPTY if not self.tables else Verdict.BEFORE_MIGRATIONS
        return Verdict.NEEDS_UPGRADE if self.known else Verdict.NEWER_RELEASE

    def problem(self, url: str) -> str | None:
        """One line saying why this database cannot be used as it is, naming the fix; None when it can."""
        w = type(self).wording
        if w is None:
            raise TypeError(f"{type(self).__qualname__}.wording is not set: subclass SchemaState with one")
        where = f"{w.subject} {display_url(url)}"
        verdict = self.verdict
        if verdict is Verdict.AT_HEAD:
            return None
        if verdict is Verdict.EMPTY:
            return f"{where} has no tables yet: run {w.fix} to create them, then {w.retry}"
        if verdict is Verdict.BEFORE_MIGRATIONS:
            return (
                f"{where} has tables from before schema migrations: run {w.fix} to adopt them, then {w.retry}"
            )
        if verdict is Verdict.NEWER_RELEASE:
            return (
                f"{where} is at schema revision {self.current}, which {w.program} does not know (it needs "
                f"{self.head}): a newer release migrated it; run that release"
            )
        return (
            f"{where} is at schema revision {self.current}, older than the {self.head} {w.program} needs: "
            f"run {w.fix}, then {w.retry}"
        )


# --- one migration at a time in this process ---------------------------------------------------------------
_MIGRATING = threading.Lock()  # Alembic's `op` and `context` are process globals


@asynccontextmanager
async def _one_migration_async() -> AsyncIterator[None]:
    """``_MIGRATING`` for a coroutine: waited for in a worker thread, so the event loop runs on and the
    wait can be cancelled (a lock the thread gets after its waiter was cancelled is handed back)."""
    if not _MIGRATING.acquire(blocking=False):
        guard = threading.Lock()
        held = False
        abandoned = False

        def wait() -> None:
            nonlocal held
            _MIGRATING.acquire()
            with guard:
                if abandoned:
                    _MIGRATING.release()
                else:
                    held = True

        try:
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(None, wait))
        except BaseException:
            with guard:
                abandoned = True
                if held:
                    _MIGRATING.release()
            raise
    try:
        yield
    finally:
        _MIGRATING.release()


T = TypeVar("T")
S = TypeVar("S", bound=SchemaState)


class Migrations(Generic[S]):
    """One program's schema: its tables (``metadata``), its Alembic migrations ``folder`` (with a
    ``versions`` folder inside), the name of Alembic's version table (a database may be shared with other
    programs, so each has its own), the PostgreSQL advisory lock key held while migrating, the error
    ``ensure`` and ``upgrade`` raise (called with the one-line message), and ``state_type``, a subclass
    of ``SchemaState`` with the program's ``Wording``."""

    def __init__(
        self,
        metadata: MetaData,
        folder: str | Path,
        *,
        version_table: str,
        lock_key: int,
        error: Callable[[str], Exception],
        state_type: type[S],
    ) -> None:
        if not isinstance(metadata, MetaData) or not metadata.tables:
            raise ValueError(
                f"schemakit: metadata must be a MetaData with the program's tables, not {metadata!r}"
            )
        folder = Path(folder)
        if not (folder / "versions").is_dir():
            raise ValueError(f"schemakit: {folder} is not an Alembic migrations folder (no versions/ in it)")
        if not version_table or not version_table.isidentifier():
            raise ValueError(f"schemakit: version_table {version_table!r} is not a plain table name")
        if (
            isinstance(lock_key, bool)
            or not isinstance(lock_key, int)
            or not -_PG_BIGINT <= lock_key < _PG_BIGINT
        ):
            raise ValueError(f"schemakit: lock_key {lock_key!r} is not a 64-bit signed integer")
        if not callable(error):
            raise ValueError(
                f"schemakit: error {error!r} is not an exception class (or a callable making one)"
            )
        if not (isinstance(state_type, type) and issubclass(state_type, SchemaState)):
            raise ValueError(f"schemakit: state_type {state_type!r} is not a subclass of SchemaState")
        if not isinstance(state_type.wording, Wording):
            raise ValueError(f"schemakit: {state_type.__qualname__}.wording is not set (a Wording)")
        self.metadata = metadata
        self.folder = folder
        self.version_table = version_table
        self.lock_key = lock_key
        self.error = error
        self.state_type = state_type

    def __repr__(self) -> str:
        return f"Migrations({str(self.folder)!r}, version_table={self.version_table!r})"

    # --- the migrations folder --------------------------------------------------------------------------
    @cached_property
    def _alembic(self):
        """Alembic's config and script directory of the folder (the directory parsed once a process)."""
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(self.folder))
        cfg.set_main_option("version_table", self.version_table)
        return cfg, _scripts(str(self.folder))

    def head(self) -> str:
        """The newest revision of the folder."""
        return head_revision(self.folder)

    def _known(self, revision: str) -> bool:
        from alembic.util import CommandError

        try:
            return self._alembic[1].get_revision(revision) is not None
        except CommandError:  # "Can't locate revision identified by ..."
            return False

    def options(self, dialect: Dialect) -> dict[str, Any]:
        """What Alembic is configured with: here, by the program's migrations/env.py, and for autogenerate."""
        tables = self.metadata.tables
        return {
            "target_metadata": self.metadata,
            "version_table": self.version_table,
            "render_as_batch": dialect.name == "sqlite",  # SQLite alters a table by copying it
            "compare_type": True,
            # only this program's tables: a PostgreSQL database may hold another program's too
            "include_name": lambda name, kind, _parent: kind != "table" or name in tables,
        }

    # --- the logic, on a Connection --------------------------------------------------------------------
    def read_state(self, conn: Connection) -> S:
        from alembic.runtime.migration import MigrationContext

        ctx = MigrationContext.configure(conn, opts={"version_table": self.version_table})
        current = ctx.get_current_revision()
        present = frozenset(inspect(conn).get_table_names()) & set(self.metadata.tables)
        known = current is None or self._known(current)
        return self.state_type(current, self.head(), present, known)

    @contextmanager
    def _locked(self, conn: Connection) -> Iterator[None]:
        """The migration lock on ``conn``: its transaction, committed at the end (rolled back on error)."""
        if conn.dialect.name == "sqlite":
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        elif conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": self.lock_key})
        try:
            yield
        except BaseException:
            conn.rollback()
            raise
        conn.commit()

    def _migrate(self, conn: Connection, target: str) -> None:
        from alembic.runtime.environment import EnvironmentContext

        cfg, script = self._alembic

        def upgrade(rev, _context):
            return script._upgrade_revs(target, rev)

        with EnvironmentContext(cfg, script, fn=upgrade, destination_rev=target) as env:
            env.configure(connection=conn, **self.options(conn.dialect))
            with env.begin_transaction():  # the caller's transaction: nothing begun here
                env.run_migrations()

    def _check_target(self, target: str, current: str | None) -> str:
        """``target`` as a revision id: "head" or one of the folder's, not older than ``current``."""
        if not isinstance(target, str) or not target:
            raise ValueError(f"schemakit: upgrade target {target!r} is not a revision (or 'head')")
        if target == "head":
            return self.head()
        script = self._alembic[1]
        if not self._known(target):
            known = ", ".join(reversed([r.revision for r in script.walk_revisions()]))
            raise ValueError(f"schemakit: {self.folder} has no revision {target!r} (it has: {known})")
        target = script.get_revision(target).revision  # a unique prefix names one
        if current is not None and current != target:
            older = {r.revision for r in script.iterate_revisions(current, "base")}
            if target in older:
                raise ValueError(
                    f"schemakit: upgrade target {target} is older than the database's {current} "
                    "(migrations only go up)"
                )
        return target

    def _upgrade_on(self, conn: Connection, url: str, target: str = "head") -> tuple[S, S]:
        """``upgrade`` on a connection (this process holding ``_MIGRATING``)."""
        with self._locked(conn):
            before = self.read_state(conn)
            if not before.known:
                raise self.error(before.problem(url) or f"unknown schema revision {before.current}")
            target = self._check_target(target, before.current)
            if before.current != target:
                self._migrate(conn, target)
            after = self.read_state(conn)
        return before, after

    def _settle_on(self, conn: Connection, url: str) -> S:
        """The part of ``ensure`` under the lock (this process holding ``_MIGRATING``): read the state
        again; create an empty database at head; refuse any other that is not at head."""
        with self._locked(conn):
            state = self.read_state(conn)
            if state.empty:
                self._migrate(conn, state.head)
                state = self.read_state(conn)
        if not state.up_to_date:
            raise self.error(state.problem(url) or f"schema at {state.current}, not {state.head}")
        return state

    # --- a sync Engine ---------------------------------------------------------------------------------
    def state(self, engine: Engine) -> S:
        with engine.connect() as conn:
            return self.read_state(conn)

    def _under_lock(self, engine: Engine, url: str | None, fn: Callable[..., T], *args: Any) -> T:
        with _MIGRATING, engine.connect() as conn:
            return fn(conn, url or str(engine.url), *args)

    def upgrade(self, engine: Engine, target: str = "head", *, url: str | None = None) -> tuple[S, S]:
        """Run the migrations up to ``target`` (default: the newest), adopting a database from before
        migrations; (state before, state after). A database from a newer release raises ``error``. Safe
        to run from several processes at once. ``url``: the database as the user gave it, for messages
        (default: the engine's URL)."""
        return self._under_lock(engine, url, self._upgrade_on, target)

    def ensure(self, engine: Engine, *, url: str | None = None) -> S:
        """What a start runs: the state when at head (an empty database created at head first); any other
        raises ``error``, one line naming the fix (and ``url``, the database as the user gave it; default:
        the engine's URL)."""
        state = self.state(engine)
        if state.up_to_date:
            return state
        return self._under_lock(engine, url, self._settle_on)

    # --- an AsyncEngine (the same logic through AsyncConnection.run_sync) ------------------------------
    async def state_async(self, engine: AsyncEngine) -> S:
        async with engine.connect() as conn:
            return await conn.run_sync(self.read_state)

    async def _under_lock_async(
        self, engine: AsyncEngine, url: str | None, fn: Callable[..., T], *args: Any
    ) -> T:
        async with _one_migration_async(), engine.connect() as conn:
            return await conn.run_sync(fn, url or str(engine.url), *args)

    async def upgrade_async(
        self, engine: AsyncEngine, target: str = "head", *, url: str | None = None
    ) -> tuple[S, S]:
        """``upgrade`` for an AsyncEngine."""
        return await self._under_lock_async(engine, url, self._upgrade_on, target)

    async def ensure_async(self, engine: AsyncEngine, *, url: str | None = None) -> S:
        """``ensure`` for an AsyncEngine."""
        state = await self.state_async(engine)
        if state.up_to_date:
            return state
        return await self._under_lock_async(engine, url, self._settle_on)
