"""``POST /v1/usage/requests`` (issue 33, the token account): a project reads the ledger rows of its own
request ids, with the upstream 429s, the retry wait and the output cap the ledger now keeps; another
project's ids are never described; a bad key is 401, a bad body 400."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.ops.cli import usage_rows
from gateway.summaries.schema import MAX_USAGE_IDS, USAGE_PATH, UsageReply
from testkit.gateway.fake_upstream import Fault

pytestmark = pytest.mark.asyncio
MSGS = [{"role": "user", "content": "hi"}]


async def _chat(s: aiohttp.ClientSession, gw, project: str, session: str | None = None, **body) -> str:
    headers = {"Authorization": f"Bearer {gw.keys[project]}", "X-Farm-Task": "checklist"}
    if session is not None:
        headers["session-id"] = session
    model = "gpt-fake" if project == "alpha" else "gpt-beta"
    async with s.post(f"{gw.v1}/chat/completions", json={"model": model, "messages": MSGS, **body},
                      headers=headers) as r:  # fmt: skip
        assert r.status == 200, await r.text()
        return r.headers["x-request-id"]


async def _usage(s: aiohttp.ClientSession, gw, body, key: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with s.post(f"{gw.url}{USAGE_PATH}", json=body, headers=headers) as r:
        return r.status, await r.json()


async def test_own_ids_come_back_with_429s_retry_wait_and_the_cap_others_never(gateway, fake):
    async with aiohttp.ClientSession() as s:
        fake.faults.append(Fault(status=429, retry_after="0", headers={"retry-after-ms": "30"}))
        retried = await _chat(s, gateway, "alpha", session="agent-7", max_tokens=20)
        plain = await _chat(s, gateway, "alpha")
        theirs = await _chat(s, gateway, "beta")
        # no flush here: the endpoint writes what its process still holds before it reads
        status, body = await _usage(s, gateway, {"request_ids": [retried, plain, theirs, "nope"]},
                                    gateway.keys["alpha"])  # fmt: skip
        assert status == 200, body
        reply = UsageReply.model_validate(body)
        assert reply.project == "alpha"
        rows = {r.request_id: r for r in reply.rows}
        assert set(rows) == {retried, plain}  # beta's id is not described at all
        assert sorted(reply.unknown) == sorted([theirs, "nope"])
        assert theirs not in str(body["rows"])
        r = rows[retried]
        assert (r.retries, r.rate_limited, r.max_tokens) == (1, 1, 20)
        assert (r.task, r.model, r.session_id) == ("checklist", "gpt-fake", "agent-7")
        assert r.retry_wait_ms >= 30 and r.key_id and r.key_id in gateway.keys["alpha"]
        assert r.date == r.ts[:10] and r.status == "ok"
        p = rows[plain]
        assert (p.retries, p.rate_limited, p.retry_wait_ms, p.max_tokens) == (0, 0, 0.0, None)
        assert p.session_id is None
        ledger = {row["request_id"]: row for row in await gateway.rows()}
        for rid, row in rows.items():  # what the endpoint says is what the ledger holds
            assert (row.input_tokens, row.output_tokens) == (
                ledger[rid]["input_tokens"], ledger[rid]["output_tokens"]
            )  # fmt: skip
        assert ledger[retried]["rate_limited"] == 1 and ledger[retried]["retry_wait_ms"] >= 30
        # and the other project sees its own row, and none of alpha's
        status, body = await _usage(s, gateway, {"request_ids": [retried, theirs]}, gateway.keys["beta"])
        assert status == 200 and [r["request_id"] for r in body["rows"]] == [theirs]
        assert body["unknown"] == [retried]
        async with s.get(f"{gateway.url}/metrics") as resp:
            text = await resp.text()
    samples = {
        (smp.name, smp.labels.get("task")): smp.value
        for fam in text_string_to_metric_families(text)
        for smp in fam.samples
        if smp.labels.get("project") == "alpha"
    }
    assert samples[("gateway_upstream_rate_limited_total", "checklist")] == 1
    assert samples[("gateway_upstream_retry_wait_seconds_total", "checklist")] >= 0.03
    # and `farm gateway usage` shows them per task
    names, table = await usage_rows(gateway.gw.settings, "task", None)
    (checklist,) = [r for r in table if r[names.index("task")] == "checklist"]
    assert checklist[names.index("retries")] == checklist[names.index("429s")] == 1
    assert checklist[names.index("retry_wait_s")] >= 0.03


async def test_a_bad_key_is_401_and_a_bad_body_400(gateway):
    async with aiohttp.ClientSession() as s:
        assert (await _usage(s, gateway, {"request_ids": ["x"]}, None))[0] == 401
        assert (await _usage(s, gateway, {"request_ids": ["x"]}, "kf_000000000000_wrong"))[0] == 401
        key = gateway.keys["alpha"]
        for body, words in [
            ({"request_ids": "x"}, "request_ids"),
            ({"ids": ["x"]}, "request_ids"),
            ({"request_ids": ["x"], "extra": 1}, "extra"),
            ({"request_ids": [""]}, "request id"),
            ({"request_ids": ["x" * 65]}, "request id"),
            ({"request_ids": [str(i) for i in range(MAX_USAGE_IDS + 1)]}, f"at most {MAX_USAGE_IDS}"),
            ([1, 2], "JSON object"),
        ]:
            status, reply = await _usage(s, gateway, body, key)
            assert status == 400 and words in reply["error"]["message"], (body, reply)
        async with s.post(f"{gateway.url}{USAGE_PATH}", data=b"{not json",
                          headers={"Authorization": f"Bearer {key}"}) as r:  # fmt: skip
            assert r.status == 400
        async with s.get(f"{gateway.url}{USAGE_PATH}", headers={"Authorization": f"Bearer {key}"}) as r:
            assert r.status == 405
        status, reply = await _usage(s, gateway, {"request_ids": []}, key)
        assert status == 200 and reply == {"project": "alpha", "rows": [], "unknown": []}
    assert await gateway.rows() == []  # reading usage is no ledger row
