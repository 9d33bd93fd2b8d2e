"""schemakit on real databases: SQLite files and the session's PostgreSQL server (tests/pgserver.py; its
cases skip with the reason where none can be started), through a sync Engine (as the farm's store) and an
AsyncEngine (as the gateway), with a small migrations folder of its own (tests/schemakit/migrations:
0001 makes kit_items, adopting one made before migrations; 0002 adds kit_notes)."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import pytest
from sqlalchemy import (
    Column,
    ForeignKey,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    insert,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Engine
from sqlalchemy.ext.asyncio import create_async_engine

import schemakit
from schemakit import Migrations, SchemaState, Verdict, Wording, display_url, head_revision

FOLDER = Path(__file__).parent / "migrations"
VERSION_TABLE = "kit_alembic_version"

metadata = MetaData()
items = Table(
    "kit_items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(64), nullable=False),
)
notes = Table(
    "kit_notes",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("item_id", Integer, ForeignKey("kit_items.id"), nullable=False),
    Column("text", String(256), nullable=False),
)


class KitError(RuntimeError):
    pass


class KitState(SchemaState):
    wording = Wording("the kit database", "this kit", "kit db upgrade", "--url", "try again")


KIT = Migrations(
    metadata, FOLDER, version_table=VERSION_TABLE, lock_key=0x6B69_7400, error=KitError, state_type=KitState
)


def _wal(dbapi_conn, _record) -> None:
    """SQLite in WAL mode, as the farm and the gateway have it: a reader never holds up a writer."""
    dbapi_conn.execute("PRAGMA journal_mode=WAL")


def _sync_engine(url: str) -> Engine:
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _wal)
    return engine


def _async_engine(url: str):
    engine = create_async_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _wal)
    return engine


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def urls(backend, tmp_path, request) -> tuple[str, str]:
    """One empty database: its sync URL and its async URL."""
    if backend == "postgresql":
        server = request.getfixturevalue("postgres")
        name = server.create_database("kit")
        return server.url(name), server.url(name, driver="asyncpg")
    path = tmp_path / "kit.db"
    return f"sqlite:///{path}", f"sqlite+aiosqlite:///{path}"


@pytest.fixture
def engine(urls):
    e = _sync_engine(urls[0])
    yield e
    e.dispose()


def _versions(engine: Engine) -> list:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).all()


def _differences(engine: Engine) -> list:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return compare_metadata(MigrationContext.configure(conn, opts=KIT.options(conn.dialect)), metadata)


# --- the schema's state, and ensure -----------------------------------------------------------------------
def test_an_empty_database_is_created_at_head_once(engine):
    state = KIT.state(engine)
    assert isinstance(state, KitState) and state.verdict is Verdict.EMPTY and state.empty
    assert (state.current, state.head, state.tables) == (None, "0002", frozenset())
    assert "has no tables yet: run `kit db upgrade` (with the same --url) to create them" in state.problem(
        str(engine.url)
    )

    state = KIT.ensure(engine)
    assert state.verdict is Verdict.AT_HEAD and state.up_to_date and state.problem(str(engine.url)) is None
    assert state.tables == set(metadata.tables) and _versions(engine) == [("0002",)]
    assert _differences(engine) == []  # the migrations make exactly the tables of `metadata`
    names = set(inspect(engine).get_table_names())
    assert VERSION_TABLE in names and "alembic_version" not in names  # the program's own version table
    assert KIT.ensure(engine) == state  # a second start changes nothing
    assert KIT.upgrade(engine) == (state, state)


def test_an_older_revision_is_refused_by_ensure_and_upgraded_by_upgrade(engine):
    before, after = KIT.upgrade(engine, "0001")
    assert before.verdict is Verdict.EMPTY and after.current == "0001"
    state = KIT.state(engine)
    assert state.verdict is Verdict.NEEDS_UPGRADE and state.tables == {"kit_items"}
    with pytest.raises(KitError) as ei:
        KIT.ensure(engine)
    assert str(ei.value) == (
        f"the kit database {display_url(str(engine.url))} is at schema revision 0001, older than the 0002 "
        "this kit needs: run `kit db upgrade` (with the same --url), then try again"
    )
    assert _versions(engine) == [("0001",)]  # the refusal changed nothing
    before, after = KIT.upgrade(engine)
    assert (before.current, after.current) == ("0001", "0002") and after.tables == set(metadata.tables)
    assert KIT.ensure(engine).up_to_date


def test_tables_from_before_migrations_are_refused_then_adopted_with_their_rows(engine):
    with engine.begin() as conn:
        items.create(conn)  # what a release before migrations made
        conn.execute(insert(items).values(id=1, name="old"))
    state = KIT.state(engine)
    assert state.verdict is Verdict.BEFORE_MIGRATIONS and state.tables == {"kit_items"}
    with pytest.raises(KitError, match=r"has tables from before schema migrations: run `kit db upgrade` "):
        KIT.ensure(engine)
    assert set(inspect(engine).get_table_names()) == {"kit_items"}  # refused: nothing made
    before, after = KIT.upgrade(engine)
    assert before.verdict is Verdict.BEFORE_MIGRATIONS and after.verdict is Verdict.AT_HEAD
    assert _differences(engine) == []
    with engine.connect() as conn:
        assert conn.execute(select(items.c.name)).scalars().all() == ["old"]


def test_a_database_from_a_newer_release_is_refused_and_never_downgraded(engine):
    KIT.ensure(engine)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {VERSION_TABLE} SET version_num = '0099'"))
    state = KIT.state(engine)
    assert state.verdict is Verdict.NEWER_RELEASE and not state.known
    newer = "is at schema revision 0099, which this kit does not know (it needs 0002): a newer release"
    with pytest.raises(KitError, match=re.escape(newer)):
        KIT.ensure(engine)
    with pytest.raises(KitError, match=re.escape(newer)):
        KIT.upgrade(engine)
    assert _versions(engine) == [("0099",)]


def test_another_programs_tables_are_not_the_kits(engine):
    """A database shared with another program: its tables are neither the kit's (the state) nor
    differences to drop (the options' include_name)."""
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE other_program (id INTEGER PRIMARY KEY)"))
    state = KIT.state(engine)
    assert state.verdict is Verdict.EMPTY  # created without asking, beside the other program's
    KIT.ensure(engine)
    assert _differences(engine) == [] and "other_program" in inspect(engine).get_table_names()
    options = KIT.options(engine.dialect)
    assert options["version_table"] == VERSION_TABLE and options["target_metadata"] is metadata
    assert options["render_as_batch"] is (engine.dialect.name == "sqlite")


# --- first starts at once ---------------------------------------------------------------------------------
def _is_version_table_query(statement: str, parameters) -> bool:
    """The statement asking whether the version table exists (PostgreSQL: the name is a parameter;
    SQLite: PRAGMA table_info names it)."""
    return VERSION_TABLE in statement or VERSION_TABLE in str(parameters)


class _AnotherStartInBetween:
    """Makes two first starts race, every time: right after the first statement that asks whether the
    version table exists (the first look of the start under test), another start creates the schema and
    commits, before the start under test lists the tables."""

    def __init__(self, url: str) -> None:
        self.other = _sync_engine(url)
        self.started = threading.Event()  # once: the other start's own statements come through here too
        self.result: list[tuple[SchemaState, SchemaState]] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:
        if self.started.is_set() or not _is_version_table_query(statement, parameters):
            return
        self.started.set()
        self.result.append(KIT.upgrade(self.other))

    def __enter__(self):
        event.listen(Engine, "after_cursor_execute", self)
        return self

    def __exit__(self, *exc) -> None:
        event.remove(Engine, "after_cursor_execute", self)
        self.other.dispose()


def test_a_first_look_during_another_first_start_is_taken_again_under_the_lock(engine, urls):
    """Without the second look, the tables without a version read like a database from before
    migrations and the start was refused."""
    with _AnotherStartInBetween(urls[0]) as other:
        state = KIT.ensure(engine)
    ((before, after),) = other.result
    assert before.empty and after.up_to_date  # the other start did create the tables, in between
    assert state == after and _versions(engine) == [("0002",)]


async def test_a_first_look_during_another_first_start_is_taken_again_under_the_lock_async(urls):
    engine = _async_engine(urls[1])
    try:
        with _AnotherStartInBetween(urls[0]) as other:
            state = await KIT.ensure_async(engine)
        ((before, after),) = other.result
        assert before.empty and after.up_to_date and state == after
    finally:
        await engine.dispose()


def test_first_starts_at_once_in_threads_create_the_tables_once(urls):
    engines = [_sync_engine(urls[0]) for _ in range(4)]
    start = threading.Barrier(len(engines))
    states: list[SchemaState] = []
    errors: list[BaseException] = []

    def first_start(engine: Engine) -> None:
        start.wait()
        try:
            states.append(KIT.ensure(engine))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=first_start, args=(e,)) for e in engines]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and len(states) == 4 and all(s.up_to_date for s in states)
        assert _versions(engines[0]) == [("0002",)] and _differences(engines[0]) == []
    finally:
        for e in engines:
            e.dispose()


async def test_first_starts_at_once_on_async_engines_create_the_tables_once(urls):
    engines = [_async_engine(urls[1]) for _ in range(4)]
    try:
        states = await asyncio.gather(*(KIT.ensure_async(e) for e in engines))
        assert all(s.up_to_date for s in states)
        assert (await KIT.state_async(engines[0])).tables == set(metadata.tables)
        before, after = await KIT.upgrade_async(engines[0])
        assert before == after and after.current == "0002"
    finally:
        for e in engines:
            await e.dispose()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_cancelled_wait_for_the_migration_lock_never_keeps_it(urls):
    """A coroutine waits for this process's migration lock in a worker thread (the event loop runs on);
    cancelled, it leaves the lock free once its holder lets go, and the next migration runs."""
    entered = asyncio.Event()

    async def migrate() -> None:
        async with schemakit._one_migration_async():
            entered.set()

    assert schemakit._MIGRATING.acquire(timeout=30)  # another migration of this process, under way
    try:
        waiter = asyncio.create_task(migrate())
        await asyncio.sleep(0)  # the waiter runs up to its wait in a worker thread; the loop runs on
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not entered.is_set()
    finally:
        schemakit._MIGRATING.release()
    engine = _async_engine(urls[1])
    try:
        state = await asyncio.wait_for(KIT.ensure_async(engine), 60)  # the lock came back: it migrates
        assert state.up_to_date
    finally:
        await engine.dispose()


# --- targets and bad input --------------------------------------------------------------------------------
def test_an_upgrade_target_is_a_revision_of_the_folder_and_never_older(engine):
    with pytest.raises(ValueError, match=r"has no revision '0042' \(it has: 0001, 0002\)"):
        KIT.upgrade(engine, "0042")
    assert KIT.state(engine).empty  # nothing made
    KIT.upgrade(engine)
    with pytest.raises(ValueError, match="upgrade target 0001 is older than the database's 0002"):
        KIT.upgrade(engine, "0001")
    assert _versions(engine) == [("0002",)]
    assert KIT.upgrade(engine, "0002")[1].up_to_date  # the current one: nothing to do


def test_the_head_of_a_folder(tmp_path):
    assert head_revision(FOLDER) == KIT.head() == "0002"
    (tmp_path / "versions").mkdir()
    with pytest.raises(ValueError, match="has no revisions"):
        head_revision(tmp_path)
    with pytest.raises(ValueError, match="is not an Alembic migrations folder"):
        head_revision(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"metadata": MetaData()}, "metadata must be a MetaData with the program's tables"),
        ({"folder": Path("/nonexistent/migrations")}, "/nonexistent/migrations is not an Alembic migrations"),
        ({"version_table": "kit version"}, "version_table 'kit version' is not a plain table name"),
        ({"lock_key": 2**63}, "lock_key 9223372036854775808 is not a 64-bit signed integer"),
        ({"lock_key": True}, "lock_key True is not a 64-bit signed integer"),
        ({"error": "KitError"}, "error 'KitError' is not an exception class"),
        ({"state_type": dict}, "state_type <class 'dict'> is not a subclass of SchemaState"),
        ({"state_type": SchemaState}, "SchemaState.wording is not set"),
    ],
)
def test_bad_input_is_named(change, message):
    kwargs = {"version_table": VERSION_TABLE, "lock_key": 1, "error": KitError, "state_type": KitState}
    args = {"metadata": metadata, "folder": FOLDER} | change
    kwargs |= {k: v for k, v in change.items() if k in kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        Migrations(args["metadata"], args["folder"], **kwargs)


def test_the_verdicts_and_their_lines_never_show_the_password():
    url = "postgresql+psycopg://kit:s3cret-pw@db.example/kit"
    tables = frozenset(metadata.tables)
    cases = [
        (KitState("0002", "0002", tables), Verdict.AT_HEAD, None),
        (KitState(None, "0002", frozenset()), Verdict.EMPTY, "has no tables yet"),
        (KitState("0001", "0002", tables), Verdict.NEEDS_UPGRADE, "older than the 0002 this kit needs"),
        (KitState("0099", "0002", tables, known=False), Verdict.NEWER_RELEASE, "this kit does not know"),
        (KitState(None, "0002", tables), Verdict.BEFORE_MIGRATIONS, "from before schema migrations"),
    ]
    for state, verdict, words in cases:
        assert state.verdict is verdict and str(verdict) == verdict.value
        line = state.problem(url)
        if words is None:
            assert line is None
            continue
        assert words in line and "\n" not in line, line
        assert line.startswith("the kit database postgresql+psycopg://kit:***@db.example/kit ")
        assert "s3cret-pw" not in line
    with pytest.raises(TypeError, match="SchemaState.wording is not set"):
        SchemaState("0001", "0002", tables).problem(url)
    # a file path is named as given; a URL SQLAlchemy cannot parse too, less its password (issue 32)
    assert display_url("results/farm.db") == "results/farm.db"
    assert display_url("not a url at all") == "not a url at all"
    bad_port = display_url("postgresql+psycopg://kit:s3cret-pw@db.example:port/kit")
    assert bad_port == "postgresql+psycopg://kit:***@db.example:port/kit"
