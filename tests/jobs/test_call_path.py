"""Issue 44: `farm accept` walks a job id through few modules and does not come back for each piece
(benchmarks/call_path.py traces it; the judge reads what it needs from the store once)."""

from __future__ import annotations

from benchmarks.call_path import MAX_MODULES, MAX_RETURNS, measure


def test_farm_accept_walks_a_job_id_through_at_most_8_modules_with_at_most_6_returns():
    result = measure()
    assert result["modules"] <= MAX_MODULES and result["returns"] <= MAX_RETURNS, result["path"]
    assert result["entered"].get("jobs.judge.acceptance") == 1, result["path"]  # judged in one visit
    assert result["path"][0] == "jobs.cli.accept", result["path"]
