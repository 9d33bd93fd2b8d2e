"""The request path's fast paths keep the slow paths' behaviour: orjson with the standard library as the
judge (gateway.core.jsoncodec), the ledger's INSERTs without NULL parameters on SQLite, the header check's
memo,
the key cache, and 404/405 answered by routes instead of a middleware."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import aiohttp
import pytest
from pg import DB_BACKENDS

from gateway.core import jsoncodec
from gateway.errors import BadRequest
from gateway.upstream.transport import check_headers

MSGS = [{"role": "user", "content": "hi"}]


# --- JSON: what orjson refuses goes to the standard library, so its answer is the one a client gets --------
@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "messages": []}',
        b'{"a": "\\ud800 lone surrogate"}',  # orjson refuses, json takes
        b'{"a": NaN, "b": Infinity}',  # the same
        b'{"a": "caf\\u00e9", "n": 1.5e300, "m": -0}',
        '{"text": "déjà"}'.encode(),
    ],
)
def test_loads_gives_what_the_standard_library_gives(raw):
    assert jsoncodec.loads(raw) == json.loads(raw)


@pytest.mark.parametrize(
    "raw", [b'{"a": ', b"\xff\xfe{}", b"[" * 2000 + b"]" * 2000, b"[" * 100_000, b"{'a': 1}", b""]
)
def test_loads_refuses_what_the_standard_library_refuses(raw):
    with pytest.raises((ValueError, RecursionError)) as ours:
        jsoncodec.loads(raw)
    with pytest.raises((ValueError, RecursionError)) as theirs:
        json.loads(raw)
    assert type(ours.value) is type(theirs.value)


def test_dumps_round_trips_what_orjson_cannot_encode():
    value = {"big": 10**30, "surrogate": "a\udce9b", "text": "déjà", "list": [1, 2.5, None, True]}
    assert json.loads(jsoncodec.dumps(value)) == json.loads(json.dumps(value))
    assert jsoncodec.dumps({"a": [1, "é"]}) == '{"a":[1,"é"]}'.encode()  # orjson's compact UTF-8 form
    with pytest.raises(ValueError):
        jsoncodec.dumps({"x": object()})


# --- the ledger: rows with different NULL columns in one flush, on SQLite and PostgreSQL ------------------
@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


def _row(rid: str, **extra) -> dict:
    row = {"request_id": rid, "ts": datetime.now(UTC), "endpoint": "chat", "status": "ok", "latency_ms": 1.0}
    return row | extra


async def test_rows_with_different_null_columns_are_all_written_as_given(gateway):
    writer = gateway.gw.ledger
    full = _row(
        "full", project="alpha", task="t", session_id="s", error_class="e", ttft_ms=2.5, batch_size=3,
        translation="chat->messages", cost_usd=0.25, upstream_ms=0.5, http_status=200,
    )  # fmt: skip
    sparse = _row("sparse")
    other = _row("other", project="alpha", cost_usd=0.0, ttft_ms=None)
    for row in (full, sparse, other):
        writer.submit(row)
    rows = {r["request_id"]: r for r in await gateway.rows()}
    assert set(rows) == {"full", "sparse", "other"}
    assert rows["full"]["session_id"] == "s" and rows["full"]["batch_size"] == 3
    assert rows["full"]["cost_usd"] == 0.25 and rows["full"]["ttft_ms"] == 2.5
    assert rows["sparse"]["project"] is None and rows["sparse"]["cost_usd"] is None
    assert rows["sparse"]["retries"] == 0 and rows["sparse"]["stream"] in (0, False)  # column defaults
    assert rows["other"]["cost_usd"] == 0.0 and rows["other"]["ttft_ms"] is None
    assert writer.dropped == 0


async def test_sqlite_inserts_name_only_the_columns_with_values(gateway, db_backend):
    insert = gateway.gw.ledger._insert
    if db_backend != "sqlite":
        assert insert is None or not insert.omit_nulls
        return
    a = insert.params(_row("a"))
    b = insert.params(_row("b", project="alpha"))
    c = insert.params(_row("c"))
    statements = insert.statements([a, b, c])
    assert len(statements) == 2  # one per pattern of NULLs, in the order first seen
    (sql_a, rows_a), (sql_b, rows_b) = statements
    assert [r[0] for r in rows_a] == ["a", "c"] and None not in rows_a[0]
    assert "project" not in sql_a and "project" in sql_b and None not in rows_b[0]


# --- the header check's memo never lets a bad value through ------------------------------------------------
def test_a_bad_header_value_is_refused_after_a_good_one_of_the_same_name():
    check_headers({"anthropic-beta": "tools-2024-04-04"})
    check_headers({"anthropic-beta": "tools-2024-04-04"})  # from the memo
    with pytest.raises(BadRequest, match="anthropic-beta"):
        check_headers({"anthropic-beta": "tools\r\nX-Injected: 1"})
    with pytest.raises(BadRequest, match="valid HTTP header name"):
        check_headers({"bad name": "v"})


# --- the key cache: a revoked key stops at once, a wrong key never matches a cached one ----------
async def test_cached_key_revoked_and_a_near_miss_key(gateway, fake):
    key = gateway.keys["alpha"]
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "gpt-fake", "messages": MSGS}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{gateway.v1}/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200  # now cached
        near = key[:-1] + ("A" if key[-1] != "A" else "B")  # same key id, other secret part
        async with s.post(
            f"{gateway.v1}/chat/completions", json=body, headers={"Authorization": f"Bearer {near}"}
        ) as r:
            assert r.status == 401
        info = await gateway.gw.keys.authenticate(key)
        assert await gateway.gw.keys.revoke(info.id)
        async with s.post(f"{gateway.v1}/chat/completions", json=body, headers=headers) as r:
            assert r.status == 401


# --- 404 / 405 as routes -----------------------------------------------------------------------------------
async def test_unknown_paths_and_methods_answer_in_the_api_shape_and_head_still_works(gateway):
    async with aiohttp.ClientSession() as s:
        async with s.head(f"http://127.0.0.1:{gateway.port}/healthz") as r:
            assert r.status == 200
        async with s.put(f"http://127.0.0.1:{gateway.port}/healthz") as r:
            assert r.status == 405 and r.headers["Allow"] == "GET,HEAD"
            assert (await r.json())["error"]["message"].startswith("PUT is not allowed on /healthz")
        async with s.get(f"{gateway.v1}/chat/completions") as r:
            assert r.status == 405 and r.headers["Allow"] == "POST"
        async with s.post(f"{gateway.v1}/messages/nope", headers={"anthropic-version": "2023-06-01"}) as r:
            assert r.status == 404 and (await r.json())["type"] == "error"  # Anthropic's error shape
