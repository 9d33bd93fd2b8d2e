"""gateway/README.md "When a dependency fails": every row names the tests that check it, and each named test
exists (a renamed or deleted test would leave a row that nothing checks)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "gateway"


def _rows() -> list[list[str]]:
    text = (ROOT / "gateway" / "README.md").read_text()
    section = text.split("## When a dependency fails", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| dep")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_fault_row_names_tests_that_exist():
    rows = _rows()
    faults = {(r[0], r[1]) for r in rows}
    for dependency in ("PostgreSQL", "Redis", "spool disk", "upstream"):
        assert any(d == dependency for d, _ in faults), f"no row for {dependency}"
    for dependency, fault in (
        ("Redis", "back empty"),
        ("Redis", "back with its data"),
        ("PostgreSQL", "down"),
    ):
        assert (dependency, fault) in faults
    for row in rows:
        cell = row[-1]
        named = re.findall(r"`([\w/]+\.py)(?:::(\w+))?`|`::(\w+)`", cell)
        assert named, f"row {row[:2]} names no test"
        last_file = None
        for file, test, more in named:
            if file:
                last_file = TESTS / file
                assert last_file.exists(), f"row {row[:2]}: {file} does not exist"
            name = test or more
            if name:
                assert last_file is not None
                assert name in _tests_in(last_file), f"row {row[:2]}: no test {name} in {last_file.name}"
