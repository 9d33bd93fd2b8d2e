"""Compression of a job's anomalies into the fixed input format (no network, no Ray)."""

from __future__ import annotations

import json
from datetime import timedelta

from benchmarks.acceptance_bench import T0, figure, realistic_log, seed_job
from gateway.summaries.schema import AnomalyIn
from jobs.drafts.compress import (
    PROHIBITIONS,
    compress,
    compress_log,
    config_diff,
    expected_metrics,
    facts_from_job,
)


def test_a_200kb_log_is_cut_under_the_cap_and_keeps_the_error_lines():
    log = realistic_log(200_000)
    assert len(log.encode()) >= 200_000
    at = T0 + timedelta(seconds=400)  # the illegal memory access of trial #4
    out = compress_log(log, at=at, cap_bytes=2048)
    assert len(out.encode()) <= 2048
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in out
    assert "Traceback (most recent call last):" in out and 'File "/farm/kernels/gemm/case.py"' in out
    assert " INFO " not in out
    assert "old, recovered" not in out  # an error outside the time window around the failure
    assert "[x" in out  # the repeated clock warning folded into one line with a count


def test_tight_cap_drops_warnings_before_errors_and_marks_the_cut():
    log = realistic_log(50_000)
    out = compress_log(log, at=T0 + timedelta(seconds=400), cap_bytes=450)
    assert len(out.encode()) <= 450
    assert "illegal memory access" in out
    assert "lines cut" in out


def test_without_timestamps_the_whole_log_is_the_window():
    log = "\n".join(["step ok"] * 1000 + ["WARNING low clock"] * 3 + ["ValueError: bad tile"])
    out = compress_log(log, cap_bytes=200)
    assert out.splitlines() == ["WARNING low clock [x3]", "ValueError: bad tile"]


def test_config_diff_keeps_only_changed_fields():
    assert config_diff({"BLOCK_M": 128, "stages": 3}, {"BLOCK_M": 64, "stages": 3}) == {"BLOCK_M": [64, 128]}
    assert config_diff({"_repeat": 4}, {}) == {"_repeat": [None, 4]}


def test_job_anomalies_compress_to_the_fixed_format_with_duplicates_sent_once(store):
    job_id = seed_job(store)
    log = realistic_log(200_000)
    facts = facts_from_job(store, job_id, logs=lambda _t: log)
    assert len(facts) == 6
    packed = compress(facts)
    assert len(packed.items) == 5  # two `slower` anomalies on the same point share a fingerprint
    assert [len(v) for v in packed.duplicates.values()] == [2]
    assert packed.raw_bytes > 6 * 200_000 and packed.compressed_bytes == len(
        json.dumps(packed.items, separators=(",", ":")).encode()
    )
    assert packed.ratio > 100
    by_kind = {i["kind"]: i for i in packed.items}
    for item in packed.items:
        AnomalyIn.model_validate(item)  # what the gateway accepts
        assert item["prohibitions"] == list(PROHIBITIONS)
        assert len(item["log_excerpt"].encode()) <= 2048
    slower = by_kind["slower"]
    assert slower["interface"]["signature"] == "gemm.torch_fp32(m=128, n=128, k=128, dtype=float32)"
    assert slower["config_diff"] == {"_repeat": [None, 4]}
    # the gemm card on CPU timings: max_slowdown 0.5
    assert slower["expected_metrics"][0] == {
        "metric": "median ratio to baseline", "expected": "<= 1.5", "measured": 3.92
    }  # fmt: skip
    assert "illegal memory access" in by_kind["error"]["log_excerpt"]
    assert "timed out" in by_kind["timeout"]["log_excerpt"]
    assert by_kind["noisy"]["expected_metrics"][0]["expected"] == "<= 0.25"


def test_without_a_log_source_the_trial_error_is_the_log(store):
    job_id = seed_job(store)
    items = {i["kind"]: i for i in compress(facts_from_job(store, job_id)).items}
    assert items["error"]["log_excerpt"].startswith("RuntimeError: CUDA error")
    assert items["slower"]["log_excerpt"] == ""


def test_figure_compressed_input_is_at_least_ten_times_smaller():
    f = figure(200_000)
    assert f["reduction"] >= 10, f
    assert f["max_excerpt_bytes"] <= 2048


def test_memory_and_resource_anomalies_show_each_limit_the_card_sets_beside_its_measure():
    from jobs.spec.cards import Memory, Resources, load_card

    card = load_card("paged_mla").model_copy(
        update={
            "memory": Memory(max_bytes_per_token=1234567, max_peak_bytes=8 * 10**9),
            "resources": Resources(max_spills=12, max_occupancy_drop=0.1),
        }
    )
    ev = {"bytes_per_token": 12.5, "peak_bytes": 3e9, "n_spills": 3}
    assert expected_metrics("memory", ev, card, on_cpu=True) == [
        {"metric": "bytes per token", "expected": "<= 1.23457e+06", "measured": 12.5},
        {"metric": "peak bytes", "expected": "<= 8e+09", "measured": 3e9},
    ]
    assert expected_metrics("resource", ev, card, on_cpu=True) == [
        {"metric": "register spills", "expected": "<= 12", "measured": 3},
        {"metric": "occupancy drop vs baseline", "expected": "<= 0.1", "measured": "not measured"},
    ]
    assert expected_metrics("memory", ev, None, on_cpu=True) == []
