"""The daily usage sums the ledger writer adds with each batch (gateway.store.ledger_daily): per UTC day and
group, None and '' one group, and a row whose group holds a value no column takes refused naming the column
(the writer drops that row alone, as it does one the insert refuses)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from gateway.store.ledger_daily import GROUP, daily_sums


def _row(**kw) -> dict:
    base = {name: None for name in GROUP}
    base |= {"ts": datetime(2026, 12, 6, 12, tzinfo=UTC), "project": "p", "task": "t", "public_model": "m"}
    base |= {"input_tokens": 10, "output_tokens": 5, "retries": 0, "rate_limited": 0, "retry_wait_ms": 0.0}
    base |= {"cost_usd": 0.5, "status": "ok"}
    return base | kw


def test_rows_sum_per_utc_day_and_group_with_none_and_empty_as_one():
    east = timezone(timedelta(hours=9))
    rows = [
        _row(),
        _row(task=""),  # '' and None are one group (SQLite gives back either)
        _row(task=None, cost_usd=None),
        _row(ts=datetime(2026, 12, 7, 2, tzinfo=east)),  # 2026-12-06 17:00 UTC: the same UTC day
        _row(ts=datetime(2026, 12, 7, 1, tzinfo=UTC)),
    ]
    sums = daily_sums(rows)
    by = {(s["day"].isoformat(), s["task"]): s for s in sums}
    assert set(by) == {("2026-12-06", "t"), ("2026-12-06", ""), ("2026-12-07", "t")}
    assert by[("2026-12-06", "t")]["requests"] == 2 and by[("2026-12-06", "t")]["input_tokens"] == 20
    assert by[("2026-12-06", "")]["requests"] == 2 and by[("2026-12-06", "")]["cost_usd"] == 0.5


def test_a_group_value_no_column_takes_is_refused_naming_the_column():
    with pytest.raises(TypeError, match="column task: cannot store a dict"):
        daily_sums([_row(), _row(task={"x": 1})])
    with pytest.raises(TypeError):  # a count that is text: the writer drops that row alone
        daily_sums([_row(input_tokens="12")])
