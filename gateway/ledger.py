"""The token ledger: one row per client request, written in batches by a background task.

``submit`` is synchronous and only appends to a list, so the request path never waits on the database.
The writer flushes every ``interval`` seconds, sooner when a batch fills, and once more on ``stop``.
A failed flush keeps its rows and tries again on the next tick, except rows the database refuses for their
data: those are found by splitting the batch, logged and dropped, so one bad row never blocks the ledger.

On a dialect with positional parameters (SQLite, asyncpg) the INSERT is compiled once and fed plain tuples
through the driver's executemany, with the column types' own bind processors applied here. Measured on
SQLite, that takes a row from 41 us of CPU (the Core insert) to 24 us (raw sqlite3 alone: 7 us); at 1500
requests/s the difference is 2.5% of a core in the gateway's process. Elsewhere the Core insert is used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.db import ledger

log = logging.getLogger("gateway.ledger")

MAX_BACKLOG = 200_000
_PLAIN_TYPES = (str, int, float, type(None))  # what every driver binds as it is (bool is an int)
_PLAIN = frozenset({*_PLAIN_TYPES, bool})


class _Insert:
    """The ledger INSERT compiled once for a positional-parameter dialect; rows become tuples in its
    parameter order, each value through its column type's bind processor (as SQLAlchemy would store it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        dialect = engine.dialect
        names = [c.name for c in ledger.columns]
        compiled = ledger.insert().compile(dialect=dialect, column_keys=names)
        self.sql = compiled.string
        order = list(compiled.positiontup or ())
        assert sorted(order) == sorted(names), (order, names)
        self.defaults: list[tuple[str, Any]] = []  # (column, value when the row has none), in order
        self.processors: list[tuple[int, Callable[[Any], Any]]] = []  # (position, bind processor)
        for i, name in enumerate(order):
            col = ledger.c[name]
            default = col.default.arg if col.default is not None and col.default.is_scalar else None
            self.defaults.append((name, default))
            process = col.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                self.processors.append((i, process))

    @staticmethod
    def supported(engine: AsyncEngine) -> bool:
        return bool(engine.dialect.positional)

    def params(self, row: dict) -> tuple:
        """The row's parameters in order; ValueError names a value no driver could bind."""
        get = row.get
        values = [get(name, default) for name, default in self.defaults]
        for i, process in self.processors:
            if values[i] is not None:
                values[i] = process(values[i])
        if not _PLAIN.issuperset(map(type, values)):
            for (name, _), value in zip(self.defaults, values, strict=True):
                if not isinstance(value, _PLAIN_TYPES):
                    raise ValueError(f"column {name}: cannot store a {type(value).__name__}")
        return tuple(values)


class _BadRow(Exception):
    """A row with a value its column cannot take, found before it reached the database."""


def _is_row_error(e: Exception) -> bool:
    """Whether the database refused the rows' data (not the database being unavailable)."""
    if isinstance(e, (DataError, IntegrityError, _BadRow)):
        return True
    return isinstance(e, StatementError) and not isinstance(e, DBAPIError)  # a value that cannot be bound


class LedgerWriter:
    def __init__(self, engine: AsyncEngine, *, interval_s: float = 0.25, batch_size: int = 500) -> None:
        self._engine = engine
        self._insert = _Insert(engine) if _Insert.supported(engine) else None
        self._interval = interval_s
        self._batch_size = batch_size
        self._pending: list[dict] = []
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.written = 0
        self.failed_flushes = 0
        self.dropped = 0  # rows the database refused for their data

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def submit(self, row: dict) -> None:
        self._pending.append(row)
        if len(self._pending) >= self._batch_size:
            self._wake.set()

    async def start(self) -> None:
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="gateway-ledger-writer")

    async def _run(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.flush()
            except Exception:  # keep the writer alive; rows stay pending
                log.exception("ledger flush failed; will retry")

    async def flush(self) -> int:
        """Write everything submitted so far; returns the number of rows written.

        A batch the database refuses for its data (a value too long, a duplicate key, a value of the wrong
        type) is split in halves until the bad rows are found: those are logged and dropped, the rest are
        written. Any other failure (the database unreachable, locked, ...) keeps every unwritten row
        pending for the next flush.
        """
        async with self._lock:
            if not self._pending:
                return 0
            batch, self._pending = self._pending, []
            todo = [batch]  # a stack of chunks, the next to write last
            written = 0
            chunk: list[dict] = []
            try:
                while todo:
                    chunk = todo.pop()
                    try:
                        await self._write(chunk)
                    except Exception as e:
                        if not _is_row_error(e):
                            raise
                        if len(chunk) == 1:
                            self.dropped += 1
                            log.error(
                                "ledger row %s refused by the database, dropped: %s",
                                chunk[0].get("request_id"),
                                str(e).splitlines()[0][:300] if str(e) else e.__class__.__name__,
                            )
                        else:
                            mid = len(chunk) // 2
                            todo += [chunk[mid:], chunk[:mid]]
                        continue
                    written += len(chunk)
                    self.written += len(chunk)
            except BaseException:
                self.failed_flushes += 1
                self._pending[:0] = chunk + [r for c in reversed(todo) for r in c]
                if len(self._pending) > MAX_BACKLOG:
                    dropped = len(self._pending) - MAX_BACKLOG
                    del self._pending[:dropped]
                    log.error("ledger backlog over %d rows: dropped the %d oldest", MAX_BACKLOG, dropped)
                raise
            return written

    async def _write(self, rows: list[dict]) -> None:
        if self._insert is None:
            async with self._engine.begin() as conn:
                await conn.execute(ledger.insert(), rows)
            return
        params = []
        for row in rows:
            try:
                params.append(self._insert.params(row))
            except (ValueError, TypeError, AttributeError) as e:  # a value its column cannot take
                if len(rows) == 1:
                    raise _BadRow(str(e)) from e
                raise _BadRow("a row in the batch has a value its column cannot take") from e
        async with self._engine.begin() as conn:
            await conn.exec_driver_sql(self._insert.sql, params)

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            try:
                await self._task
            finally:
                self._task = None
        await self.flush()


async def tokens_used_today(engine: AsyncEngine) -> dict[str, int]:
    """Per project, tokens recorded since 00:00 UTC (to seed the daily budgets at start)."""
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    q = (
        select(ledger.c.project, func.sum(ledger.c.input_tokens + ledger.c.output_tokens))
        .where(ledger.c.ts >= midnight, ledger.c.project.is_not(None))
        .group_by(ledger.c.project)
    )
    async with engine.connect() as conn:
        rows = (await conn.execute(q)).all()
    return {p: int(n or 0) for p, n in rows}
