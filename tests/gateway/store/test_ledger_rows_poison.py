"""Values that used to poison the ledger: undecodable header bytes, absurd token counts, and any row the
database driver refuses. Each is cleaned at the edge or dropped alone, once, and shown; later rows flow."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime

import aiohttp
import pytest
from pg import DB_BACKENDS
from prometheus_client.parser import text_string_to_metric_families

import gateway.store.ledger as ledger_mod
import gateway.store.ledger_rows as ledger_rows
from gateway.core.usage import MAX_TOKENS_PER_REQUEST, StreamUsage, usage_from_body
from gateway.store.ledger_queries import usage_today
from gateway.store.ledger_rows import clean_row
from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway of this module runs on SQLite and on PostgreSQL (conftest.start_gateway)."""
    return request.param


async def raw_post(port: int, path: str, body: dict, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """A real HTTP/1.1 request with header values sent as the given bytes (python-requests sends a str
    header as latin-1: ``X-Farm-Task: café-review`` arrives as b"caf\\xe9-review")."""
    data = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1".encode(),
        b"Host: 127.0.0.1",
        b"Content-Type: application/json",
        b"Content-Length: %d" % len(data),
        b"Connection: close",
        *(k + b": " + v for k, v in headers),
    ]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    head, _, _ = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    hdrs = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    return int(status_line.split()[1]), hdrs


def _row(rid: str, **extra) -> dict:
    return {
        "request_id": rid,
        "ts": datetime.now(UTC),
        "endpoint": "chat",
        "status": "ok",
        "latency_ms": 1.0,
        **extra,
    }


async def _until(cond, timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("condition not reached in time")


async def _metrics(gw) -> dict[str, float]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/metrics") as r:
            text = await r.text()
    return {
        smp.name: smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if smp.name.startswith("gateway_ledger_")
    }


async def _readyz(gw) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{gw.url}/readyz") as r:
            return r.status, await r.json()


def test_clean_row_makes_every_value_storable():
    long = "é" * 300
    row = clean_row(
        _row(
            "r1",
            task="caf\udce9-review",  # aiohttp's surrogateescape of latin-1 b"caf\xe9-review"
            session_id="a\ud800b",  # a lone surrogate from JSON "\ud800": not surrogateescape's
            public_model=long,
            upstream_request_id="x\x00y",
            input_tokens=10**30,
            output_tokens=-5,
            http_status=10**12,
            upstream_ms=float("inf"),
            queue_wait_ms=float("nan"),
            not_a_column="dropped",
        )
    )
    assert row["task"] == "caf\ufffd-review"
    assert row["session_id"] == "a\ufffdb"
    assert row["public_model"] == "é" * 128
    assert row["upstream_request_id"] == "x\ufffdy"
    assert (row["input_tokens"], row["output_tokens"], row["tokens_estimated"]) == (
        MAX_TOKENS_PER_REQUEST, 0, True,
    )  # fmt: skip
    assert row["http_status"] == 2**31 - 1
    assert row["upstream_ms"] is None and row["queue_wait_ms"] == 0.0
    assert "not_a_column" not in row
    for v in row.values():
        if isinstance(v, str):
            v.encode("utf-8")  # strict: raises on any surrogate left
    plain = _row("r2", task="t", input_tokens=5, output_tokens=7)
    got = clean_row(plain)
    assert {k: got[k] for k in plain} == plain and got["tokens_estimated"] is False
    assert got["batch_size"] is None and got["retries"] == 0  # every column, with its default
    assert clean_row(_row("r3", task={"a": 1}))["task"] == {"a": 1}  # left for the writer to refuse


def test_a_token_count_over_the_bound_is_not_usage():
    assert usage_from_body("chat", {"usage": {"prompt_tokens": 10**30, "completion_tokens": 1}}) is None
    assert usage_from_body("responses", {"usage": {"input_tokens": MAX_TOKENS_PER_REQUEST + 1}}) is None
    assert usage_from_body("messages", {"usage": {"input_tokens": 1, "output_tokens": 1e300}}) is None
    assert usage_from_body("chat", {"usage": {"prompt_tokens": MAX_TOKENS_PER_REQUEST}}) == (
        MAX_TOKENS_PER_REQUEST, 0,
    )  # fmt: skip
    tracker = StreamUsage("messages")
    ev = {"type": "message_start", "message": {"usage": {"input_tokens": 10**30, "output_tokens": 1}}}
    tracker.feed(b"event: message_start\ndata: " + json.dumps(ev).encode() + b"\n\n")
    assert tracker.bad_usage


async def test_a_latin1_header_is_stored_with_a_replacement_char_and_later_rows_flow(gateway, fake):
    key = gateway.keys["alpha"].encode()
    status, hdrs = await raw_post(
        gateway.port,
        "/v1/chat/completions",
        {"model": "gpt-fake", "messages": MSGS},
        [
            (b"Authorization", b"Bearer " + key),
            (b"X-Farm-Task", "café-review".encode("latin-1")),
            (b"X-Claude-Code-Session-Id", b"sess-\xff\xfe"),
        ],
    )
    assert status == 200
    first = hdrs["x-request-id"]
    async with aiohttp.ClientSession() as s:
        body = {"model": "gpt-fake", "messages": MSGS}
        async with s.post(
            f"{gateway.v1}/chat/completions", json=body, headers={"x-api-key": key.decode()}
        ) as r:
            assert r.status == 200
            second = r.headers["x-request-id"]
    rows = {r["request_id"]: r for r in await gateway.rows()}
    assert set(rows) == {first, second}
    assert rows[first]["task"] == "caf\ufffd-review"
    assert rows[first]["session_id"] == "sess-\ufffd\ufffd"
    assert gateway.gw.ledger.dropped == 0 and gateway.gw.ledger.pending_rows == 0
    assert (await _readyz(gateway))[0] == 200


async def test_a_surrogate_submitted_to_the_writer_is_stored_cleaned(gateway):
    """The writer cleans whatever it is given (not only what the request path already cleaned)."""
    w = gateway.gw.ledger
    w.submit(_row("surrogate", task="caf\udce9", public_model="m\ud800"))
    w.submit(_row("after"))
    rows = {r["request_id"]: r for r in await gateway.rows()}
    assert rows["surrogate"]["task"] == "caf\ufffd" and rows["surrogate"]["public_model"] == "m\ufffd"
    assert "after" in rows and w.dropped == 0


async def test_absurd_upstream_usage_is_estimated_and_the_budget_not_poisoned(start_gateway, fake):
    gw = await start_gateway(projects={"alpha": {"daily_token_budget": 1_000_000}})
    headers = {"Authorization": f"Bearer {gw.keys['alpha']}"}
    body = {"model": "gpt-fake", "messages": MSGS}
    fake.faults.append(Fault(usage={"prompt_tokens": 10**30, "completion_tokens": 10**30}))
    fake.faults.append(Fault(usage={"prompt_tokens": MAX_TOKENS_PER_REQUEST + 1}))
    ids = []
    async with aiohttp.ClientSession() as s:
        for _ in range(3):
            async with s.post(f"{gw.v1}/chat/completions", json=body, headers=headers) as r:
                assert r.status == 200, await r.text()  # the budget still admits the next request
                ids.append(r.headers["x-request-id"])
    rows = {r["request_id"]: r for r in await gw.rows()}
    assert set(rows) == set(ids)
    for rid in ids[:2]:
        assert rows[rid]["tokens_estimated"] == 1
        assert 0 < rows[rid]["input_tokens"] < 1000 and 0 < rows[rid]["output_tokens"] < 1000
    assert rows[ids[2]]["tokens_estimated"] == 0
    remaining = gw.gw.metrics.registry.get_sample_value(
        "gateway_daily_budget_remaining_tokens", {"project": "alpha"}
    )
    assert 990_000 < remaining < 1_000_000
    used = (await usage_today(gw.gw.engine)).tokens  # what the next start seeds the budget with
    assert 0 < used["alpha"] < 10_000


async def test_a_row_the_driver_refuses_is_dropped_once_counted_and_shown(gateway, monkeypatch, caplog):
    """Without the cleaning, sqlite3 refuses a surrogate (UnicodeEncodeError) and a 10**30 integer
    (OverflowError) while binding: each such row is dropped alone by the background writer, logged once,
    counted in /metrics and /readyz, kept in rejected.jsonl, and the rows around it are written."""
    # no cleaning
    monkeypatch.setattr(ledger_mod, "clean_row", lambda row, **_: {**ledger_rows.DEFAULTS, **row})
    caplog.set_level(logging.ERROR, "gateway.store.ledger")
    w = gateway.gw.ledger
    w.submit(_row("before"))
    w.submit(_row("bad-text", task="caf\udce9-review"))
    w.submit(_row("bad-int", input_tokens=10**30))
    w.submit(_row("after"))
    await _until(lambda: w.pending_rows == 0 and w.dropped == 2)
    await asyncio.sleep(0.3)  # several more ticks of the writer: nothing is retried or logged again
    refused = [r for r in caplog.records if "refused" in r.getMessage()]
    assert sorted(r.getMessage().split()[2] for r in refused) == ["bad-int", "bad-text"]
    assert w.dropped == 2 and w.failed_flushes == 0
    rows = {r["request_id"] for r in await gateway.rows()}
    assert {"before", "after"} <= rows and not rows & {"bad-text", "bad-int"}
    m = await _metrics(gateway)
    assert m["gateway_ledger_dropped_rows_total"] == 2
    assert m["gateway_ledger_written_rows_total"] >= 2
    assert m["gateway_ledger_pending_rows"] == 0 and m["gateway_ledger_flush_failures_total"] == 0
    status, body = await _readyz(gateway)
    assert status == 200 and body["ledger"]["dropped_rows"] == 2
    rejected = (gateway.db_path.parent / "gw0-spool" / "rejected.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["row"]["request_id"] for line in rejected) == ["bad-int", "bad-text"]
