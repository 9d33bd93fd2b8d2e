"""The gateway on PostgreSQL (asyncpg), beyond the suites that run on both databases: requests made with
the openai SDK over real HTTP land in the ledger with real types (timestamptz, boolean); a second gateway
on the same database seeds its daily budget from them; `farm gateway usage` counts UTC days whatever the
server's time zone (tests/gateway/pg.py runs it at UTC+14); a revocation made through another connection
bites at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import openai
import pytest
from sqlalchemy import text

from gateway.ops.cli import usage_rows
from gateway.store.db import create_engine
from gateway.store.keys import KeyStore

MSGS = [{"role": "user", "content": "hi"}]
BUDGET = 100_000


@pytest.fixture
def db_backend() -> str:
    return "postgresql"


async def test_openai_sdk_requests_land_in_postgresql_and_a_second_gateway_counts_them(
    start_gateway, fake, oai
):
    gw = await start_gateway(projects={"alpha": {"daily_token_budget": BUDGET}})
    assert gw.gw.settings.database_url.startswith("postgresql+asyncpg://")
    client = oai(gw)
    await client.chat.completions.create(model="gpt-fake", messages=MSGS)
    async for _ in await client.chat.completions.create(model="gpt-fake", messages=MSGS, stream=True):
        pass
    await client.responses.create(model="gpt-fake", input="hi", extra_headers={"X-Farm-Task": "checklist"})
    rows = await gw.rows()
    assert [(r["endpoint"], r["stream"], r["task"]) for r in rows] == [
        ("chat", False, "alpha-default"),
        ("chat", True, "alpha-default"),
        ("responses", False, "checklist"),
    ]
    now = datetime.now(UTC)
    for r, usage in zip(rows, fake.usage_log, strict=True):
        assert r["ts"].utcoffset() == timedelta(0) and abs(r["ts"] - now) < timedelta(minutes=1)
        assert r["tokens_estimated"] is False and r["status"] == "ok" and r["http_status"] == 200
        assert (r["input_tokens"], r["output_tokens"]) == usage[2:]
    async with gw.gw.engine.connect() as conn:
        types = dict(
            (
                await conn.execute(
                    text(
                        "SELECT column_name, data_type FROM information_schema.columns "
                        "WHERE table_name = 'gateway_ledger' AND column_name IN ('ts', 'stream')"
                    )
                )
            ).all()
        )
    assert types == {"ts": "timestamp with time zone", "stream": "boolean"}

    # yesterday 23:30 UTC is today at UTC+14 (the test server's zone): usage must say yesterday, and
    # the daily budget must not count it
    late = datetime.combine(now.date(), datetime.min.time(), UTC) - timedelta(minutes=30)
    gw.gw.ledger.submit(
        {"request_id": "late", "ts": late, "endpoint": "chat", "status": "ok", "latency_ms": 1.0,
         "project": "alpha", "input_tokens": 5000, "output_tokens": 5000}
    )  # fmt: skip
    await gw.gw.ledger.flush()
    used = sum(i + o for _, _, i, o in fake.usage_log)
    names, table = await usage_rows(gw.gw.settings, "project", None)
    by_date = {r[names.index("date")]: r[names.index("total")] for r in table}
    assert by_date == {late.date(): 10_000, now.date(): used}

    again = await start_gateway(
        database_url=gw.gw.settings.database_url, projects={"alpha": {"daily_token_budget": BUDGET}}
    )  # another process on the same database: its budget starts from what the first one recorded
    remaining = again.gw.metrics.registry.get_sample_value(
        "gateway_daily_budget_remaining_tokens", {"project": "alpha"}
    )
    assert remaining == BUDGET - used


async def test_a_revocation_through_another_connection_bites_at_once(gateway, oai):
    key, info = await gateway.gw.keys.create("alpha", "elsewhere")
    await oai(gateway, project=key).chat.completions.create(model="gpt-fake", messages=MSGS)
    engine = create_engine(gateway.gw.settings.database_url)  # as the CLI on another host would
    try:
        assert await KeyStore(engine, cache_ttl_s=0).revoke(info.id)
    finally:
        await engine.dispose()
    with pytest.raises(openai.AuthenticationError):  # the test gateways cache keys for 0 s
        await oai(gateway, project=key).chat.completions.create(model="gpt-fake", messages=MSGS)
