"""Validation errors shared by specs and metric cards: a pydantic error as one line per problem,
each naming the field path and the bad value (``backends[1].name: unknown key (got 'x')``)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class InvalidFile(ValueError):
    """A file that cannot be used: `problems` holds one `path: message (got value)` line per fault, and
    the message names the file (`source`) and what it should have been (`WHAT`) once, then each line."""

    WHAT = "file"

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: invalid {self.WHAT}\n" + "\n".join(f"  {source}: {p}" for p in problems))


def _fmt_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _value_at(data: Any, loc: tuple[Any, ...]) -> tuple[bool, Any]:
    cur = data
    for part in loc:
        try:
            cur = cur[part]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, cur


def problems_from(err: ValidationError, data: Any) -> list[str]:
    problems = []
    for e in err.errors():
        # pydantic appends the union member / validator name to some locations: drop those
        loc = tuple(
            p for p in e["loc"] if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))
        )
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        found, value = _value_at(data, loc)
        shown = f" (got {value!r})" if found and not isinstance(value, dict | list) else ""
        problems.append(f"{_fmt_loc(loc)}: {msg}{shown}")
    return problems
