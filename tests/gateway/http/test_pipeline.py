"""The request path's guarantees (gateway.http.pipeline), with no HTTP server: one ledger row per request
or model call, and one release and settlement per admission, whatever the call does (returns, fails,
is refused, is cancelled). The gateway's services are real (keys, limits, ledger on SQLite, metrics); the
upstream is a scripted sender at the request path's send port, which records what the path did to it."""

from __future__ import annotations

import asyncio
import shutil

import pytest
from multidict import CIMultiDict, CIMultiDictProxy
from sqlalchemy import select

from gateway.core.record import LedgerRow, Record
from gateway.errors import RateLimited, UpstreamError
from gateway.http.app import Gateway
from gateway.store.db import ledger
from gateway.upstream.client import UpstreamResult


class ScriptedSender:
    """The send port (a routing plan's shape: ``send`` and ``settle``): answers as scripted, and logs the
    order of what the request path did to it."""

    def __init__(self, answer: int | Exception = 200) -> None:
        self.answer = answer
        self.log: list[tuple[str, object]] = []

    async def send(self, path, body, headers, on_retry=None, *, project=None) -> UpstreamResult:
        self.log.append(("send", project))
        if isinstance(self.answer, Exception):
            raise self.answer
        return UpstreamResult(self.answer, CIMultiDictProxy(CIMultiDict({"x-request-id": "up-1"})), None)

    def settle(self, actual_tokens: int) -> None:
        self.log.append(("settle", actual_tokens))


@pytest.fixture
async def gw(fake, tmp_path, sqlite_template, settings_factory):
    shutil.copyfile(sqlite_template, tmp_path / "gw.db")
    settings = settings_factory(
        fake, tmp_path / "gw.db", projects={"alpha": {"rpm": 2, "max_concurrency": 1}}
    )
    g = Gateway(settings)
    await g.start()
    yield g
    await g.stop()


async def _rows(g: Gateway) -> list[dict]:
    await g.ledger.flush()
    async with g.engine.connect() as conn:
        return [dict(r._mapping) for r in await conn.execute(select(ledger).order_by(ledger.c.ts))]


def _rec(project: str = "alpha") -> Record:
    rec = Record("chat")
    rec.project, rec.public_model = project, "gpt-fake"
    return rec


def _in_flight(g: Gateway) -> int:
    return g.limits["alpha"].in_flight


async def _exchange(
    g: Gateway, rec: Record, sender: ScriptedSender, tokens=(7, 5), fail: Exception | None = None
):
    async with (
        g.pipeline.model_call(rec),
        g.pipeline.exchange(
            rec, sender, ("/chat/completions", b"{}", {}), token_cap=10, input_estimate=7
        ) as result,
    ):
        assert _in_flight(g) == 1  # admitted: the concurrency slot is held while the answer is read
        rec.input_tokens, rec.output_tokens = tokens
        if fail is not None:
            raise fail
        rec.status, rec.http_status = "ok", result.status
    return result


async def test_a_call_that_returns_settles_once_with_its_tokens_and_writes_one_row(gw):
    sender = ScriptedSender()
    rec = _rec()
    await _exchange(gw, rec, sender)
    assert sender.log == [("send", "alpha"), ("settle", 12)]  # sent, then settled with the real tokens
    assert _in_flight(gw) == 0  # released
    rows = await _rows(gw)
    assert [r["request_id"] for r in rows] == [rec.request_id]
    assert rows[0]["status"] == "ok" and rows[0]["upstream_request_id"] == "up-1"
    assert (rows[0]["input_tokens"], rows[0]["output_tokens"]) == (7, 5)


@pytest.mark.parametrize("fault", [UpstreamError("broke off", error_class="upstream_reset"), KeyError("bug")])
async def test_a_call_that_fails_while_reading_still_settles_once_and_writes_one_row(gw, fault):
    sender = ScriptedSender()
    rec = _rec()
    with pytest.raises(type(fault)):
        await _exchange(gw, rec, sender, fail=fault)
    assert sender.log == [("send", "alpha"), ("settle", 12)]
    assert _in_flight(gw) == 0
    rows = await _rows(gw)
    assert len(rows) == 1 and rows[0]["status"] == "error"
    if isinstance(fault, UpstreamError):
        assert rows[0]["error_class"] == "upstream_reset"


async def test_a_send_that_fails_is_settled_with_no_tokens_and_noted_on_its_row(gw):
    sender = ScriptedSender(UpstreamError("upstream unreachable", error_class="upstream_connect"))
    rec = _rec()
    with pytest.raises(UpstreamError):
        await _exchange(gw, rec, sender)
    assert sender.log == [("send", "alpha"), ("settle", 0)]
    assert _in_flight(gw) == 0
    rows = await _rows(gw)
    assert [(r["status"], r["error_class"], r["input_tokens"]) for r in rows] == [
        ("error", "upstream_connect", 0)
    ]
    assert rec.upstream_end is not None  # the send's end is known: its upstream time is on the row
    assert rows[0]["upstream_ms"] is not None


async def test_a_refused_admission_sends_nothing_settles_nothing_and_writes_a_rejected_row(gw):
    await _exchange(gw, _rec(), ScriptedSender())
    await _exchange(gw, _rec(), ScriptedSender())  # rpm 2: both admitted
    sender = ScriptedSender()
    rec = _rec()
    with pytest.raises(RateLimited) as refused:
        await _exchange(gw, rec, sender)
    assert refused.value.limit == "rpm"
    assert sender.log == []  # nothing sent, nothing of the plan's to settle
    assert _in_flight(gw) == 0
    rows = await _rows(gw)
    assert [r["status"] for r in rows] == ["ok", "ok", "rejected"]
    assert rows[-1]["error_class"] == "limit_rpm" and rows[-1]["http_status"] == 429


async def test_a_cancelled_call_releases_its_slot_settles_once_and_writes_one_row(gw):
    sender = ScriptedSender()
    rec = _rec()
    reading = asyncio.Event()

    async def call() -> None:
        async with (
            gw.pipeline.model_call(rec),
            gw.pipeline.exchange(
                rec, sender, ("/chat/completions", b"{}", {}), token_cap=10, input_estimate=7
            ),
        ):
            rec.input_tokens = 3
            reading.set()
            await asyncio.Event().wait()  # the client goes away while the answer is being read

    task = asyncio.create_task(call())
    await reading.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sender.log == [("send", "alpha"), ("settle", 3)]
    assert _in_flight(gw) == 0
    assert len(await _rows(gw)) == 1


async def test_on_target_runs_after_the_send_and_before_the_answer_is_read(gw):
    sender = ScriptedSender()
    rec = _rec()
    seen: list[str] = []
    async with gw.pipeline.model_call(rec), gw.pipeline.exchange(
        rec, sender, ("/chat/completions", b"{}", {}), token_cap=10, input_estimate=7,
        on_target=lambda: seen.append("target"),
    ):  # fmt: skip
        seen.append("read")
        rec.status = "ok"
    assert seen == ["target", "read"]  # a stream's row (written while reading) knows where it went


def test_a_ledger_row_has_exactly_the_ledger_tables_columns():
    row_keys = set(LedgerRow.__annotations__)
    assert row_keys == {c.name for c in ledger.columns}
    assert set(Record("chat").row(0.001, None)) == row_keys
