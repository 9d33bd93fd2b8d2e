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
    from jobs.store import Store

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


def test_each_command_line_of_farm_help_is_the_commands_own():
    """`farm --help` lists the commands from jobs.cli.COMMANDS without importing them; each line there
    must stay the command's own one-line help, and every command must load."""
    import click

    from jobs.cli import COMMANDS, main

    ctx = click.Context(main)
    for name, (_module, _attr, line) in COMMANDS.items():
        command = main.get_command(ctx, name)
        assert command is not None, name
        assert command.get_short_help_str(limit=1000) == line, (
            f"jobs.cli.COMMANDS[{name!r}] differs from its help"
        )


def test_farm_help_imports_no_store_kernel_or_cluster_code():
    """Issue 31: `farm --help` took 2.6 s importing torch and SciPy through the store. Its verdict is what
    it imports, which does not move with the machine's load."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from jobs.cli import main\n"
        "try:\n"
        "    main(['--help'], standalone_mode=False)\n"
        "finally:\n"
        "    heavy = ('torch', 'scipy', 'ray', 'numpy', 'sqlalchemy', 'pydantic', 'gateway', 'aiohttp')\n"
        "    print('LOADED', sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Commands:" in out.stdout and "sweep" in out.stdout and "gateway" in out.stdout
    assert "LOADED []" in out.stdout, out.stdout.splitlines()[-1]
