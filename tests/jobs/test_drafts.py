"""Drafts: the farm client of the summaries endpoint (openai SDK), storage, report, `farm accept --drafts`."""

from __future__ import annotations

import ast
import asyncio
import json
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from click.testing import CliRunner
from rich.console import Console

from benchmarks.acceptance_bench import realistic_log, seed_job
from gateway.config import GatewaySettings
from gateway.http.app import GATEWAY, create_app
from gateway.summaries import batcher as summaries
from gateway.summaries import schema as summary_schema
from jobs.cli import main
from jobs.drafts import client as drafts
from jobs.drafts.client import DraftsError, GatewayTarget, draft_job
from jobs.report.render import render_terminal
from testkit.gateway.fake_upstream import FakeUpstream


def model_reply(body: dict) -> str:
    user = next(m for m in body["messages"] if m["role"] == "user")
    payload = json.loads(user["content"].split("\n", 1)[1])
    drafts = [
        {
            "assertion": f"{a['interface']['signature']}: {a['kind']} must not recur",
            "verify_how": "farm accept JOB --confirm",
            "failure_signature": a["log_excerpt"].splitlines()[-1] if a["log_excerpt"] else a["kind"],
            "needs_local_profiler": a["kind"] == "resource",
            "anomaly_ids": [a["id"]],
        }
        for a in payload["anomalies"]
    ]
    return json.dumps({"drafts": drafts})


@asynccontextmanager
async def fake_model_gateway(tmp_path: Path, **settings: Any):
    """A real gateway (aiohttp on 127.0.0.1, its SQLite ledger tmp_path/gw.db) whose one provider is the
    fake upstream: the model gpt-fake for the project farm (the checklist task); `settings` replace or add
    to these. (fake, the gateway's app, its base URL)."""
    fake = FakeUpstream()
    await fake.start()
    defaults = {
        "host": "127.0.0.1",
        "port": 0,
        "database_url": f"sqlite+aiosqlite:///{tmp_path / 'gw.db'}",
        "secret": "test-secret-0123456789",
        "providers": {"oa": {"kind": "openai", "base_url": fake.base_url}},
        "models": {"gpt-fake": {"provider": "oa", "upstream_model": "gpt-upstream"}},
        "projects": {"farm": {"models": ["gpt-fake"], "tasks": ["checklist"]}},
        "ledger_flush_interval_s": 0.05,
    }
    app = create_app(GatewaySettings(**{**defaults, **settings}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield fake, app, f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    finally:
        await runner.cleanup()
        await fake.close()


@asynccontextmanager
async def gateway_with_fake_model(tmp_path: Path, **summaries_settings):
    """A real gateway (aiohttp, SQLite ledger) whose one provider is the fake upstream; (fake, target)."""
    async with fake_model_gateway(tmp_path, summaries={"window_ms": 5, **summaries_settings}) as (
        fake,
        app,
        url,
    ):
        key, _ = await app[GATEWAY].keys.create("farm", "ci")
        yield fake, GatewayTarget(url, key)


@pytest.fixture
async def live(tmp_path):
    async with gateway_with_fake_model(tmp_path) as pair:
        yield pair


def test_offline_drafts_are_stored_and_shown_next_to_the_anomalies(store):
    job_id = seed_job(store)
    log = realistic_log(20_000)
    done = draft_job(store, job_id, use_env=False, logs=lambda _t: log)
    assert done.reply["offline"] is True
    run, drafts = store.drafts(job_id)
    assert run is not None and run.offline and run.anomalies == 6 and run.sent == 5
    assert run.raw_bytes > run.compressed_bytes > 0
    fingerprints = {a.fingerprint for a in store.anomalies(job_id)}
    assert {fp for d in drafts for fp in d.fingerprints} == fingerprints
    console = Console(record=True, width=250)
    render_terminal(store, job_id, console)
    text = console.export_text()
    assert "drafts (checklist, offline drafter): 5 drafts; 5 of 6 anomalies sent (repeats folded)" in text
    # what the line means: the bytes of log and evidence the anomalies stand for, what was sent, tokens
    assert f"standing for {run.raw_bytes:,} B of log and evidence" in text
    assert f"sent as {run.compressed_bytes:,} B of fixed-format summary; tokens 0 in, 0 out" in text
    assert " B raw -> " not in text
    assert "[offline] slower" in text and "slower (error)" in text


async def test_drafts_through_the_gateway_one_call_then_cached(store, live):
    fake, target = live
    fake.reply = model_reply
    job_id = seed_job(store)
    log = realistic_log(200_000)
    done = await asyncio.to_thread(draft_job, store, job_id, target=target, logs=lambda _t: log)
    assert fake.requests == 1
    assert done.reply["offline"] is False and done.reply["cached"] is False
    sent = fake.seen[0].body
    assert len(json.dumps(sent)) < 20_000  # the 200 KB log never reaches the model
    assert "Traceback" in json.dumps(sent)
    run, drafts = store.drafts(job_id)
    assert run.model == "gpt-fake" and run.input_tokens > 0 and run.output_tokens > 0
    assert len(drafts) == 5 and all(len(d.fingerprints) == 1 for d in drafts)
    again = await asyncio.to_thread(draft_job, store, job_id, target=target, logs=lambda _t: log)
    assert fake.requests == 1 and again.reply["cached"] is True
    assert store.drafts(job_id)[0].input_tokens == 0


async def test_gateway_errors_are_reported(store, live):
    fake, target = live
    fake.replies.extend(["no json", "still no json"])
    job_id = seed_job(store)
    with pytest.raises(DraftsError, match="HTTP 502.*repair"):
        await asyncio.to_thread(draft_job, store, job_id, target=target)
    bad = GatewayTarget(target.base_url, "kf_000000000000_wrong")
    with pytest.raises(DraftsError, match="HTTP 401"):
        await asyncio.to_thread(draft_job, store, job_id, target=bad)
    assert store.drafts(job_id) == (None, [])


def test_farm_accept_drafts_offline(store, monkeypatch):
    monkeypatch.delenv("FARM_GATEWAY_KEY", raising=False)
    job_id = seed_job(store)
    out = CliRunner().invoke(main, ["accept", str(job_id), "--drafts", "--db", store.url])
    assert out.exit_code == 1, out.output  # the verdict is the farm's: failing trials fail
    assert "drafts (checklist, offline drafter)" in out.output
    assert "[offline]" in out.output


# What the farm may import from the gateway: the summaries contract both sides share (pydantic alone),
# the offline drafter (a pure function of it), and the gateway's CLI group that `farm gateway` mounts.
SHARED = {"gateway.summaries.schema", "gateway.summaries.offline"}
CLI_MOUNT = {"jobs/cli/__init__.py": {"gateway.ops.cli"}, "jobs/entry.py": {"gateway.ops.cli"}}


def test_the_farm_imports_only_the_shared_contract_of_the_gateway():
    repo = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted((repo / "jobs").rglob("*.py")):
        rel = str(path.relative_to(repo))
        allowed = SHARED | CLI_MOUNT.get(rel, set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            found += [f"{rel}: {n}" for n in names if n.split(".")[0] == "gateway" and n not in allowed]
    assert found == []


def test_the_shared_contract_loads_no_server_code_and_names_one_path():
    assert drafts.SUMMARIES_PATH is summaries.SUMMARIES_PATH is summary_schema.SUMMARIES_PATH
    assert summary_schema.SUMMARIES_PATH == "/v1/farm/summaries"
    assert GatewayTarget("http://gw:8787/v1/", "k").root == GatewayTarget("http://gw:8787", "k").root
    probe = (
        "import sys, gateway.summaries.schema, gateway.summaries.offline; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('gateway', 'aiohttp', 'sqlalchemy')))"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=repo, check=True)
    loaded = ["gateway", "gateway.summaries", "gateway.summaries.offline", "gateway.summaries.schema"]
    assert out.stdout.strip() == str(loaded)


def _column(text: str, index: int) -> str:
    """The words of one column of a rich table as printed, its wrapped lines joined."""
    cells = [line.split("│")[index].strip() for line in text.splitlines() if line.count("│") > index]
    return " ".join(c for c in cells if c)


def test_the_drafts_table_wraps_words_and_never_cuts_one(store):
    """Issue 32: an anomaly's message was cut at 80 characters in the drafts table ("median far fr")."""
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from jobs.store import Anomaly

    job_id = seed_job(store)
    long = (
        "its samples drift across the run (last third's median far from the first third's), "
        "so the median of this trial is no measure of the kernel"
    )
    with Session(store.engine) as s, s.begin():
        s.execute(update(Anomaly).where(Anomaly.job_id == job_id).values(message=long))
    draft_job(store, job_id, use_env=False, logs=lambda _t: "")
    console = Console(record=True, width=120)
    drafts.render_drafts(store, job_id, console)
    text = console.export_text()
    shown = _column(text, 1)
    assert long in shown, shown  # every word whole, wrapped onto the next line of the cell
    _run, stored = store.drafts(job_id)
    for d in stored:  # the drafts' own columns keep their words whole too
        assert " ".join(d.verify_how.split()) in _column(text, 3), _column(text, 3)
