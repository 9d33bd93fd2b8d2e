"""The README's "Five minutes with the CLI" tour, run as written on a CPU: every `farm` command of its
block, in order, against a fresh store, exits 0.

The commands are parsed from README.md, so this breaks when the README drifts from what the farm does
(a job id the tour has not created, a command that exits 1 on CPU timings). The `farm gateway ...`
lines are the gateway's own tour (`serve` runs until stopped; gateway/README.md and tests/gateway cover
them) and are left out. The commands run in a temporary folder (their output files land there) that
sees the repository's jobs/specs, with FARM_DB naming a fresh SQLite store.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FARM = Path(sys.executable).parent / "farm"


def tour_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Five minutes with the CLI", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "README.md: the tour's ```sh block is gone"
    commands = []
    for line in block.group(1).splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "farm" and words[1:2] != ["gateway"]:
            commands.append(words)
    return commands


def test_the_tour_block_is_found_and_names_the_jobs_it_creates():
    commands = tour_commands()
    assert len(commands) >= 15 and commands[0][:3] == ["farm", "sweep", "validate"]
    runs = sum(1 for c in commands if c[1:3] == ["sweep", "run"])
    # every job id the tour names is one its own `sweep run` lines create (ids count from 1)
    for c in commands:
        for word in c[2:]:
            if word.isdigit() and c[1] in ("jobs", "report", "compare", "export", "accept", "baseline"):
                assert 1 <= int(word) <= runs, f"`{shlex.join(c)}` names job {word}; the tour makes {runs}"


@pytest.mark.skipif(not FARM.exists(), reason=f"no `farm` entry point at {FARM} (pip install -e .)")
@pytest.mark.slow  # every tour command in a fresh `farm` process
# about 17 `farm` processes, 4 of them with a Ray of their own: 1.5-2.5 min on an idle 2-core machine and
# over 5 (the suite's hang guard) on a busy one; each command has its own 600 s limit below
@pytest.mark.timeout(1200)
def test_the_readme_tour_runs_in_order_and_each_command_exits_0(tmp_path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "specs").symlink_to(ROOT / "jobs" / "specs")
    env = {**os.environ, "FARM_DB": str(tmp_path / "farm.db"), "NO_COLOR": "1"}
    env.pop("FARM_GATEWAY_KEY", None)  # drafts by the built-in offline drafter
    env.pop("FARM_RAY_ADDRESS", None)
    for words in tour_commands():
        proc = subprocess.run(
            [str(FARM), *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"`{shlex.join(words)}` exited {proc.returncode}:\n{out[-4000:]}"
        if words[1:3] == ["sweep", "resume"]:
            assert "nothing to resume" in out, out
    for made in ("job1.csv", "job1.html", "best.json", "accept.xml"):
        assert (tmp_path / made).stat().st_size > 0, made
