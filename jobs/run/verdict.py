"""A job's exit code from its trials' statuses: what `farm sweep run` and `farm jobs wait` end on."""

from __future__ import annotations

from collections.abc import Mapping

from jobs.errors import EXIT_FAILED
from kernels.base import NOT_FAILED

EXIT_OK = 0


def exit_code_of(counts: Mapping[str, int]) -> int:
    """0 when every trial passed or was deliberately not run; 1 when one failed or was left pending."""
    bad = sum(n for s, n in counts.items() if s not in NOT_FAILED)  # a trial left pending counts too
    return EXIT_FAILED if bad else EXIT_OK
