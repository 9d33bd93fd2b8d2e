"""Sweep specs: round trip, grid expansion, and the error messages of bad specs."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.spec.sweep import SpecError, dump_spec, load_spec, loads_spec
from jobs.store import Store

GOOD = """
name: gemm-small
family: gemm
backends:
  - {name: torch_fp32, baseline: true}
  - {name: torch_bf16}
shapes:
  grid: {m: [16, 32], n: [16], k: [8, 16]}
  exclude: [{m: 32, k: 16}]
  include: [{m: 1, n: 1, k: 1}]
measure: {warmup_ms: 1, min_samples: 3, max_samples: 5, max_time_s: 0.5}
timeout_s: 5
tags: [t]
card: gemm
"""


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return p


def _error(tmp_path: Path, text: str) -> SpecError:
    path = _write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert str(path) in str(info.value)
    return info.value


def test_round_trip_and_expansion(tmp_path):
    spec = load_spec(_write(tmp_path, GOOD))
    again = loads_spec(dump_spec(spec))
    assert again == spec
    assert again.spec_hash() == spec.spec_hash()
    shapes = spec.shapes.points()
    # 2x1x2 product, minus the excluded (32, 16), plus the included point
    assert shapes == [
        {"m": 16, "n": 16, "k": 8},
        {"m": 16, "n": 16, "k": 16},
        {"m": 32, "n": 16, "k": 8},
        {"m": 1, "n": 1, "k": 1},
    ]
    trials = spec.trials()
    assert len(trials) == 2 * len(shapes)
    assert len({t.key for t in trials}) == len(trials)
    assert [t.baseline for t in trials].count(True) == len(shapes)
    assert spec.baseline == "torch_fp32"


def test_backend_config_grid_overrides_the_spec_grid():
    spec = loads_spec("""
name: p
family: probe
backends:
  - {name: noop, baseline: true}
  - {name: spin, configs: {grid: {ms: [1, 2, 3]}}}
shapes: {grid: {n: [0, 1]}}
""")
    by_backend = {b: [t for t in spec.trials() if t.backend == b] for b in ("noop", "spin")}
    assert len(by_backend["noop"]) == 2
    assert sorted(t.config["ms"] for t in by_backend["spin"]) == [1, 1, 2, 2, 3, 3]


def test_unknown_key_names_field(tmp_path):
    err = _error(tmp_path, GOOD.replace("timeout_s: 5", "timeout_s: 5\ncolour: blue"))
    assert "colour: unknown key" in str(err)
    err = _error(tmp_path, GOOD.replace("{name: torch_bf16}", "{name: torch_bf16, colour: red}"))
    assert "backends[1].colour: unknown key" in str(err)
    err = _error(tmp_path, GOOD.replace("warmup_ms: 1", "warmup: 1"))
    assert "measure.warmup: unknown key" in str(err)


def test_wrong_type_names_path_and_value(tmp_path):
    err = _error(tmp_path, GOOD.replace("n: [16]", "n: [16, [3]]"))
    assert "shapes.grid.n[1]" in str(err)
    err = _error(tmp_path, GOOD.replace("timeout_s: 5", "timeout_s: soon"))
    assert "timeout_s:" in str(err) and "'soon'" in str(err)
    err = _error(tmp_path, GOOD.replace("m: [16, 32]", "m: [16, -32]"))
    assert "shape.m must be a positive integer (got -32)" in str(err)


def test_empty_grid(tmp_path):
    err = _error(tmp_path, GOOD.replace("n: [16]", "n: []"))
    assert "shapes.grid.n: List should have at least 1 item" in str(err)
    everything = GOOD.replace("exclude: [{m: 32, k: 16}]", "exclude: [{n: 16}]").replace(
        "include: [{m: 1, n: 1, k: 1}]", "include: []"
    )
    err = _error(tmp_path, everything)
    assert "shapes: the grid expands to no points" in str(err)


def test_family_backend_and_baseline_errors(tmp_path):
    err = _error(tmp_path, GOOD.replace("family: gemm", "family: gemmm"))
    assert "family: unknown kernel family 'gemmm'" in str(err) and "gemm" in str(err)
    err = _error(tmp_path, GOOD.replace("{name: torch_bf16}", "{name: cublas}"))
    assert "backends[1].name: unknown backend" in str(err) and "'cublas'" in str(err)
    err = _error(tmp_path, GOOD.replace("{name: torch_bf16}", "{name: torch_bf16, baseline: true}"))
    assert "exactly one backend must be marked baseline" in str(err)
    err = _error(tmp_path, GOOD.replace("min_samples: 3, max_samples: 5", "min_samples: 9, max_samples: 5"))
    assert "max_samples (5) is below min_samples (9)" in str(err)
    err = _error(tmp_path, GOOD.replace("card: gemm", "card: gemmm"))
    assert "card: no such card (known:" in str(err) and "(got 'gemmm')" in str(err)


def test_bad_yaml_names_the_line(tmp_path):
    err = _error(tmp_path, "name: x\nfamily: [gemm\n")
    assert "line 3" in str(err) or "line 2" in str(err)
    err = _error(tmp_path, "- just\n- a list\n")
    assert "expected a mapping" in str(err)


def test_cli_rejects_bad_spec_before_running_and_keeps_stored_jobs(tmp_path):
    db = tmp_path / "farm.db"
    store = Store(str(db))
    kept = store.create_job(
        name="kept",
        family="gemm",
        spec_yaml=GOOD,
        spec_hash="x",
        trials=load_spec(_write(tmp_path, GOOD)).trials(),
        git_commit=None,
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("timeout_s: 5", "timeout_s: -1"))
    result = CliRunner().invoke(main, ["sweep", "run", str(bad), "--db", str(db)])
    assert result.exit_code == 2
    assert f"{bad}: timeout_s: Input should be greater than 0 (got -1)" in result.output
    assert [j.id for j, _ in store.list_jobs()] == [kept]
    assert len(store.trials(kept)) == 8


def test_cli_validate_lists_trials(tmp_path):
    result = CliRunner().invoke(main, ["sweep", "validate", str(_write(tmp_path, GOOD))])
    assert result.exit_code == 0, result.output
    assert "8 trials" in result.output
    assert "torch_bf16[m1xn1xk1 float32]" in result.output


def test_grid_of_includes_only_has_no_empty_point():
    spec = loads_spec("""
name: inc
family: gemm
backends: [{name: torch_fp32}]
shapes: {include: [{m: 1, n: 2, k: 3}, {m: 4, n: 5, k: 6}]}
""")
    assert spec.shapes.points() == [{"m": 1, "n": 2, "k": 3}, {"m": 4, "n": 5, "k": 6}]
    assert spec.baseline == "torch_fp32"


def test_backend_shape_grid_overrides_the_spec_grid(tmp_path):
    spec = loads_spec("""
name: p
family: probe
backends:
  - {name: noop, baseline: true}
  - {name: spin, shapes: {grid: {n: [7]}}, configs: {grid: {ms: [1]}}}
shapes: {grid: {n: [0, 1]}}
""")
    assert sorted((t.backend, t.shape["n"]) for t in spec.trials()) == [("noop", 0), ("noop", 1), ("spin", 7)]
    err = _error(
        tmp_path,
        """
name: p
family: probe
backends:
  - {name: noop, baseline: true}
  - {name: spin, shapes: {grid: {n: [7]}, exclude: [{n: 7}]}}
shapes: {grid: {n: [0, 1]}}
""",
    )
    assert "backends[1].shapes: the grid expands to no points after exclude" in str(err)
