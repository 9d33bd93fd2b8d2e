"""The summaries endpoint: batching window, per-caller drafts, content-hash cache, repair, offline drafter."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gateway.summaries.batcher import SUMMARIES_PATH
from gateway.summaries.schema import AnomalyIn, Draft, DraftList

pytestmark = pytest.mark.asyncio


def anomaly(i: int, kind: str = "slower", **kw) -> dict:
    base = {
        "id": f"an-{i}",
        "fingerprint": f"fp{i:04d}",
        "kind": kind,
        "severity": "error",
        "message": f"median ratio 1.{i}",
        "interface": {"family": "gemm", "backend": "triton", "signature": f"gemm.triton(m={i}, n=64, k=64)"},
        "config_diff": {"BLOCK_M": [64, 128]},
        "log_excerpt": f"12:00:0{i % 10} ERROR kernel slow on point {i}",
        "expected_metrics": [{"metric": "ratio", "expected": "<= 1.05", "measured": 1.0 + i / 10}],
        "prohibitions": ["no full kernel implementations"],
    }
    base.update(kw)
    return base


def _nested(depth: int) -> list:
    out: list = []
    for _ in range(depth - 1):
        out = [out]
    return out


def model_reply(body: dict) -> str:
    """What a well-behaved model answers: one draft per anomaly id it was sent."""
    msgs = [m for m in body.get("messages", []) if m["role"] == "user"]
    payload = json.loads(msgs[0]["content"].split("\n", 1)[1])
    return json.dumps(
        {
            "drafts": [
                {
                    "assertion": f"{a['interface']['signature']} ratio <= 1.05",
                    "verify_how": "farm accept JOB --confirm",
                    "failure_signature": a["log_excerpt"],
                    "needs_local_profiler": False,
                    "anomaly_ids": [a["id"]],
                }
                for a in payload["anomalies"]
            ]
        }
    )


async def post(gw, body: dict, project: str = "alpha", headers: dict | None = None) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        headers = {"Authorization": f"Bearer {gw.keys[project]}", **(headers or {})}
        async with s.post(gw.url + SUMMARIES_PATH, json=body, headers=headers) as r:
            return r.status, await r.json()


async def summary_rows(gw) -> list:
    return [r for r in await gw.rows() if r["endpoint"] == "summaries"]


async def test_concurrent_callers_share_one_model_call_and_get_their_own_drafts(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 5000, "max_items": 3})  # the 3rd anomaly fills it
    bodies = [{"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(i)]} for i in range(3)]
    results = await asyncio.gather(*(post(gw, b) for b in bodies))
    assert fake.requests == 1
    for i, (status, data) in enumerate(results):
        assert status == 200, data
        assert [d["anomaly_ids"] for d in data["drafts"]] == [[f"an-{i}"]]
        assert f"m={i}," in data["drafts"][0]["assertion"]
        assert data["batch"] == {"requests": 3, "items": 3, "request_ids": data["batch"]["request_ids"]}
        assert data["offline"] is False and data["cached"] is False
        assert data["usage"]["input_tokens"] > 0
    sent = fake.seen[0].body
    assert sent["max_tokens"] == 1000 and sent["temperature"] <= 0.2
    assert sent["response_format"] == {"type": "json_object"}
    rows = await summary_rows(gw)
    assert len(rows) == 1
    assert rows[0]["task"] == "checklist" and rows[0]["batch_size"] == 3 and rows[0]["status"] == "ok"
    assert rows[0]["input_tokens"] == fake.usage_log[0][2]


async def test_model_calls_carry_the_agent_session_of_their_requests(start_gateway, fake):
    """A request's session header (``session-id``, or Claude Code's) reaches the ledger rows of the model
    calls that serve it: requests of one session share a call, those of another session or of none get
    their own, so each row names the one session that asked."""
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 400, "max_items": 50})
    calls = [
        ([anomaly(1)], {"session-id": "sess-a"}),
        ([anomaly(2)], {"session-id": "sess-a"}),
        ([anomaly(3)], {"X-Claude-Code-Session-Id": "sess-b"}),
        ([anomaly(4)], None),
    ]
    results = await asyncio.gather(
        *(post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": a}, headers=h) for a, h in calls)
    )
    assert [status for status, _ in results] == [200] * 4
    assert fake.requests == 3  # sess-a's two requests in one call; sess-b and no session apart
    sessions = {r["request_id"]: r["session_id"] for r in await summary_rows(gw)}
    assert len(sessions) == 3
    served = [data["batch"]["request_ids"] for _, data in results]
    assert served[0] == served[1] and results[0][1]["batch"]["requests"] == 2
    assert [[sessions[i] for i in ids] for ids in served] == [["sess-a"], ["sess-a"], ["sess-b"], [None]]


async def test_window_flushes_a_lone_caller_and_equal_anomalies_are_sent_once(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 20, "max_items": 50})
    same = anomaly(7)
    a = {"task": "log_summary", "model": "gpt-fake", "anomalies": [same]}
    b = {"task": "log_summary", "model": "gpt-fake", "anomalies": [{**same, "id": "theirs"}, anomaly(8)]}
    (sa, da), (sb, db) = await asyncio.gather(post(gw, a), post(gw, b))
    assert sa == sb == 200
    assert fake.requests == 1
    sent = json.loads(fake.seen[0].body["messages"][1]["content"].split("\n", 1)[1])
    assert len(sent["anomalies"]) == 2  # anomaly 7 once, under a batch-local id
    assert fake.seen[0].body["max_tokens"] == 2000
    assert [d["anomaly_ids"] for d in da["drafts"]] == [["an-7"]]
    assert sorted(i for d in db["drafts"] for i in d["anomaly_ids"]) == ["an-8", "theirs"]


async def test_identical_set_hits_the_cache(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 1})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1), anomaly(2)]}
    s1, d1 = await post(gw, body)
    relabelled = {**body, "anomalies": [{**anomaly(2), "id": "x"}, {**anomaly(1), "id": "y"}]}
    s2, d2 = await post(gw, relabelled)
    assert s1 == s2 == 200
    assert fake.requests == 1
    assert d2["cached"] is True and d2["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert sorted(i for d in d2["drafts"] for i in d["anomaly_ids"]) == ["x", "y"]
    assert len(await summary_rows(gw)) == 1


async def test_invalid_answer_is_repaired_once(start_gateway, fake):
    gw = await start_gateway(summaries={"window_ms": 1})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]}
    fake.replies.extend(["Sure! Here are drafts: {drafts: oops"])
    fake.reply = model_reply
    status, data = await post(gw, body)
    assert status == 200, data
    assert fake.requests == 2
    repair = fake.seen[1].body["messages"]
    assert repair[-1]["role"] == "user" and "invalid" in repair[-1]["content"]
    rows = await summary_rows(gw)
    assert len(rows) == 2 and all(r["batch_size"] == 1 for r in rows)


async def test_invalid_answer_twice_is_a_clear_error(start_gateway, fake):
    gw = await start_gateway(summaries={"window_ms": 1})
    fake.replies.extend(["not json at all", json.dumps({"drafts": [{"assertion": "x"}]})])
    status, data = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 502
    assert "after one repair attempt" in data["error"]["message"]
    assert "verify_how" in data["error"]["message"]
    assert fake.requests == 2
    # not cached: the next try asks again
    fake.reply = model_reply
    status, _ = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 200 and fake.requests == 3


async def test_anthropic_provider(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 1})
    status, data = await post(gw, {"task": "checklist", "model": "claude-fake", "anomalies": [anomaly(3)]})
    assert status == 200, data
    assert fake.seen[0].path == "/v1/messages" and "drafts" in fake.seen[0].body["system"]
    assert data["drafts"][0]["anomaly_ids"] == ["an-3"]


@pytest.mark.parametrize(
    "body, where",
    [
        ({"task": "essay", "anomalies": [anomaly(1)]}, "task"),
        ({"task": "checklist", "anomalies": []}, "anomalies"),
        ({"task": "checklist", "anomalies": [anomaly(1), anomaly(1)]}, "used twice"),
        ({"task": "checklist", "anomalies": [{**anomaly(1), "raw_log": "x"}]}, "raw_log"),
        ({"task": "checklist", "model": "gpt-beta", "anomalies": [anomaly(1)]}, "not allowed"),
        # seen: 900 levels parsed, then pydantic's serializer gave up hashing it: a 500
        ({"task": "checklist", "anomalies": [anomaly(1, config_diff={"x": _nested(900)})]}, "nested deeper"),
        ({"task": "checklist", "anomalies": [anomaly(1, config_diff={"x": _nested(17)})]}, "config_diff"),
    ],
)
async def test_bad_requests_name_the_field(gateway, fake, body, where):
    status, data = await post(gateway, body)
    assert status in (400, 403)
    assert where in data["error"]["message"]
    assert fake.requests == 0


async def test_missing_key_is_401(gateway):
    async with aiohttp.ClientSession() as s:
        async with s.post(gateway.url + SUMMARIES_PATH, json={"task": "checklist"}) as r:
            assert r.status == 401


OFFLINE = {
    "providers": {"offline": {"kind": "local"}},
    "models": {
        "gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"},
        "gpt-beta": {"provider": "oa", "upstream_model": "gpt-beta"},
        "claude-fake": {"provider": "an", "upstream_model": "claude-upstream"},
        "offline": {"provider": "offline", "upstream_model": "rules"},
    },
    "projects": {"alpha": {"models": ["offline", "gpt-fake"]}},
}


@pytest.mark.parametrize("task", ["checklist", "log_summary"])
async def test_offline_drafter_validates_and_is_deterministic(start_gateway, fake, task):
    gw = await start_gateway(summaries={"window_ms": 1}, **OFFLINE)
    anomalies = [anomaly(1), anomaly(2, kind="resource"), anomaly(3, kind="correctness", log_excerpt="")]
    status, data = await post(gw, {"task": task, "anomalies": anomalies})  # default: the project's first
    assert status == 200, data
    assert data["offline"] is True and data["provider"] == "local"
    assert fake.requests == 0
    drafts = DraftList.model_validate(data).drafts
    assert {i for d in drafts for i in d.anomaly_ids} == {"an-1", "an-2", "an-3"}
    assert all(d.assertion.startswith("[offline]") for d in drafts)
    from gateway.summaries.offline import offline_drafts

    models = [AnomalyIn.model_validate(a) for a in anomalies]
    assert offline_drafts(models, task) == offline_drafts(models, task)
    assert all(isinstance(d, Draft) for d in offline_drafts(models, task))
    if task == "checklist":
        by_id = {d.anomaly_ids[0]: d for d in drafts}
        assert by_id["an-2"].needs_local_profiler is True
        assert "ratio <= 1.05" in by_id["an-1"].assertion
    rows = await summary_rows(gw)
    assert rows[0]["provider"] == "local" and rows[0]["input_tokens"] == 0


async def test_provider_without_its_key_falls_back_to_offline(start_gateway, fake, monkeypatch):
    monkeypatch.delenv("FARM_TEST_MISSING_KEY", raising=False)
    fake.reply = model_reply
    gw = await start_gateway(
        providers={"oa": {"api_key_env": "FARM_TEST_MISSING_KEY"}}, summaries={"window_ms": 1}
    )
    status, data = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 200 and data["offline"] is True and fake.requests == 0


async def test_local_model_on_proxy_endpoint_is_refused(start_gateway, oai):
    gw = await start_gateway(**OFFLINE)
    import openai

    with pytest.raises(openai.BadRequestError, match="offline drafter"):
        await oai(gw).chat.completions.create(model="offline", messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("concurrent", [False, True])
async def test_projects_never_share_cached_or_in_flight_answers(start_gateway, fake, concurrent):
    fake.reply = model_reply
    gw = await start_gateway(
        summaries={"window_ms": 20}, projects={"beta": {"models": ["gpt-fake"], "rpm": 1}}
    )
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1), anomaly(2)]}
    if concurrent:  # the second project's request arrives while the first's is in flight
        results = await asyncio.gather(post(gw, body, "alpha"), post(gw, body, "beta"))
    else:
        results = [await post(gw, body, "alpha"), await post(gw, body, "beta")]
    assert [s for s, _ in results] == [200, 200]
    assert fake.requests == 2  # one model call per project, each on its own limits and ledger
    assert all(d["cached"] is False for _, d in results)
    assert sorted(r["project"] for r in await summary_rows(gw)) == ["alpha", "beta"]
    # beta's own limits apply: its rpm of 1 is used up by its own call
    status, data = await post(gw, {**body, "anomalies": [anomaly(3)]}, "beta")
    assert status == 429, data


async def test_upstream_auth_failure_is_a_502_without_the_upstream_body(start_gateway, fake):
    from testkit.gateway.fake_upstream import Fault

    gw = await start_gateway(summaries={"window_ms": 1})
    fake.faults.append(Fault(status=401))
    status, data = await post(gw, {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]})
    assert status == 502, data
    assert "gateway's provider credential" in data["error"]["message"]
    assert "fake upstream error" not in json.dumps(data)


async def test_upstream_retry_after_ms_reaches_the_caller_as_seconds(start_gateway, fake):
    from testkit.gateway.fake_upstream import Fault

    gw = await start_gateway(summaries={"window_ms": 1})
    fake.faults.append(Fault(status=429, headers={"retry-after-ms": "75001"}))
    async with aiohttp.ClientSession() as s:
        body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]}
        headers = {"Authorization": f"Bearer {gw.keys['alpha']}"}
        async with s.post(gw.url + SUMMARIES_PATH, json=body, headers=headers) as r:
            assert r.status == 429
            assert r.headers["Retry-After"] == "76"


# --- coverage: every anomaly id must be covered by some draft ---------------------------------------


def drafts_for(*local_ids: str) -> str:
    """A valid answer whose drafts name only ``local_ids`` (the batch-local ids a1, a2, ...)."""
    return json.dumps(
        {
            "drafts": [
                {
                    "assertion": f"{i} ratio <= 1.05",
                    "verify_how": "farm accept JOB --confirm",
                    "failure_signature": f"sig {i}",
                    "needs_local_profiler": False,
                    "anomaly_ids": [i],
                }
                for i in local_ids
            ]
        }
    )


UNCOVERED = "the model's answer did not cover this anomaly after one repair attempt"


def only(*numbers: int):
    """A model that answers like ``model_reply`` but only for the anomalies ``anomaly(n)`` of ``numbers``."""

    def reply(body: dict) -> str:
        keep = {
            a["id"]
            for a in sent_anomalies(body)
            for n in numbers
            if f"(m={n}," in a["interface"]["signature"]
        }
        answer = json.loads(model_reply(body))
        answer["drafts"] = [d for d in answer["drafts"] if d["anomaly_ids"][0] in keep]
        return json.dumps(answer)

    return reply


def sent_anomalies(body: dict) -> list[dict]:
    """The anomalies a model call carried (its first user message)."""
    msgs = [m for m in body["messages"] if m["role"] == "user"]
    return json.loads(msgs[0]["content"].split("\n", 1)[1])["anomalies"]


def covered(data: dict) -> list[str]:
    return sorted(i for d in data["drafts"] for i in d["anomaly_ids"])


async def test_partial_answer_gets_a_repair_that_names_the_missing_ids(start_gateway, fake):
    gw = await start_gateway(summaries={"window_ms": 1})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1), anomaly(2), anomaly(3)]}
    fake.replies.append(drafts_for("a1"))  # valid JSON, but a2 and a3 are not covered
    fake.reply = model_reply  # the repair answers everything; a1 keeps its first draft
    status, data = await post(gw, body)
    assert status == 200, data
    assert fake.requests == 2
    repair = fake.seen[1].body["messages"][-1]
    assert repair["role"] == "user" and "a2" in repair["content"] and "a3" in repair["content"]
    assert "a1," not in repair["content"]
    assert covered(data) == ["an-1", "an-2", "an-3"]  # each exactly once
    assert data["errors"] == []
    assert len(data["batch"]["request_ids"]) == 2
    rows = await summary_rows(gw)
    assert len(rows) == 2 and all(r["batch_size"] == 3 for r in rows)
    # complete, so cached
    status, again = await post(gw, body)
    assert status == 200 and again["cached"] is True and fake.requests == 2


async def test_partial_answer_twice_gives_per_anomaly_errors_and_is_not_cached(start_gateway, fake):
    gw = await start_gateway(summaries={"window_ms": 1})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1), anomaly(2), anomaly(3)]}
    fake.replies.extend([drafts_for("a1"), drafts_for("a2")])  # the repair covers a2, never a3
    status, data = await post(gw, body)
    assert status == 200, data
    assert fake.requests == 2
    assert covered(data) == ["an-1", "an-2"]
    assert data["errors"] == [{"anomaly_id": "an-3", "error": UNCOVERED}]
    assert data["cached"] is False
    # nothing incomplete is cached: the same request (relabelled too) asks the model again
    fake.reply = model_reply
    status, again = await post(gw, body)
    assert status == 200 and again["cached"] is False and again["errors"] == []
    assert fake.requests == 3
    assert covered(again) == ["an-1", "an-2", "an-3"]


async def test_partial_answer_for_concurrent_callers(start_gateway, fake):
    """Two callers in one batch: the covered one gets 200, the one with nothing covered gets 502."""
    gw = await start_gateway(summaries={"window_ms": 5000, "max_items": 3})
    fake.reply = only(1)  # both times: anomalies 2 and 3 are never covered
    one = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(1)]}
    two = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(2), anomaly(3)]}
    (s1, d1), (s2, d2) = await asyncio.gather(post(gw, one), post(gw, two))
    assert fake.requests == 2
    assert s1 == 200 and covered(d1) == ["an-1"] and d1["errors"] == []
    assert s2 == 502, d2
    assert "did not cover" in d2["error"]["message"]
    # anomaly 1's set was complete and is cached; the other set is not
    fake.reply = model_reply
    s1, d1 = await post(gw, one)
    assert s1 == 200 and d1["cached"] is True and fake.requests == 2
    four = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(4)]}  # fills the batch again
    (s2, d2), (s4, _) = await asyncio.gather(post(gw, two), post(gw, four))
    assert s2 == s4 == 200 and d2["cached"] is False and fake.requests == 3
    assert covered(d2) == ["an-2", "an-3"] and d2["errors"] == []


# --- max_items: a large request is split into several model calls ------------------------------------


async def test_request_above_max_items_is_split_into_calls_of_at_most_max_items(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 20, "max_items": 32})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(i) for i in range(40)]}
    status, data = await post(gw, body)
    assert status == 200, data
    assert fake.requests == 2
    sizes = [len(sent_anomalies(s.body)) for s in fake.seen]
    assert all(n <= 32 for n in sizes) and sum(sizes) == 40
    signatures = {a["interface"]["signature"] for s in fake.seen for a in sent_anomalies(s.body)}
    assert len(signatures) == 40  # every anomaly sent once
    assert covered(data) == sorted(f"an-{i}" for i in range(40))
    assert data["errors"] == []
    assert data["batch"]["items"] == 40 and data["batch"]["requests"] == 1
    assert len(data["batch"]["request_ids"]) == 2
    assert 0 < data["usage"]["input_tokens"] <= sum(u[2] for u in fake.usage_log)
    rows = await summary_rows(gw)
    assert sorted(r["batch_size"] for r in rows) == sorted(sizes)
    # cached per whole set
    status, again = await post(gw, body)
    assert status == 200 and again["cached"] is True and fake.requests == 2
    assert covered(again) == covered(data)


async def test_identical_large_sets_in_flight_are_coalesced(start_gateway, fake):
    fake.reply = model_reply
    gw = await start_gateway(summaries={"window_ms": 50, "max_items": 32})
    body = {"task": "log_summary", "model": "gpt-fake", "anomalies": [anomaly(i) for i in range(40)]}
    results = await asyncio.gather(post(gw, body), post(gw, body))
    assert [s for s, _ in results] == [200, 200]
    assert fake.requests == 2  # one set of chunked calls for both callers
    assert all(len(sent_anomalies(s.body)) <= 32 for s in fake.seen)
    for _, data in results:
        assert covered(data) == sorted(f"an-{i}" for i in range(40))


async def test_split_request_with_an_uncovered_anomaly_in_one_chunk(start_gateway, fake):
    fake.reply = only(*range(39))  # anomaly 39 (in the second chunk) is never covered
    gw = await start_gateway(summaries={"window_ms": 1, "max_items": 32})
    body = {"task": "checklist", "model": "gpt-fake", "anomalies": [anomaly(i) for i in range(40)]}
    status, data = await post(gw, body)
    assert status == 200, data
    assert fake.requests == 3  # two chunks, one repair for the chunk with the gap
    assert all(len(sent_anomalies(s.body)) <= 32 for s in fake.seen)
    assert covered(data) == sorted(f"an-{i}" for i in range(39))
    assert [e["anomaly_id"] for e in data["errors"]] == ["an-39"]
    status, again = await post(gw, body)
    assert again["cached"] is False and fake.requests == 6


# --- the offline drafter covers every id ----------------------------------------------------------


async def test_offline_drafter_covers_every_anomaly():
    from gateway.summaries.offline import offline_drafts

    varied = [anomaly(i) for i in range(10)]
    varied += [anomaly(10 + i, kind=f"custom-kind-{i:02d}-{'x' * 16}", log_excerpt="") for i in range(40)]
    varied += [anomaly(60 + i, log_excerpt="FATAL same line everywhere") for i in range(5)]
    varied += [anomaly(70, kind="timeout", log_excerpt="", message="")]
    models = [AnomalyIn.model_validate(a) for a in varied]
    # every distinct kind, sharing one failure signature: the drafts must still validate
    same = [m.model_copy(update={"log_excerpt": "ERROR one failure"}) for m in models]
    for task, batch in [(task, batch) for task in ("checklist", "log_summary") for batch in (models, same)]:
        drafts = offline_drafts(batch, task)
        assert all(isinstance(d, Draft) for d in drafts)
        assert {i for d in drafts for i in d.anomaly_ids} == {m.id for m in batch}
        DraftList.model_validate({"drafts": [d.model_dump() for d in drafts]})


async def test_offline_drafter_splits_large_requests_and_covers_every_id(start_gateway, fake):
    gw = await start_gateway(summaries={"window_ms": 1, "max_items": 32}, **OFFLINE)
    body = {"task": "log_summary", "anomalies": [anomaly(i) for i in range(40)]}
    status, data = await post(gw, body)
    assert status == 200, data
    assert data["offline"] is True and fake.requests == 0
    rows = await summary_rows(gw)
    assert sorted(r["batch_size"] for r in rows) == [8, 32]
    assert covered(data) == sorted(f"an-{i}" for i in range(40)) and data["errors"] == []
