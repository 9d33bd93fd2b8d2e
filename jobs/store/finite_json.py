"""The store's JSON encoding: standard JSON only. A NaN or an infinity is no JSON number (PostgreSQL's json
type refuses it, SQLite would keep Python's ``NaN`` token), so the store refuses it on every database
alike, naming where it sits; a value that cannot be computed is stored as null with its reason beside it
(jobs.judge.runs)."""

from __future__ import annotations

import json
import math
from typing import Any


class NonFiniteJSON(ValueError):
    """A value for a JSON column holds a NaN or an infinity."""


def _where(obj: Any, path: str = "") -> str | None:
    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "the value"
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for key, value in items:
        sub = f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else str(key))
        found = _where(value, sub)
        if found:
            return found
    return None


def finite_json(obj: Any) -> str:
    """``json.dumps(obj)`` that raises ``NonFiniteJSON`` naming the first NaN or infinity in ``obj``."""
    try:
        return json.dumps(obj, allow_nan=False)
    except ValueError:
        where = _where(obj)
        if where is None:
            raise
        raise NonFiniteJSON(f"{where}: a non-finite number (NaN or infinity) is not JSON") from None
