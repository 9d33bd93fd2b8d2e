"""cluster.submission through `farm pool start|list|stop|logs` without a reachable job API: a missing
--dashboard is bad input (exit 2), a dashboard nothing answers at is an infrastructure error (exit 4);
each is one line naming the fix. Against a real cluster: tests/cluster/test_multinode.py."""

from __future__ import annotations

import socket

import pytest
from click.testing import CliRunner

from jobs.cli import main


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize("command", [["pool", "start"], ["pool", "list"], ["pool", "stop", "raysubmit_x"]])
def test_without_a_dashboard_the_command_says_which_option_is_missing(command, monkeypatch):
    monkeypatch.delenv("FARM_RAY_DASHBOARD", raising=False)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 2, result.output
    lines = _error_lines(result.output)
    assert len(lines) == 1 and "--dashboard" in lines[0] and "FARM_RAY_DASHBOARD" in lines[0], result.output


@pytest.mark.parametrize(
    "command", [["pool", "list"], ["pool", "stop", "raysubmit_x"], ["pool", "logs", "x"]]
)
def test_a_dashboard_nothing_answers_at_is_one_line_exit_4(command, monkeypatch):
    url = f"http://127.0.0.1:{_free_port()}"  # bound and closed again: nothing listens there
    monkeypatch.setenv("FARM_RAY_DASHBOARD", url)
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 4, result.output
    lines = _error_lines(result.output)
    assert len(lines) == 1 and url in lines[0] and "--dashboard-host" in lines[0], result.output
    assert "Traceback" not in result.output


def test_pool_start_at_an_unreachable_dashboard_submits_nothing_and_names_the_store(tmp_path):
    url = f"http://127.0.0.1:{_free_port()}"
    db = tmp_path / "farm.db"
    result = CliRunner().invoke(main, ["pool", "start", "--dashboard", url, "--db", str(db)])
    assert result.exit_code == 4, result.output
    assert str(db.resolve()) in result.output  # the SQLite warning comes first: the head must see that path
    assert url in _error_lines(result.output)[-1]
