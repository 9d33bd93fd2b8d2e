"""The layers hold: import-linter's contracts (pyproject.toml, ``[tool.importlinter]``) pass, so `make test`
(and CI with it) fails on an import that points the wrong way or closes a cycle, as `make lint` does."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_the_import_contracts_are_kept():
    proc = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in proc.stdout


def test_an_import_against_the_layers_breaks_a_contract(tmp_path):
    # The contracts can fail: the same check on a copy of the gateway with one upward import (the core
    # importing the request path) reports the layers contract broken.
    import shutil

    shutil.copytree(ROOT / "gateway", tmp_path / "gateway", ignore=shutil.ignore_patterns("__pycache__"))
    record = tmp_path / "gateway" / "core" / "record.py"
    record.write_text(record.read_text() + "\nfrom gateway.http import pipeline  # noqa\n")
    config = tmp_path / "lint.toml"
    config.write_text(
        '[tool.importlinter]\nroot_packages = ["gateway"]\n\n'
        + "[[tool.importlinter.contracts]]\n"
        + 'name = "layers"\ntype = "layers"\ncontainers = ["gateway"]\n'
        + 'layers = ["http", "core"]\nexhaustive = false\n'
    )
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(config)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 1, proc.stdout
    assert "gateway.core is not allowed to import gateway.http" in proc.stdout
