"""The store's JSON encoding: standard JSON only. A NaN or an infinity is no JSON number (PostgreSQL's json
type refuses it, SQLite would keep Python's ``NaN`` token, and the two databases would disagree), so the
store writes it as null on every database alike and logs a warning naming where it sat: a value that
cannot be computed belongs in the data as None with its reason beside it (jobs.judge.runs does so), and
the warning points at whoever computed a NaN instead. Nothing is refused, so no result is lost over it."""

from __future__ import annotations

import json
import logging
import math
from typing import Any

log = logging.getLogger("farm.store")


def _finite(obj: Any, path: str, found: list[str]) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        found.append(path or "the value")
        return None
    if isinstance(obj, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v, f"{path}[{i}]", found) for i, v in enumerate(obj)]
    return obj


def non_finite_paths(obj: Any) -> list[str]:
    """Where ``obj`` holds a NaN or an infinity ("summary.median", "evidence.run_ratio", ...)."""
    found: list[str] = []
    _finite(obj, "", found)
    return found


def finite_json(obj: Any) -> str:
    """``json.dumps(obj)``, each NaN or infinity written as null (and logged, with where it sat)."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        found: list[str] = []
        clean = _finite(obj, "", found)
        if not found:
            raise
        log.warning(
            "non-finite number(s) stored as null at %s: a value that cannot be computed should be None "
            "with its reason", ", ".join(found[:5]),
        )  # fmt: skip
        return json.dumps(clean, allow_nan=False)
