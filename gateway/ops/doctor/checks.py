"""The doctor's findings: one ``Check`` per line of its report (PASS, WARN or FAIL, the cause in plain
words and the fix), how they print, and whether any failed (the command's exit status)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Status = Literal["PASS", "WARN", "FAIL"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    fix: str = ""

    def line(self) -> str:
        text = f"{self.status}  {self.name}: {self.message}"
        return f"{text} Fix: {self.fix}" if self.fix else text


def _fail(name: str, message: str, fix: str = "") -> Check:
    return Check(name, "FAIL", message, fix)


def _warn(name: str, message: str, fix: str = "") -> Check:
    return Check(name, "WARN", message, fix)


def _pass(name: str, message: str) -> Check:
    return Check(name, "PASS", message)


def format_checks(checks: list[Check]) -> str:
    return "\n".join(c.line() for c in checks)


def failed(checks: list[Check]) -> bool:
    return any(c.status == "FAIL" for c in checks)
