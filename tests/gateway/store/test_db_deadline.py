"""gateway.store.db.within_deadline: a database call's deadline is the caller's, the call's cleanup
included. The work's cleanup here waits on an event that is set only after the caller has its answer, so
each case holds whatever the host's load (no timing is measured)."""

from __future__ import annotations

import asyncio
import gc

import pytest

from gateway.store import db
from gateway.store.db import within_deadline


async def test_the_answer_of_work_done_in_time():
    async def work() -> int:
        return 7

    assert await within_deadline(5, work) == 7
    assert not db._abandoned


async def test_an_error_of_the_work_reaches_the_caller():
    async def work() -> None:
        raise ValueError("no such column")

    with pytest.raises(ValueError, match="no such column"):
        await within_deadline(5, work)


async def test_past_the_deadline_the_caller_is_answered_before_the_cleanup_ends():
    """A statement that never answers, whose cancellation cleans up slowly (SQLAlchemy's graceful close of
    a connection cancelled mid-statement): TimeoutError at the deadline, the cleanup still running."""
    release = asyncio.Event()
    cleaned = asyncio.Event()

    async def work() -> None:
        try:
            await asyncio.Event().wait()  # the hung statement
        finally:
            await asyncio.shield(release.wait())  # the close, which a cancellation does not cut short
            cleaned.set()

    with pytest.raises(TimeoutError):
        await within_deadline(0.05, work)
    assert not cleaned.is_set() and len(db._abandoned) == 1  # answered while the cleanup still runs
    release.set()
    await cleaned.wait()
    await asyncio.sleep(0)  # the done callback
    assert not db._abandoned


async def test_a_caller_cancelled_cancels_its_work(caplog):
    started, stopped = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    caller = asyncio.ensure_future(within_deadline(60, work))
    await started.wait()
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    await stopped.wait()
    await asyncio.sleep(0)
    gc.collect()
    assert not db._abandoned
    assert "never retrieved" not in caplog.text and "destroyed but it is pending" not in caplog.text
