"""One ledger row per request (failures included, graceful stop included), estimates, and metric hygiene."""

from __future__ import annotations

import aiohttp
import pytest
from pg import DB_BACKENDS
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.metrics import GatewayMetrics, _WriteThrough
from testkit.gateway.fake_upstream import Fault

MSGS = [{"role": "user", "content": "hi"}]
ALLOWED_LABELS = {"project", "model", "task", "status", "reason", "limit", "le"}
# gateway.upstream.routing: configured deployment names, a fixed set of failure classes, configured model
# names
ALLOWED_LABELS |= {"deployment", "class", "from_model", "to_model"}


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    """Every gateway and database here runs on SQLite and on PostgreSQL (conftest: start_gateway, db_url)."""
    return request.param


async def post(s: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> tuple[int, str, bytes]:
    async with s.post(url, json=body, headers=headers) as r:
        return r.status, r.headers["x-request-id"], await r.read()


async def test_every_request_has_exactly_one_row_with_the_fakes_usage(start_gateway, fake):
    gw = await start_gateway(projects={"alpha": {"rpm": 9}}, providers={"oa": {"read_timeout_s": 0.5}})
    bearer = {"Authorization": f"Bearer {gw.keys['alpha']}"}
    xkey = {"x-api-key": gw.keys["alpha"]}
    chat = {"model": "gpt-fake", "messages": MSGS}
    resp = {"model": "gpt-fake", "input": "hello"}
    msg = {"model": "claude-fake", "max_tokens": 8, "messages": MSGS}
    plan = [
        ("chat/completions", chat, bearer, None, 200),
        ("chat/completions", {**chat, "stream": True}, bearer, None, 200),
        ("responses", resp, bearer, None, 200),
        ("responses", {**resp, "stream": True}, xkey, None, 200),
        ("messages", msg, xkey, None, 200),
        ("messages", {**msg, "stream": True}, bearer, None, 200),
        ("chat/completions", chat, {"Authorization": "Bearer wrong"}, None, 401),
        ("chat/completions", {**chat, "model": "gpt-beta"}, bearer, None, 403),
        ("chat/completions", chat, bearer, Fault(status=400), 400),
        ("chat/completions", chat, bearer, Fault(stall_after_events=0), 504),
        ("messages", msg, xkey, Fault(status=429, retry_after="90"), 429),
        ("messages", msg, xkey, None, 429),  # the 10th admitted request: over rpm
    ]
    results = []
    async with aiohttp.ClientSession() as s:
        for path, body, headers, fault, expect in plan:
            if fault is not None:
                fake.faults.append(fault)
            status, rid, _ = await post(s, f"{gw.v1}/{path}", body, headers)
            assert status == expect, (path, body, status)
            results.append((rid, status))
    rows = {r["request_id"]: r for r in await gw.rows()}
    assert len(rows) == len(plan)
    assert {rid: rows[rid]["http_status"] for rid, _ in results} == dict(results)
    ok_rows = [rows[rid] for rid, status in results if status == 200]
    assert [(r["input_tokens"], r["output_tokens"]) for r in ok_rows] == [u[2:] for u in fake.usage_log[:6]]
    assert [bool(r["stream"]) for r in ok_rows] == [False, True] * 3
    assert all(r["tokens_estimated"] == 0 and r["upstream_request_id"] for r in ok_rows)
    assert rows[results[-1][0]]["error_class"] == "limit_rpm"


async def test_missing_usage_is_estimated_and_marked(gateway, fake):
    fake.faults.extend([Fault(omit_usage=True), Fault(omit_usage=True)])
    headers = {"Authorization": f"Bearer {gateway.keys['alpha']}"}
    body = {"model": "gpt-fake", "messages": MSGS}
    async with aiohttp.ClientSession() as s:
        assert (await post(s, f"{gateway.v1}/chat/completions", body, headers))[0] == 200
        assert (await post(s, f"{gateway.v1}/chat/completions", {**body, "stream": True}, headers))[0] == 200
    rows = await gateway.rows()
    assert [r["tokens_estimated"] for r in rows] == [1, 1]
    assert all(r["input_tokens"] > 0 and r["output_tokens"] > 0 for r in rows)


async def test_graceful_stop_loses_no_rows(start_gateway, fake):
    gw = await start_gateway(ledger_flush_interval_s=60, ledger_batch_size=10_000)
    headers = {"x-api-key": gw.keys["alpha"]}
    body = {"model": "claude-fake", "max_tokens": 8, "messages": MSGS}
    async with aiohttp.ClientSession() as s:
        for _ in range(25):
            assert (await post(s, f"{gw.v1}/messages", body, headers))[0] == 200
    assert await gw.rows(flush=False) == []  # nothing flushed yet
    await gw.stop()
    assert len(await gw.rows(flush=False)) == 25


async def test_metrics_labels_are_bounded_and_carry_no_secrets(gateway, fake, oai):
    headers = {
        "Authorization": f"Bearer {gateway.keys['alpha']}",
        "X-Farm-Task": "some-random-task-9f8e",
    }
    body = {"model": "gpt-fake", "messages": MSGS}
    ids = []
    async with aiohttp.ClientSession() as s:
        fake.faults.append(Fault(status=503))
        ids.append((await post(s, f"{gateway.v1}/chat/completions", body, headers))[1])
        ids.append((await post(s, f"{gateway.v1}/chat/completions", {**body, "stream": True}, headers))[1])
        ids.append((await post(s, f"{gateway.v1}/chat/completions", {**body, "model": "x" * 40}, headers))[1])
        async with s.get(f"{gateway.url}/metrics") as r:
            text = await r.text()
        async with s.get(f"{gateway.url}/healthz") as r:
            assert r.status == 200
        async with s.get(f"{gateway.url}/readyz") as r:
            assert r.status == 200
    for secret in [*gateway.keys.values(), *(k.split("_")[1] for k in gateway.keys.values()), *ids]:
        assert secret not in text
    assert "some-random-task-9f8e" not in text and "x" * 40 not in text
    samples = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            assert set(smp.labels) <= ALLOWED_LABELS, smp
            samples[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
    tokens = sum(i for _, _, i, _ in fake.usage_log)
    key = ("gateway_input_tokens_total", (("model", "gpt-fake"), ("project", "alpha"), ("task", "other")))
    assert samples[key] == tokens
    assert (
        samples[
            (
                "gateway_upstream_retries_total",
                (("model", "gpt-fake"), ("project", "alpha"), ("reason", "503")),
            )
        ]
        == 1
    )
    for name in (
        "gateway_request_latency_seconds_count",
        "gateway_upstream_latency_seconds_count",
        "gateway_overhead_seconds_count",
        "gateway_time_to_first_token_seconds_count",
    ):
        assert any(n == name and v > 0 for (n, _), v in samples.items()), name
    assert ("gateway_in_flight", (("project", "alpha"),)) in samples
    assert ("gateway_queue_depth", (("project", "beta"),)) in samples


async def test_two_gateways_side_by_side_keep_separate_state(start_gateway, oai):
    a = await start_gateway()
    b = await start_gateway()
    await oai(a).chat.completions.create(model="gpt-fake", messages=MSGS)
    count = "gateway_requests_total"
    labels = {"project": "alpha", "model": "gpt-fake", "task": "alpha-default", "status": "ok"}
    assert a.gw.metrics.registry.get_sample_value(count, labels) == 1
    assert b.gw.metrics.registry.get_sample_value(count, labels) is None
    assert len(await a.rows()) == 1 and len(await b.rows()) == 0


async def test_oversized_client_strings_are_truncated_to_their_columns(gateway, fake):
    # aiohttp refuses a header line over 8190 bytes by default: 8 KB is the largest a client can send
    headers = {
        "Authorization": f"Bearer {gateway.keys['alpha']}",
        "X-Farm-Task": "t" * 8000,
        "X-Claude-Code-Session-Id": "s" * 8000,
    }
    async with aiohttp.ClientSession() as s:
        status, rid, _ = await post(s, f"{gateway.v1}/chat/completions", {"model": "m" * 10_000}, headers)
    assert status == 404
    (row,) = await gateway.rows()
    assert row["request_id"] == rid
    assert (len(row["task"]), len(row["session_id"]), len(row["public_model"])) == (128, 128, 128)


async def test_a_bad_row_is_dropped_not_the_whole_batch(db_url, caplog):
    from datetime import UTC, datetime

    from sqlalchemy import select

    from gateway.store.db import create_engine, ledger
    from gateway.store.ledger import LedgerWriter

    engine = create_engine(db_url)
    writer = LedgerWriter(engine, interval_s=60)

    def row(rid: str) -> dict:
        now = datetime.now(UTC)
        return {"request_id": rid, "ts": now, "endpoint": "chat", "status": "ok", "latency_ms": 1.0}

    try:
        writer.submit(row("a"))
        assert await writer.flush() == 1
        for rid in ("b", "c", "a", "d", "e"):  # "a" again: the primary key refuses it
            writer.submit(row(rid))
        assert await writer.flush() == 4
        assert writer.dropped == 1 and "dropped" in caplog.text
        assert await writer.flush() == 0  # nothing left pending to fail again
        async with engine.connect() as conn:
            assert sorted((await conn.execute(select(ledger.c.request_id))).scalars()) == list("abcde")
    finally:
        await engine.dispose()


async def test_request_metrics_reuse_their_labelled_children(gateway, oai):
    client = oai(gateway)
    for _ in range(3):
        await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    m = gateway.gw.metrics
    assert list(m._children) == [("alpha", "gpt-fake", "alpha-default", "ok")]
    assert (
        m.request_children("alpha", "gpt-fake", "alpha-default", "ok")
        is m._children[("alpha", "gpt-fake", "alpha-default", "ok")]
    )
    labels = {"project": "alpha", "model": "gpt-fake", "task": "alpha-default", "status": "ok"}
    assert m.registry.get_sample_value("gateway_requests_total", labels) == 3
    assert (
        m.registry.get_sample_value(
            "gateway_request_latency_seconds_count", {k: labels[k] for k in ("project", "model", "status")}
        )
        == 3
    )


def _exposition(m: GatewayMetrics) -> list[str]:
    """The registry's text, without the ``_created`` timestamps (two registries never share those)."""
    return [ln for ln in generate_latest(m.registry).decode().splitlines() if "_created" not in ln]


def test_the_request_tally_exposes_what_prometheus_client_would():
    """The request path counts in plain Python (RequestTally) and the counts are added to the metrics before
    each read; what a scrape sees must be what observing every value on prometheus_client gives."""
    requests = [  # latency, upstream, queue wait, ttft, input, output, cost: bucket bounds included
        (0.005, 0.004, 0.0, None, 10, 20, 0.5),
        (0.0, None, 0.0, None, 0, 0, None),
        (1.0, 0.25, 0.1, 0.05, 3, 4, None),
        (300.0, 299.0, 0.0, 1.0, 7, 0, 0.25),
        (1e9, 1e9, 5.0, 1e9, 1, 1, 0.0),
    ]
    lean, direct = GatewayMetrics(), GatewayMetrics()
    for i, (latency, upstream, wait, ttft, inp, out, cost) in enumerate(requests):
        status = "ok" if i % 2 else "error"
        lean.tally("p", "m", "t", status).record(latency, upstream, wait, ttft, inp, out, cost)
        # every value observed on prometheus_client at once, as with several processes
        _WriteThrough(direct.request_children("p", "m", "t", status)).record(
            latency, upstream, wait, ttft, inp, out, cost
        )
        if i == 2:  # a read in between: drained once, never twice
            assert _exposition(lean) == _exposition(direct)
    assert _exposition(lean) == _exposition(direct)
    assert _exposition(lean) == _exposition(direct)
    labels = {"project": "p", "model": "m", "task": "t", "status": "ok"}
    assert lean.registry.get_sample_value("gateway_requests_total", labels) == 2


def test_a_nan_latency_leaves_the_sums_finite():
    m = GatewayMetrics()
    m.tally("p", "m", "t", "ok").record(float("nan"), float("nan"), 0.0, None, 1, 1, float("nan"))
    m.tally("p", "m", "t", "ok").record(0.5, 0.25, 0.0, None, 1, 1, None)
    labels = {"project": "p", "model": "m", "status": "ok"}
    assert m.registry.get_sample_value("gateway_request_latency_seconds_sum", labels) == 0.5
    assert m.registry.get_sample_value("gateway_request_latency_seconds_count", labels) == 1
    assert m.registry.get_sample_value("gateway_cost_usd_total", {**labels, "task": "t"}) in (None, 0.0)


async def test_rows_read_back_as_written_and_a_value_no_column_takes_drops_its_row_alone(db_url, caplog):
    """The writer's own INSERT (compiled once, plain tuples) stores what SQLAlchemy's would: datetimes,
    booleans and column defaults read back through the table as they went in."""
    from datetime import UTC, datetime

    from sqlalchemy import select

    from gateway.store.db import create_engine, ledger
    from gateway.store.ledger import LedgerWriter

    engine = create_engine(db_url)
    writer = LedgerWriter(engine, interval_s=60)
    assert writer._insert is not None  # the fast path, on SQLite and on PostgreSQL (asyncpg)
    ts = datetime(2026, 11, 29, 21, 30, 1, 123456, tzinfo=UTC)
    full = {"request_id": "full", "ts": ts, "endpoint": "chat", "status": "ok", "latency_ms": 2.5,
            "stream": True, "tokens_estimated": True, "input_tokens": 7, "output_tokens": 3, "task": "t",
            "upstream_ms": 1.25, "batch_size": 4}  # fmt: skip
    try:
        writer.submit(full)
        writer.submit({**full, "request_id": "bad", "task": {"not": "a string"}})
        writer.submit({"request_id": "bare", "ts": ts, "endpoint": "chat", "status": "ok", "latency_ms": 1.0})
        assert await writer.flush() == 2
        assert writer.dropped == 1 and "column task: cannot store a dict" in caplog.text
        async with engine.connect() as conn:
            rows = {r.request_id: r._asdict() for r in await conn.execute(select(ledger))}
        assert set(rows) == {"full", "bare"}
        got = rows["full"]
        assert got["ts"].replace(tzinfo=UTC) == ts
        assert {k: got[k] for k in full if k != "ts"} == {k: v for k, v in full.items() if k != "ts"}
        bare = rows["bare"]
        assert (bare["stream"], bare["tokens_estimated"], bare["retries"], bare["input_tokens"]) == (
            False, False, 0, 0,
        )  # fmt: skip
        assert bare["queue_wait_ms"] == 0.0 and bare["task"] is None
    finally:
        await engine.dispose()
