"""The token account of the drafts (issue 33): `farm drafts account` and the site's account page, end to
end with the offline drafter, and through a real gateway (fake upstream, one upstream 429 absorbed) where
the account's totals equal the gateway ledger's sums for the same request ids."""

from __future__ import annotations

import asyncio
import csv
import dataclasses
import io
import json

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, select

from benchmarks.acceptance_bench import realistic_log, seed_job
from gateway.http.app import GATEWAY
from gateway.store.db import ledger
from jobs.cli import main
from jobs.drafts.account import Account, AccountRow, build_account, conclusion
from jobs.drafts.client import GatewayTarget, draft_job
from jobs.drafts.review import list_drafts
from jobs.report.account_page import render_account
from testkit.gateway.fake_upstream import Fault
from tests.jobs.test_drafts import fake_model_gateway  # the gateway with a fake model

VERDICTS = ["--accept", "--accept", "--needs-profiler", "--reject"]  # the fifth draft stays unreviewed


def farm(*args: str) -> tuple[int, str, str]:
    out = CliRunner().invoke(main, list(args))
    assert out.exception is None or isinstance(out.exception, SystemExit), out.output
    return out.exit_code, out.stdout, out.stderr


def review_drafts(store, job_id: int) -> None:
    for draft, verdict in zip(list_drafts(store, job_id), VERDICTS, strict=False):
        code, _, err = farm("drafts", "review", str(draft.id), verdict, "--db", store.url)
        assert code == 0, err


def test_the_conclusion_counts_accepted_drafts_as_passes_out_of_all():
    assert conclusion(6, 5, 1, 0, 0) == "pass 5/6, 1 awaiting the profiler"
    assert conclusion(5, 2, 1, 1, 1) == "pass 2/5, 1 awaiting the profiler, 1 rejected, 1 unreviewed"
    assert conclusion(0, 0, 0, 0, 0) == "no drafts"


def test_the_page_answers_the_four_questions_from_the_rows():
    def row(model: str, key: str, tokens: int, accepted: int, out: int, cap: int) -> AccountRow:
        return AccountRow("2026-12-01", "checklist", model, key, "farm", "gateway", jobs=[1], runs=1, calls=1,
                          input_tokens=tokens - out, output_tokens=out, cost_usd=tokens / 1e6, capped_calls=1,
                          capped_output_tokens=out, max_tokens=cap, peak_output_share=out / cap, anomalies=8,
                          sent=4, raw_bytes=40_000, compressed_bytes=2_000, drafts=4, accepted=accepted,
                          unreviewed=4 - accepted)  # fmt: skip

    account = Account([row("big", "k1", 9_000, 3, 300, 1000), row("small", "k2", 2_000, 2, 200, 1000)])
    page = render_account(account)
    cells = lambda text: [c.split(">", 1)[1].split("<")[0] for c in text.split("<td")[1:]]  # noqa: E731
    q1 = page.split("1. Tokens per accepted draft")[1].split("<h2>")[0]
    assert "3,000" in cells(q1) and "1,000" in cells(q1)  # 9,000 / 3 and 2,000 / 2
    q2 = page.split("2. Input compression")[1].split("<h2>")[0]
    assert "20.0x" in cells(q2) and "80,000" in cells(q2)  # 80,000 B of evidence sent as 4,000 B
    q3 = page.split("3. Output tokens against max_tokens")[1].split("<h2>")[0]
    assert "25%" in cells(q3) and "30%" in cells(q3)  # 500 of 2,000; the largest call used 300 of 1,000
    q4 = page.split("4. Keys and projects")[1]
    assert "k1" in q4 and "k2" in q4 and "0.0090" in cells(q4)


def test_offline_drafts_have_an_account_with_their_conclusions(store, monkeypatch, tmp_path):
    monkeypatch.delenv("FARM_GATEWAY_KEY", raising=False)
    job_id = seed_job(store)
    draft_job(store, job_id, use_env=False, logs=lambda _t: realistic_log(20_000))
    code, out, _ = farm("drafts", "account", "--db", store.url, "--format", "json")
    assert code == 0
    (row,) = json.loads(out)["rows"]
    assert (row["model"], row["key"], row["source"], row["calls"], row["total_tokens"]) == (
        "offline", "-", "offline", 0, 0
    )  # fmt: skip
    assert row["conclusion"] == "pass 0/5, 5 unreviewed" and row["jobs"] == [job_id]

    review_drafts(store, job_id)
    code, out, err = farm("drafts", "account", str(job_id), "--db", store.url, "--format", "json")
    assert code == 0 and err == ""  # nothing to say: no call was made, no gateway to ask
    account = json.loads(out)
    (row,) = account["rows"]
    want = "pass 2/5, 1 awaiting the profiler, 1 rejected, 1 unreviewed"
    assert row["conclusion"] == account["totals"]["conclusion"] == want
    assert (row["accepted"], row["needs_profiler"], row["rejected"], row["unreviewed"]) == (2, 1, 1, 1)
    assert row["raw_bytes"] > row["compressed_bytes"] > 0 and row["sent"] == 5

    code, out, _ = farm("drafts", "account", "--db", store.url)  # the table
    assert code == 0 and "offline" in out and "pass 2/5, 1 awaiting the profiler" in out and "total" in out
    code, out, _ = farm("drafts", "account", "--db", store.url, "--format", "csv")
    (line,) = csv.DictReader(io.StringIO(out))
    assert line["model"] == "offline" and line["conclusion"] == want and line["total_tokens"] == "0"
    code, _, err = farm("drafts", "account", "--db", store.url, "--since", "yesterday")
    assert code == 2 and "YYYY-MM-DD" in err
    code, out, _ = farm("drafts", "account", "--db", store.url, "--since", "2999-01-01", "--format", "json")
    assert json.loads(out)["rows"] == []

    code, _, err = farm("site", "--db", store.url, "-o", str(tmp_path / "site"))
    assert code == 0, err
    index = (tmp_path / "site" / "index.html").read_text()
    assert '<a href="account.html">Token account of the drafts</a>' in index and want in index
    page = (tmp_path / "site" / "account.html").read_text()
    questions = ["1. Tokens per accepted draft", "2. Input compression per task"]
    questions += ["3. Output tokens against max_tokens", "4. Keys and projects"]
    for words in [*questions, want, "offline drafter"]:
        assert words in page, words


@pytest.fixture
async def live(tmp_path):
    """A real gateway (HTTP on 127.0.0.1) in front of the fake upstream; its ledger database's URL."""
    settings = {
        "projects": {
            "farm": {"models": ["gpt-fake"], "tasks": ["checklist"]},
            "other": {"models": ["gpt-fake"]},
        },
        "prices": {"gpt-upstream": {"input_per_mtok": 1.0, "output_per_mtok": 4.0}},
        "retry": {"backoff_base_s": 0.01, "backoff_cap_s": 0.05, "jitter_s": 0.0},
        "summaries": {"window_ms": 5, "max_items": 2},  # 5 anomalies: 3 model calls
    }
    async with fake_model_gateway(tmp_path, **settings) as (fake, app, url):
        key, _ = await app[GATEWAY].keys.create("farm", "ci")
        other, _ = await app[GATEWAY].keys.create("other", "ci")
        yield fake, GatewayTarget(url, key), GatewayTarget(url, other), f"sqlite:///{tmp_path / 'gw.db'}"


def ledger_sums(db_url: str, request_ids: list[str]) -> dict[str, float]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(ledger).where(ledger.c.request_id.in_(request_ids))).mappings().all()
    finally:
        engine.dispose()
    return {
        "calls": len(rows),
        "input_tokens": sum(r["input_tokens"] for r in rows),
        "output_tokens": sum(r["output_tokens"] for r in rows),
        "cost_usd": sum(r["cost_usd"] or 0 for r in rows),
        "retries": sum(r["retries"] for r in rows),
        "rate_limited": sum(r["rate_limited"] or 0 for r in rows),
        "retry_wait_ms": sum(r["retry_wait_ms"] or 0 for r in rows),
        "max_tokens": sum(r["max_tokens"] or 0 for r in rows),
    }


def model_reply(body: dict) -> str:
    user = next(m for m in body["messages"] if m["role"] == "user")
    payload = json.loads(user["content"].split("\n", 1)[1])
    drafts = [
        {"assertion": f"{a['kind']} must not recur", "verify_how": "farm accept JOB --confirm",
         "failure_signature": a["kind"], "needs_local_profiler": False, "anomaly_ids": [a["id"]]}
        for a in payload["anomalies"]
    ]  # fmt: skip
    return json.dumps({"drafts": drafts})


async def test_the_account_through_the_gateway_equals_the_ledger(store, live, monkeypatch, tmp_path):
    fake, target, other, db_url = live
    fake.reply = model_reply
    # the first model call meets an upstream 429 (Retry-After 40 ms), absorbed by the gateway's retry
    fake.faults.append(Fault(status=429, retry_after="0", headers={"retry-after-ms": "40"}))
    job_id = seed_job(store)
    log = realistic_log(50_000)
    await asyncio.to_thread(draft_job, store, job_id, target=target, logs=lambda _t: log)
    second = seed_job(store)  # the same anomalies: the gateway's cache answers, with the same request ids
    again = await asyncio.to_thread(draft_job, store, second, target=target, logs=lambda _t: log)
    assert again.reply["cached"] is True
    review_drafts(store, job_id)

    monkeypatch.setenv("FARM_GATEWAY_URL", target.base_url)
    monkeypatch.setenv("FARM_GATEWAY_KEY", target.api_key)
    code, out, err = await asyncio.to_thread(farm, "drafts", "account", "--db", store.url, "--format", "json")
    assert code == 0 and err == "", err
    account = json.loads(out)
    ids = account["request_ids"]
    assert len(ids) == 3 and account["unknown_request_ids"] == [] and account["note"] is None
    want = ledger_sums(db_url, ids)
    assert want["calls"] == 3 and want["retries"] == 1 and want["rate_limited"] == 1
    assert want["retry_wait_ms"] >= 40 and want["max_tokens"] == 3 * 1000 and want["cost_usd"] > 0
    totals = account["totals"]
    for name, value in want.items():
        assert totals[name] == pytest.approx(value), name
    assert totals["total_tokens"] == want["input_tokens"] + want["output_tokens"]
    # one row: both jobs' runs, on the same day, task, model and key; the calls counted once
    (row,) = account["rows"]
    assert (row["model"], row["source"], row["project"], row["task"]) == (
        "gpt-fake",
        "gateway",
        "farm",
        "checklist",
    )
    assert row["key"] in target.api_key and row["calls"] == 3 and row["jobs"] == [job_id, second]
    assert row["conclusion"] == "pass 2/10, 1 awaiting the profiler, 1 rejected, 6 unreviewed"

    code, _, err = await asyncio.to_thread(farm, "site", "--db", store.url, "-o", str(tmp_path / "site"))
    assert code == 0, err
    page = (tmp_path / "site" / "account.html").read_text()
    assert "read from the gateway&#x27;s ledger for 3 request ids" in page and "gpt-fake" in page
    assert f"{want['input_tokens'] + want['output_tokens']:,}" in page

    # another project's key: the gateway describes none of the ids; the farm's own counts, said so
    monkeypatch.setenv("FARM_GATEWAY_KEY", other.api_key)
    code, out, err = await asyncio.to_thread(farm, "drafts", "account", "--db", store.url, "--format", "json")
    account = json.loads(out)
    assert "3 of 3 request ids are not in the gateway's ledger for project 'other'" in err
    assert {r["source"] for r in account["rows"]} == {"farm-side"} and account["totals"]["cost_usd"] is None
    run = store.drafts(job_id)[0]
    assert account["rows"][0]["input_tokens"] == run.input_tokens

    # the gateway gone: said in one line, and the farm's own counts shown as farm-side
    monkeypatch.setenv("FARM_GATEWAY_KEY", target.api_key)
    monkeypatch.setenv("FARM_GATEWAY_URL", "http://127.0.0.1:9/v1")
    acct = await asyncio.to_thread(build_account, store)
    assert acct.note and "unreachable" in acct.note and acct.sources == {"farm-side"}


async def test_the_account_shows_the_agent_session_of_each_draft_run(store, live, monkeypatch):
    """A drafting made within an agent session (FARM_GATEWAY_SESSION, or the target's) sends it as
    ``session-id``; the gateway's model calls for it are rows of that session, and the account's row says
    so: runs of two sessions are two rows, each with its own calls."""
    fake, target, _other, db_url = live
    fake.reply = model_reply
    monkeypatch.setenv("FARM_GATEWAY_URL", target.base_url)
    monkeypatch.setenv("FARM_GATEWAY_KEY", target.api_key)
    monkeypatch.setenv("FARM_GATEWAY_SESSION", "sess-1")
    first = seed_job(store)
    log = realistic_log(50_000)
    await asyncio.to_thread(draft_job, store, first, logs=lambda _t: log)  # the target from the settings
    second = seed_job(store)
    other_log = realistic_log(50_000, seed=1)
    mine = dataclasses.replace(target, session="sess-2")
    again = await asyncio.to_thread(draft_job, store, second, target=mine, logs=lambda _t: other_log)
    assert again.reply["cached"] is False

    code, out, err = await asyncio.to_thread(farm, "drafts", "account", "--db", store.url, "--format", "json")
    assert code == 0 and err == "", err
    rows = json.loads(out)["rows"]
    assert [(r["session"], r["jobs"]) for r in rows] == [("sess-1", [first]), ("sess-2", [second])]
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            sessions = dict(conn.execute(select(ledger.c.request_id, ledger.c.session_id)).all())
    finally:
        engine.dispose()
    runs = [store.drafts(first)[0], store.drafts(second)[0]]
    for run, session in zip(runs, ("sess-1", "sess-2"), strict=True):
        assert {sessions[i] for i in run.batch["request_ids"]} == {session}
    code, out, _ = await asyncio.to_thread(farm, "drafts", "account", "--db", store.url)
    assert code == 0 and "sess-1" in out and "sess-2" in out


def test_the_account_counts_the_runs_of_jobs_measured_in_another_environment(store, monkeypatch):
    from jobs.store import AnomalyRecord

    monkeypatch.delenv("FARM_GATEWAY_KEY", raising=False)
    moved, same = seed_job(store), seed_job(store)
    for job_id in (moved, same):
        draft_job(store, job_id, use_env=False, logs=lambda _t: realistic_log(2_000))
    kept = [
        AnomalyRecord(a.trial_id, a.kind, a.severity, a.fingerprint, a.message, a.evidence)
        for a in store.anomalies(moved)
    ]
    change = ["torch", "2.12.0", "2.13.0", "performance"]
    env = AnomalyRecord(None, "environment", "warning", "e" * 32, "torch changed", {"changes": [change]})
    host = AnomalyRecord(None, "environment", "info", "h" * 32, "environment differs", {"changes": []})
    store.replace_anomalies(moved, [*kept, env])
    store.replace_anomalies(same, [host])  # only the host differs: no effect on a verdict, not counted
    account = build_account(store, use_env=False)
    assert account.totals().env_changed == 1
    by_job = {r.jobs[0]: r.env_changed for r in build_account(store, moved, use_env=False).rows}
    assert by_job == {moved: 1}
    assert [r.env_changed for r in build_account(store, same, use_env=False).rows] == [0]
    code, out, _ = farm("drafts", "account", "--db", store.url, "--format", "csv")
    assert code == 0 and sum(int(line["env_changed"]) for line in csv.DictReader(io.StringIO(out))) == 1
