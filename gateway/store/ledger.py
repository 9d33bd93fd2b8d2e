"""The token ledger: one row per client request, written in batches by a background task.

``submit`` is synchronous: it cleans the row (``clean_row``: every string valid UTF-8 and cut to its
column, token counts clamped), appends it to the write-ahead spool (gateway.store.spool: one ``os.write``) and
to a list, so the request path never waits on the database and a killed process loses no row. The writer
flushes every ``interval`` seconds, sooner when a batch fills, and once more on ``stop``; each flush seals
the spool's live segment and deletes the sealed ones once their rows are written. At start, segments left
by a dead process are replayed, inserting only the request ids the database lacks.

A failed flush keeps its rows (and their spool segments) for the next tick, except rows refused for their
data (by the database, or by the driver while binding: UnicodeEncodeError, OverflowError, ...): those are
found by splitting the batch, logged once, kept in the spool's ``rejected.jsonl`` and dropped, so one bad
row never blocks the ledger. ``problems()`` names what makes the writer unfit to serve (behind, failing,
spool not writable); /readyz and /metrics read it.

The row's shape and cleaning, and the INSERT it goes through, are gateway.store.ledger_rows; each written
batch also adds its sums to the daily usage in the same transaction (gateway.store.ledger_daily); the read
queries (what each project used today, `farm gateway usage`) are gateway.store.ledger_queries.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.core.record import LedgerRow
from gateway.store.db import ledger
from gateway.store.ledger_daily import DailyUpsert, daily_sums
from gateway.store.ledger_rows import (
    COLUMNS,
    DATETIMES,
    BadRow,
    LedgerInsert,
    clean_row,
    is_row_error,
    row_values,
)
from gateway.store.spool import Segment, Spool, dumps_row, header

log = logging.getLogger("gateway.store.ledger")

MAX_BACKLOG = 200_000
FAILURES_UNREADY = 3  # consecutive failed flushes that make the writer unfit to serve
_LOG_EVERY_S = 60.0  # a persisting failure is logged again at most this often


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0][:300] if str(e) else ""
    return f"{e.__class__.__name__}: {text}" if text else e.__class__.__name__


class _Failures:
    """Failures of one kind of write (flushes, or the spool replay): counted, and logged the first time
    with the traceback, then at most once a minute while they last, and once on recovery."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.total = 0
        self.consecutive = 0
        self.last: str | None = None  # the last error, while failing
        self._logged_at = 0.0

    def note(self, e: BaseException, pending: int) -> None:
        self.total += 1
        self.consecutive += 1
        self.last = _first_line(e)
        now = time.monotonic()
        if self.consecutive == 1:
            self._logged_at = now
            log.error("%s failed; will retry (%d rows pending)", self.what, pending, exc_info=e)
        elif now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            log.error(
                "%s still failing after %d attempts, %d rows pending: %s",
                self.what,
                self.consecutive,
                pending,
                self.last,
            )

    def ok(self) -> None:
        if self.consecutive:
            log.warning("%s recovered after %d failed attempts", self.what, self.consecutive)
            self.consecutive = 0
            self.last = None


class LedgerWriter:
    """The batched writer. ``spool_dir``: the write-ahead spool's folder (None: no spool, rows live only
    in memory until written). ``max_pending_rows`` / ``max_lag_s``: past either (rows waiting, age of the
    oldest) the writer reports itself behind in ``problems()``."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        interval_s: float = 0.25,
        batch_size: int = 500,
        spool_dir: str | os.PathLike | None = None,
        max_pending_rows: int | None = None,
        max_lag_s: float | None = None,
    ) -> None:
        self._engine = engine
        self._insert = LedgerInsert(engine) if LedgerInsert.supported(engine) else None
        self._daily = DailyUpsert(engine.dialect)
        self._interval = interval_s
        self._batch_size = batch_size
        self._max_pending = max_pending_rows if max_pending_rows is not None else max(50 * batch_size, 20_000)
        self._max_lag = max_lag_s if max_lag_s is not None else max(40 * interval_s, 10.0)
        self._spool = Spool(spool_dir, header(COLUMNS)) if spool_dir is not None else None
        self._orphans: list[Segment] = []  # segments of dead processes, claimed, not yet replayed
        self._pending: list[dict] = []
        self._pending_since: float | None = None  # monotonic time of the oldest pending row
        self._inflight = 0  # rows of the flush in progress
        self._inflight_since: float | None = None
        self._wake = asyncio.Event()
        # sees every batch before it is written, and may change its rows (the shared limits flag the rows
        # written while Redis is away: gateway.limits.redis); must be idempotent (a failed batch comes back)
        self.before_write: Callable[[list[dict]], None] | None = None
        self._lock = asyncio.Lock()
        self._task: asyncio.Task | None = None
        self._stopping = False
        self.written = 0
        self._flush_failures = _Failures("ledger flush")
        self._replay_failures = _Failures("ledger spool replay")
        self.dropped = 0  # rows refused for their data
        self.replayed = 0  # rows a previous process spooled that this one wrote
        self.spool_errors = 0
        self._spool_error: str | None = None  # the last spool write failure, until a write succeeds

    @property
    def failed_flushes(self) -> int:
        return self._flush_failures.total

    @property
    def consecutive_failures(self) -> int:
        return self._flush_failures.consecutive

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def spool_dir(self) -> str | None:
        return str(self._spool.dir) if self._spool is not None else None

    # --- the request path --------------------------------------------------------------------------
    def submit(self, row: LedgerRow | dict, *, owned: bool = False) -> None:
        """Record one row: cleaned, in the spool when this returns, written by the next flush. ``owned``:
        the caller will not use ``row`` again (it is cleaned in place)."""
        row = clean_row(row, owned=owned)
        spool = self._spool
        if spool is not None:
            try:
                spool.append(dumps_row(row_values(row)))
            except Exception as e:  # the row stays in memory; readyz says the spool is failing
                self._spool_failed(e)
            else:
                if self._spool_error is not None:
                    self._spool_error = None
        pending = self._pending
        if not pending:
            self._pending_since = time.monotonic()
        pending.append(row)
        if len(pending) >= self._batch_size:
            self._wake.set()

    def review_pending(self) -> None:
        """Run ``before_write`` over the rows not yet written (those of a write in progress had theirs)."""
        if self.before_write is not None and self._pending:
            self.before_write(self._pending)

    def _spool_failed(self, e: Exception) -> None:
        self.spool_errors += 1
        first = self._spool_error is None
        self._spool_error = _first_line(e)
        if first:
            log.error("ledger spool %s: cannot write a row (kept in memory only): %s", self.spool_dir, e)

    # --- health --------------------------------------------------------------------------------------
    @property
    def pending_rows(self) -> int:
        return len(self._pending) + self._inflight

    def oldest_pending_s(self) -> float:
        since = [t for t in (self._pending_since, self._inflight_since) if t is not None]
        return time.monotonic() - min(since) if since else 0.0

    def problems(self) -> list[str]:
        """What makes this writer unfit to serve, in words; empty when healthy."""
        out = []
        if not self.running:
            out.append("ledger writer not running")
        pending = self.pending_rows
        if pending > self._max_pending:
            out.append(f"ledger behind: {pending} rows pending (over {self._max_pending})")
        lag = self.oldest_pending_s()
        if lag > self._max_lag:
            out.append(
                f"ledger behind: the oldest pending row waits for {lag:.1f} s (over {self._max_lag:g})"
            )
        if self.consecutive_failures >= FAILURES_UNREADY:
            out.append(
                f"ledger flushes failing: {self.consecutive_failures} in a row, {pending} rows pending; "
                f"last: {self._flush_failures.last}"
            )
        if self._spool_error is not None:
            out.append(f"ledger spool not writable ({self.spool_dir}): {self._spool_error}")
        if self._orphans and self._replay_failures.consecutive >= FAILURES_UNREADY:
            out.append(
                f"ledger spool replay failing: {len(self._orphans)} segments of a previous process left; "
                f"last: {self._replay_failures.last}"
            )
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "pending_rows": self.pending_rows,
            "oldest_pending_s": round(self.oldest_pending_s(), 3),
            "written_rows": self.written,
            "dropped_rows": self.dropped,
            "replayed_rows": self.replayed,
            "flush_failures": self.failed_flushes,
            "consecutive_failures": self.consecutive_failures,
            "spool_errors": self.spool_errors,
            "spool_dir": self.spool_dir,
        }

    # --- lifecycle -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Open the spool, replay the segments of dead processes (so the daily budgets seeded after this
        count their tokens), then start the background writer. A replay that fails is retried by it."""
        self._stopping = False
        if self._spool is not None:
            self._spool.open()
            self._orphans += self._spool.claim_orphans()
            if self._orphans:
                try:
                    await self._replay()
                except Exception:  # logged by _replay; the writer retries it
                    pass
        self._task = asyncio.create_task(self._run(), name="gateway-ledger-writer")

    async def _run(self) -> None:
        while not self._stopping:
            try:
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            if self._orphans:
                try:
                    await self._replay()
                except Exception:  # logged by _replay; its segments stay for the next tick
                    pass
            try:
                await self.flush()
            except Exception:  # logged by flush; rows stay pending
                pass

    async def stop(self) -> None:
        """Stop the writer and flush; when every row is written, delete this process's spool segments,
        otherwise leave them for the next start."""
        self._stopping = True
        self._wake.set()
        try:
            if self._task is not None:
                try:
                    await self._task
                finally:
                    self._task = None
            await self.flush()
        finally:
            if self._spool is not None:
                self._spool.close(delete=not self._pending and not self._inflight)
            for seg in self._orphans:
                seg.release(delete=False)
            self._orphans = []

    # --- writing -------------------------------------------------------------------------------------
    def _drop(self, row: dict, e: Exception) -> None:
        self.dropped += 1
        log.error("ledger row %s refused for its data, dropped: %s", row.get("request_id"), _first_line(e))
        if self._spool is not None:
            try:
                line = dumps_row({"error": _first_line(e), "row": row})
            except Exception:
                line = dumps_row({"error": _first_line(e), "row": repr(row)})
            self._spool.reject(line)

    async def flush(self) -> int:
        """Write everything submitted so far; returns the number of rows written.

        A batch refused for its data (a value too long, a duplicate key, a value the driver cannot bind)
        is split in halves until the bad rows are found: those are logged once and dropped, the rest are
        written. Any other failure (the database unreachable, locked, ...) keeps every unwritten row
        pending, and its spool segments, for the next flush, and is raised.
        """
        async with self._lock:
            if not self._pending:
                return 0
            batch, self._pending = self._pending, []
            if self.before_write is not None:
                self.before_write(batch)
            since, self._pending_since = self._pending_since, None
            mark = self._spool.seal() if self._spool is not None else 0
            self._inflight, self._inflight_since = len(batch), since
            todo = [batch]  # a stack of chunks, the next to write last
            try:
                written = await self._write_all(todo)
            except BaseException as e:
                rest = [r for c in reversed(todo) for r in c]
                self._pending[:0] = rest
                if rest:
                    self._pending_since = since
                if len(self._pending) > MAX_BACKLOG:
                    shed = len(self._pending) - MAX_BACKLOG
                    del self._pending[:shed]
                    if self._spool is not None:
                        self._spool.keep = True  # the shed rows stay in the spool for the next start
                    log.error(
                        "ledger backlog over %d rows: dropped the %d oldest from memory%s",
                        MAX_BACKLOG,
                        shed,
                        " (kept in the spool for the next start)" if self._spool is not None else "",
                    )
                self._inflight, self._inflight_since = 0, None
                if isinstance(e, Exception):
                    self._flush_failures.note(e, self.pending_rows)
                raise
            self._inflight, self._inflight_since = 0, None
            self._flush_failures.ok()
            if self._spool is not None:
                self._spool.discard(mark)
            return written

    async def _write_all(self, todo: list[list[dict]]) -> int:
        """Write the chunks of ``todo`` (a stack), splitting a refused one to drop its bad rows alone. On
        any other failure the unwritten chunks are left in ``todo`` and the error is raised."""
        written = 0
        while todo:
            chunk = todo.pop()
            try:
                await self._write(chunk)
            except BaseException as e:
                if not isinstance(e, Exception) or not is_row_error(e):
                    todo.append(chunk)
                    raise
                if len(chunk) == 1:
                    self._drop(chunk[0], e)
                else:
                    mid = len(chunk) // 2
                    todo += [chunk[mid:], chunk[:mid]]
                continue
            written += len(chunk)
            self.written += len(chunk)
        return written

    async def _write(self, rows: list[dict]) -> None:
        """Insert ``rows`` and add their sums to the daily usage (gateway.store.ledger_daily), in one
        transaction. A value its column cannot take, or that cannot be summed, is BadRow (the batch is
        split to find it)."""
        try:
            params = None if self._insert is None else self._insert.params_many(rows)
            sums = daily_sums(rows)
        except (ValueError, TypeError, AttributeError) as e:  # a value its column cannot take
            if len(rows) == 1:
                raise BadRow(str(e)) from e
            raise BadRow("a row in the batch has a value its column cannot take") from e
        async with self._engine.begin() as conn:
            if params is None:
                await conn.execute(ledger.insert(), rows)
            else:
                for sql, rows_params in self._insert.statements(params):
                    await conn.exec_driver_sql(sql, rows_params)
            await self._daily.add(conn, sums)

    # --- replay --------------------------------------------------------------------------------------
    async def _replay(self) -> None:
        """Write the rows of the claimed segments of dead processes that the database lacks (by request
        id, so a row already written, or a segment replayed twice, is never duplicated), then delete each
        segment. Refused rows are dropped as in a flush; any other failure keeps the remaining segments
        and is raised."""
        async with self._lock:
            size = min(self._batch_size, 500)
            while self._orphans:
                seg = self._orphans[0]
                rows = bad = 0
                try:
                    for chunk, skipped in seg.chunks(size, DATETIMES):
                        bad += skipped
                        rows += len(chunk)
                        by_id = {r["request_id"]: clean_row(r) for r in chunk}
                        present = await self._present(list(by_id))
                        todo = [[r for rid, r in by_id.items() if rid not in present]]
                        self.replayed += await self._write_all(todo)
                except Exception as e:
                    self._replay_failures.note(e, self.pending_rows)
                    raise
                self._replay_failures.ok()
                if bad:
                    log.error("ledger spool %s: %d lines were not rows (cut short?), skipped", seg.path, bad)
                log.info("ledger spool: replayed %s (%d rows)", seg.path.name, rows)
                seg.release(delete=True)
                self._orphans.pop(0)

    async def _present(self, ids: list[str]) -> set[str]:
        q = select(ledger.c.request_id).where(ledger.c.request_id.in_(ids))
        async with self._engine.connect() as conn:
            return {r for (r,) in await conn.execute(q)}
