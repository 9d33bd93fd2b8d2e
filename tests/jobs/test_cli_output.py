"""Command output that is piped (a file, a CI log) is not cut at rich's default 80 columns."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jobs.cli.common import console


def test_piped_output_is_wide_unless_columns_says_otherwise(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert console().width == 200  # pytest captures stdout: not a terminal
    monkeypatch.setenv("COLUMNS", "132")
    assert console().width == 132


@pytest.mark.slow  # a farm process, piped
def test_farm_jobs_list_piped_to_a_file_keeps_long_rows(tmp_path):
    from jobs.store.repository import Store

    db = tmp_path / "farm.db"
    store = Store(str(db))
    name = "a-spec-name-long-enough-to-be-cut-at-eighty-columns-" + "x" * 30
    store.create_job(name=name, family="probe", spec_yaml="", spec_hash="h", trials=[], git_commit=None)
    store.close()
    out = subprocess.run(
        [sys.executable, "-m", "jobs.cli", "jobs", "list", "--db", str(db)],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"}, check=True,
    )  # fmt: skip
    assert name in out.stdout, out.stdout
