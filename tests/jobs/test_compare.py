"""`farm compare` and `farm export best-configs` on jobs from a real small fp8_gemm sweep (local Ray,
two logical GPUs, Triton interpreter), plus the verdict mapping on controlled samples."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from jobs.cli.compare import compare, export
from jobs.report.ab import Selector, compare_jobs
from jobs.report.export import best_configs
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import loads_spec
from jobs.store import Store
from jobs.store.results import result_of
from kernels.base import Summary
from kernels.fp8_gemm.export import port_file_name
from kernels.measure.stats import VERDICTS

SPEC = """
name: fp8-compare-test
family: fp8_gemm
backends:
  - {name: torch_ref, baseline: true}
  - name: triton
    configs:
      grid: {block_m: [16, 32], block_n: [32], block_k: [128], group_m: [2], num_warps: [4], num_stages: [2]}
      include:
        - {block_m: 128, block_n: 256, block_k: 128, group_m: 8, num_warps: 8, num_stages: 6}
shapes:
  grid: {m: [24], n: [32], k: [160]}
  include:
    - {m: 16, n: 48, k: 128}
dtypes: [float8_e4m3fn]
measure: {warmup_ms: 0, min_samples: 4, max_samples: 6, max_time_s: 1.5, min_time_s: 0, seeds: 2}
timeout_s: 60
"""
SHAPES = [{"m": 24, "n": 32, "k": 160}, {"m": 16, "n": 48, "k": 128}]


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory, ray_local):
    """Two jobs of the same spec (A and B) in one store."""
    store = Store(str(tmp_path_factory.mktemp("compare") / "farm.db"))
    quiet = RunOptions(gpus=2, show_progress=False, echo=lambda _msg: None)
    jobs = [run_sweep(loads_spec(SPEC), store, quiet) for _ in range(2)]
    yield store, jobs[0].job_id, jobs[1].job_id
    store.close()


def test_sweep_stores_every_trial_and_the_pruned_one_with_its_reason(sweeps):
    store, job_a, _ = sweeps
    trials = store.trials(job_a)
    assert len(trials) == 2 * (1 + 3)
    pruned = [t for t in trials if t.config.get("num_stages") == 6]
    assert len(pruned) == 2 and all(t.status == "pruned" for t in pruned)
    assert all(t.error.startswith("pruned: shared memory") and t.resources["model"]["pruned"] for t in pruned)
    others = [t for t in trials if t not in pruned]
    assert all(t.status == "ok" and t.correct for t in others), [(t.status, t.error) for t in others]
    assert all(0 < t.metrics["calc_diff"] < 1e-3 for t in others)


def test_two_configs_inside_one_job(sweeps):
    store, job_a, _ = sweeps
    result = compare_jobs(store, job_a, None, Selector.parse("block_m=16"), Selector.parse("block_m=32"))
    assert [r.shape for r in result.rows] == SHAPES
    for row in result.rows:
        assert row.a.config["block_m"] == 16 and row.b.config["block_m"] == 32
        assert row.a.candidates == 1 and row.b.candidates == 1
        assert row.comparison.verdict in VERDICTS
        assert row.comparison.n_baseline == len(store.samples(row.a.trial_id)) >= 3
        assert row.comparison.n_candidate == len(store.samples(row.b.trial_id)) >= 3
        for side in (row.a, row.b):
            assert side.median_ns > 0 and side.tflops > 0 and side.gbps > 0 and side.spread_cv is not None
            assert side.smem_source == "model" and side.smem_bytes > 0
            assert side.waves == 1 and 0 < side.last_wave_util < 1
            assert side.regs_source == "model estimate" and side.spills is None  # no compiled kernel on CPU
    assert sum(result.verdicts().values()) == 2


def test_two_jobs_pick_the_fastest_correct_config_per_shape(sweeps):
    store, job_a, job_b = sweeps
    result = compare_jobs(store, job_a, job_b)  # default: any non-baseline trial, the fastest ok one
    for row in result.rows:
        assert row.a.job_id == job_a and row.b.job_id == job_b
        assert row.a.candidates == 3  # two runnable configs and the pruned one
        ok = [
            t
            for t in store.trials(job_a)
            if t.shape == row.shape and t.backend == "triton" and t.status == "ok"
        ]
        assert row.a.trial_id == min(ok, key=lambda t: t.median_ns).id
        assert row.comparison.verdict in VERDICTS


def test_one_job_needs_two_different_selectors(sweeps):
    store, job_a, _ = sweeps
    with pytest.raises(ValueError, match="both --config-a and --config-b"):
        compare_jobs(store, job_a, None, Selector.parse("block_m=16"))
    with pytest.raises(ValueError, match="same trials"):
        compare_jobs(store, job_a, None, Selector.parse("block_m=16"), Selector.parse("block_m=16"))
    with pytest.raises(ValueError, match="no job 999"):
        compare_jobs(store, 999, job_a)


def test_cli_compare_table_json_and_errors(sweeps):
    store, job_a, job_b = sweeps
    runner = CliRunner()
    args = [str(job_a), "--db", store.url, "--config-a", "backend=torch_ref", "--config-b", "block_m=32"]
    table = runner.invoke(compare, args)
    assert table.exit_code == 0, table.output
    assert "torch_ref" in table.output and "block_m=32" in table.output and "verdicts:" in table.output
    as_json = runner.invoke(compare, [*args, "--json"])
    data = json.loads(as_json.output)
    assert data["select_a"] == "backend=torch_ref" and len(data["rows"]) == 2
    assert all(
        r["a"]["backend"] == "torch_ref" and r["comparison"]["verdict"] in VERDICTS for r in data["rows"]
    )
    two_jobs = runner.invoke(compare, [str(job_a), str(job_b), "--db", store.url, "--json"])
    assert two_jobs.exit_code == 0 and json.loads(two_jobs.output)["job_b"] == job_b
    bad = runner.invoke(compare, [str(job_a), "--db", store.url, "--config-a", "block_m=16"])
    assert bad.exit_code == 2 and "--config-b" in bad.output
    bad = runner.invoke(compare, [str(job_a), str(job_b), "--db", store.url, "--config-a", "block_m"])
    assert bad.exit_code == 2 and "K=V" in bad.output


def test_export_best_configs(sweeps, tmp_path):
    store, job_a, _ = sweeps
    table, missing = best_configs(store, job_a)
    assert missing == [] and set(table) == {"N=32,K=160", "N=48,K=128"}
    for shape in SHAPES:
        entry = table[f"N={shape['n']},K={shape['k']}"][str(shape["m"])]
        ok = [
            t for t in store.trials(job_a) if t.shape == shape and t.backend == "triton" and t.status == "ok"
        ]
        best = min(ok, key=lambda t: t.median_ns).config
        assert entry == {
            "BLOCK_SIZE_M": best["block_m"],
            "BLOCK_SIZE_N": best["block_n"],
            "BLOCK_SIZE_K": best["block_k"],
            "GROUP_SIZE_M": best["group_m"],
            "num_warps": best["num_warps"],
            "num_stages": best["num_stages"],
        }
        assert entry["num_stages"] != 6  # the pruned config is never exported
    out, split = tmp_path / "best.json", tmp_path / "split"
    res = CliRunner().invoke(
        export, ["best-configs", str(job_a), "--db", store.url, "-o", str(out), "--split-dir", str(split)]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text()) == table
    device = store.environments(job_a)[0].device_name
    one = split / port_file_name("N=32,K=160", device)
    assert json.loads(one.read_text()) == table["N=32,K=160"]
    printed = CliRunner().invoke(export, ["best-configs", str(job_a), "--db", store.url])
    assert json.loads(printed.output) == table


# ---- the verdict mapping, on samples we control (no Ray) ----------------------------------------------


@pytest.fixture
def controlled(tmp_path):
    store = Store(str(tmp_path / "c.db"))
    one_shape = SPEC.replace("    - {m: 16, n: 48, k: 128}\n", "").replace("  include:\ndtypes", "dtypes")
    spec = loads_spec(one_shape)
    assert len({json.dumps(t.shape) for t in spec.trials()}) == 1
    yield store, spec
    store.close()


def _job(store: Store, spec, samples: dict[int, list[int]], status: dict[int, str] | None = None) -> int:
    from jobs.run.runner import create_job

    job = create_job(store, spec)
    rows = []
    for t in store.trials(job):
        bm = t.config.get("block_m")
        values = samples.get(bm, [1000, 1001, 1002, 1003, 1004])
        st = (status or {}).get(bm, "ok")
        med = sorted(values)[len(values) // 2]
        summary = Summary.from_stored({"median": med, "cv": 0.001, "n": len(values)})
        rows.append(
            result_of(
                t.id,
                values,
                status=st,
                summary=summary,
                correct=st == "ok",
                metrics={"tflops": 1.0, "gbps": 1.0},
            )
        )
    store.record_results(rows)
    return job


def test_verdict_is_b_relative_to_a(controlled):
    store, spec = controlled
    slow = [1000 + i for i in range(20)]
    fast = [800 + i for i in range(20)]
    job = _job(store, spec, {16: slow, 32: fast})
    a16, b32 = Selector.parse("block_m=16"), Selector.parse("block_m=32")
    assert compare_jobs(store, job, None, a16, b32).rows[0].comparison.verdict == "faster"
    assert compare_jobs(store, job, None, b32, a16).rows[0].comparison.verdict == "slower"
    same = _job(store, spec, {16: slow, 32: list(slow)})
    assert compare_jobs(store, same, None, a16, b32).rows[0].comparison.verdict == "same"
    res = CliRunner().invoke(
        compare, [str(job), "--db", store.url, "--config-a", "block_m=32", "--config-b", "block_m=16",
                  "--fail-on-slower"],
    )  # fmt: skip
    assert res.exit_code == 1


def test_incorrect_side_is_flagged_and_error_side_has_no_verdict(controlled):
    store, spec = controlled
    job = _job(store, spec, {}, status={32: "incorrect", 128: "error"})
    row = compare_jobs(store, job, None, Selector.parse("block_m=16"), Selector.parse("block_m=32")).rows[0]
    assert row.comparison is not None and "B is incorrect" in row.note
    row = compare_jobs(store, job, None, Selector.parse("block_m=16"), Selector.parse("block_m=128")).rows[0]
    assert row.comparison is None and "B is error" in row.note
