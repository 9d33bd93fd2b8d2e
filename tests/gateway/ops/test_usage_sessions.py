"""Agent sessions as a unit (issue 48): `farm gateway usage --by session`, within one task, one session,
and the top sessions by cost, from requests made through the gateway with Claude Code's session header and
the ``session-id`` header, on SQLite and PostgreSQL; every figure checked against the ledger's own rows."""

from __future__ import annotations

from collections import defaultdict

import pytest
from pg import DB_BACKENDS

from gateway.ops.cli import usage_rows
from tests.gateway.ops.test_cli_keys import run_cli, write_config

pytestmark = pytest.mark.asyncio
PRICES = {
    "gpt-upstream": {"input_per_mtok": 2.0, "output_per_mtok": 8.0},
    "claude-fake": {"input_per_mtok": 3.0, "output_per_mtok": 15.0},
}


@pytest.fixture(params=DB_BACKENDS)
def db_backend(request) -> str:
    return request.param


def _msgs(words: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["word"] * words)}]


async def _traffic(gw, oai, anth) -> None:
    """Three sessions of two tasks and one request of none: sess-a (Claude Code's header, task
    checklist) the dearest, sess-b (``session-id``, checklist) the cheapest, sess-c (the default task)."""
    cc = {"X-Claude-Code-Session-Id": "sess-a", "X-Farm-Task": "checklist"}
    for words in (400, 300):
        await anth(gw).messages.create(
            model="claude-fake", max_tokens=64, messages=_msgs(words), extra_headers=cc
        )
    await oai(gw).chat.completions.create(
        model="gpt-fake",
        messages=_msgs(2),
        extra_headers={"session-id": "sess-b", "X-Farm-Task": "checklist"},
    )
    await oai(gw).chat.completions.create(
        model="gpt-fake", messages=_msgs(50), extra_headers={"session-id": "sess-c"}
    )
    await oai(gw).chat.completions.create(model="gpt-fake", messages=_msgs(5))  # no session


def _expected(rows: list[dict], task: str | None = None) -> dict:
    """Per session: (requests, tokens, cost), summed from the ledger's rows."""
    out: dict = defaultdict(lambda: [0, 0, 0.0])
    for r in rows:
        if task is None or r["task"] == task:
            e = out[r["session_id"]]
            e[0] += 1
            e[1] += r["input_tokens"] + r["output_tokens"]
            e[2] += r["cost_usd"]
    return {k: tuple(v) for k, v in out.items()}


def _got(names: list[str], table: list[list]) -> dict:
    col = names.index
    return {r[col("session")]: (r[col("requests")], r[col("total")], r[col("cost_usd")]) for r in table}


def _close(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        a[k][:2] == b[k][:2] and a[k][2] == pytest.approx(b[k][2], rel=1e-9) for k in a
    )


async def test_usage_by_session_within_a_task_and_the_top_sessions(start_gateway, oai, anth, tmp_path):
    gw = await start_gateway(prices=PRICES)
    await _traffic(gw, oai, anth)
    ledger_rows = await gw.rows()
    assert {r["session_id"] for r in ledger_rows} == {"sess-a", "sess-b", "sess-c", None}
    assert all(r["cost_usd"] for r in ledger_rows)
    settings = gw.gw.settings

    names, table = await usage_rows(settings, "session", None)
    assert names[:2] == ["date", "session"]
    assert _close(_got(names, table), _expected(ledger_rows))

    names, table = await usage_rows(settings, "session", None, task="checklist")
    assert _close(_got(names, table), _expected(ledger_rows, "checklist"))
    assert set(_got(names, table)) == {"sess-a", "sess-b"}

    names, table = await usage_rows(settings, "task", None, session="sess-a")
    assert [(r[names.index("task")], r[names.index("requests")]) for r in table] == [("checklist", 2)]

    names, table = await usage_rows(settings, "session", None, top=2)
    assert "date" not in names
    expected = _expected(ledger_rows)
    ranked = sorted(expected, key=lambda s: -expected[s][2])[:2]
    assert [r[names.index("session")] for r in table] == ranked
    assert ranked[0] == "sess-a"
    assert _close(_got(names, table), {s: expected[s] for s in ranked})

    cfg = write_config(gw, tmp_path)
    res = await run_cli("usage", "--config", cfg, "--by", "session", "--top", "1", "--task", "checklist")
    assert res.exit_code == 0, res.output
    assert "sess-a" in res.stdout and "sess-b" not in res.stdout and "date" not in res.stdout
    # every session of the ledger is a week's by default (a year's listing costs its rows), said so
    res = await run_cli("usage", "--config", cfg, "--by", "session")
    assert res.exit_code == 0 and "sessions of the last 7d" in res.stderr and "sess-c" in res.stdout
    res = await run_cli("usage", "--config", cfg, "--by", "session", "--since", "2000-01-01")
    assert res.exit_code == 0 and "sessions of the last" not in res.stderr and "sess-c" in res.stdout


async def test_top_without_by_is_one_line_and_exit_2(gateway, tmp_path):
    cfg = write_config(gateway, tmp_path)
    res = await run_cli("usage", "--config", cfg, "--top", "3")
    assert res.exit_code == 2 and "--top" in res.output and "--by" in res.output
    res = await run_cli("usage", "--config", cfg, "--by", "session", "--top", "0")
    assert res.exit_code == 2 and "--top" in res.output
    res = await run_cli("usage", "--config", cfg, "--by", "sessions")
    assert res.exit_code == 2 and "session" in res.output
