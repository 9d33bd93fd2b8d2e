"""The terminal report prints rates with significant digits: a CPU's 0.00123 TFLOPS is not `0.000`."""

from __future__ import annotations

from jobs.report.render import _sig


def test_small_rates_keep_their_significant_digits():
    assert [_sig(v) for v in (0.000123, 0.0123, 1.5, 45.67, 123.4, 2000.0)] == [
        "0.000123", "0.0123", "1.50", "45.7", "123", "2000",
    ]  # fmt: skip
    assert _sig(0.0) == "0" and _sig(None) == "-"
