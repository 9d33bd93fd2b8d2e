"""`python -m benchmarks scale`: a synthetic year of a team's farm data, and every interactive command
timed on it (issue 46). The farm half is this module; the gateway ledger's half, when present, is
benchmarks.scale_ledger's `ledger_part(size_fraction, args)`, called once per size."""

from __future__ import annotations

import importlib.util


def _ledger_part():
    """benchmarks.scale_ledger.ledger_part, or None while that module does not exist."""
    if importlib.util.find_spec("benchmarks.scale_ledger") is None:
        return None
    from benchmarks.scale_ledger import ledger_part

    return ledger_part


def main(argv: list[str] | None = None) -> dict:
    part = _ledger_part()
    return {"ledger": part(1 / 256, argv or []) if part else None}
