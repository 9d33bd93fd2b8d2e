"""`farm gateway doctor --tool claude-code|codex --model M`: the client's recorded request shape
(gateway/ops/client_shapes/) sent to a live gateway as a dry run, which says what the model's translation
would drop or refuse without calling the upstream."""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from gateway.ops.cli import gateway as cli
from gateway.ops.doctor import DoctorInput, run_doctor
from gateway.ops.doctor.shape import DRY_RUN, NAME, recorded_request


async def shape_check(gw, tool: str, model: str, tmp: Path):
    inp = DoctorInput(
        tool=tool,  # type: ignore[arg-type]
        env={"FARM_KEY": gw.keys["alpha"]},
        base_url=gw.url if tool == "claude-code" else gw.v1,
        key_env="FARM_KEY",
        model=model,
        codex_config=tmp / "codex.toml",
        claude_settings=tmp / "claude.json",
        connect_timeout_s=1.0,
        read_timeout_s=5.0,
    )
    checks = await run_doctor(inp)
    found = [c for c in checks if c.name == NAME]
    assert found, "\n".join(c.line() for c in checks)
    return found[0]


async def test_claude_code_on_a_chat_model_is_translated_with_nothing_dropped(gateway, fake, tmp_path):
    check = await shape_check(gateway, "claude-code", "gpt-fake", tmp_path)
    assert check.status == "PASS", check.line()
    assert (
        "claude-code 2.1." in check.message
        and "translated with nothing dropped for oa (messages->chat)" in (check.message)
    )
    # the dry run reached no upstream: the only upstream call is the doctor's one-token model call
    assert [s.path for s in fake.seen] == ["/v1/chat/completions"]
    rows = await gateway.rows()
    dry = [r for r in rows if r["error_class"] == "dry_run"]
    assert len(dry) == 1 and dry[0]["status"] == "ok" and dry[0]["input_tokens"] == 0
    assert dry[0]["translation"] == "messages->chat"


async def test_claude_code_on_its_own_format_is_sent_as_it_is(gateway, fake, tmp_path):
    check = await shape_check(gateway, "claude-code", "claude-fake", tmp_path)
    assert check.status == "PASS" and "sent as it is to an" in check.message, check.line()


async def test_codex_on_an_anthropic_model_warns_of_its_web_search_tool(gateway, fake, tmp_path):
    check = await shape_check(gateway, "codex", "claude-fake", tmp_path)
    assert check.status == "WARN", check.line()
    assert "codex 0." in check.message and "an (responses->messages) would drop tools[web_search]" in (
        check.message
    )
    assert [s.path for s in fake.seen] == ["/v1/messages"]  # the model call only


async def test_a_strict_project_fails_naming_the_field_it_would_refuse(start_gateway, fake, tmp_path):
    gw = await start_gateway(projects={"alpha": {"translation": "strict"}})
    check = await shape_check(gw, "codex", "claude-fake", tmp_path)
    assert check.status == "FAIL" and "tools[web_search]" in check.message, check.line()
    assert "would be refused" in check.message and check.fix


async def test_the_dry_run_header_on_a_request_answers_without_an_upstream_call(gateway, fake, oai):
    _client, _version, body = recorded_request("codex", "claude-fake")
    client = oai(gateway)
    raw = await client.post("/responses", body=body, cast_to=object, options={"headers": DRY_RUN})
    assert raw["object"] == "farm.dry_run" and raw["model"] == "claude-fake" and raw["format"] == "responses"
    (d,) = raw["deployments"]
    assert d == {"deployment": "an", "provider": "an", "format": "messages",
                 "translation": "responses->messages", "dropped": ["tools[web_search]"]}  # fmt: skip
    assert fake.seen == []


async def test_the_cli_prints_the_shape_line(gateway, tmp_path):
    """The command as a user runs it (in a thread: it runs its own event loop)."""
    args = ["doctor", "--tool", "codex", "--base-url", gateway.v1, "--key-env", "KF_TEST_KEY", "--model",
            "claude-fake", "--codex-config", str(tmp_path / "none.toml"), "--timeout", "5"]  # fmt: skip
    res = await asyncio.to_thread(CliRunner().invoke, cli, args, env={"KF_TEST_KEY": gateway.keys["alpha"]})
    assert res.exit_code == 0, res.stdout  # a WARN is no failure
    assert "WARN  client shape: codex 0." in res.stdout and "tools[web_search]" in res.stdout
