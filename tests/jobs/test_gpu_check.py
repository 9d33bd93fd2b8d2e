"""`make gpu-check` (scripts/gpu-check.sh, benchmarks/gpu_check.py) on a machine without a GPU: it stops at
once with one line and builds nothing; its summary, made from a store of tiny CPU sweeps of its own specs,
marks CPU timings as such and leaves the roofline fractions out."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from benchmarks import gpu_check
from jobs.run.runner import RunOptions, run_sweep
from jobs.spec.sweep import load_spec, parse_spec
from jobs.store import Store

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
BASH = shutil.which("bash") or "/bin/bash"

requires_no_gpu = pytest.mark.skipif(
    gpu_check.no_gpu_reason() is None, reason="a CUDA GPU is visible: the no-GPU path cannot be seen here"
)


def _fake_make(tmp_path: Path) -> tuple[str, Path]:
    """A stand-in `make` (the script's $MAKE) that leaves a file when called: a call means a build began."""
    marker = tmp_path / "make-was-called"
    fake = tmp_path / "fake-make"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    return str(fake), marker


def _run_script(tmp_path: Path, path: str, **env: str) -> subprocess.CompletedProcess:
    make, marker = _fake_make(tmp_path)
    environ = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    environ.update(PATH=path, MAKE=make, **env)
    start = time.monotonic()
    proc = subprocess.run(
        [BASH, str(SCRIPT)], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=30
    )
    assert time.monotonic() - start < 5, "the no-GPU check must come before anything slow"
    assert not marker.exists(), "the venv build started although no GPU is visible"
    return proc


def test_script_without_nvidia_smi_fails_fast_in_one_line(tmp_path):
    bin_dir = tmp_path / "bin"  # only what the script itself needs, and no nvidia-smi
    bin_dir.mkdir()
    for tool in ("dirname", "grep"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    proc = _run_script(tmp_path, str(bin_dir))
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert proc.stderr.strip().splitlines() == [
        "gpu-check: no CUDA GPU is visible (nvidia-smi not found): run it on a GPU host"
    ]
    assert proc.stdout == ""


def test_script_with_nvidia_smi_listing_no_gpu_fails_fast(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"  # what nvidia-smi prints on a host whose driver sees no device
    smi.write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    smi.chmod(0o755)
    proc = _run_script(tmp_path, f"{bin_dir}:{os.environ['PATH']}")
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert "nvidia-smi -L lists no GPU" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("visible", ["", "-1"])
def test_script_with_every_device_hidden_fails_fast(tmp_path, visible):
    proc = _run_script(tmp_path, os.environ["PATH"], CUDA_VISIBLE_DEVICES=visible)
    assert proc.returncode == gpu_check.EXIT_NO_GPU
    assert f"CUDA_VISIBLE_DEVICES='{visible}' hides every device" in proc.stderr


@requires_no_gpu
@pytest.mark.parametrize("argv", [["-m", "benchmarks.gpu_check"], ["-m", "benchmarks", "gpu-check"]])
@pytest.mark.slow  # fresh benchmark processes
def test_driver_without_gpu_exits_4_and_writes_nothing(tmp_path, argv):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, *argv, f"--out={out}"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == gpu_check.EXIT_NO_GPU, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gpu-check: no CUDA GPU is visible (")
    assert not out.exists()


@requires_no_gpu
@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_target_fails_without_gpu(tmp_path):
    environ = {**os.environ, "PATH": f"{tmp_path}:/usr/bin:/bin"}  # no nvidia-smi in these on a CPU host
    if shutil.which("nvidia-smi", path=environ["PATH"]):
        pytest.skip("nvidia-smi is installed here")
    proc = subprocess.run(["make", "-s", "gpu-check"], cwd=ROOT, env=environ, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "gpu-check: no CUDA GPU is visible" in proc.stderr


def test_gpu_tests_are_found_by_their_skip_reason():
    found = {p.relative_to(ROOT).as_posix() for p in gpu_check.gpu_test_files()}
    assert {
        "tests/kernels/fp8_gemm/test_fp8_gemm_gpu.py",
        "tests/kernels/attention/test_attention_gpu.py",
    } <= found
    assert "tests/jobs/test_gpu_check.py" not in found  # this file does not say it needs a GPU
    assert all(gpu_check.GPU_TEST_MARK in (ROOT / f).read_text() for f in found)


def test_output_folder_is_named_by_host_and_day(tmp_path):
    out = gpu_check.output_dir(tmp_path, "h200-a", datetime.date(2026, 12, 3))
    assert out == tmp_path / "gpu-check-h200-a-20261203"


def test_gpu_check_specs_are_valid_and_small():
    for family, path in gpu_check.SPECS.items():
        spec = load_spec(ROOT / path)
        assert spec.family == family
        assert spec.count_trials() <= 30, f"{path}: the check must stay under 10 minutes on one GPU"
        assert spec.measure.max_time_s <= 1


# ---- the summary, on a store of tiny CPU sweeps of the gpu-check specs -------------------------------

TINY_SHAPES = {
    "paged_mla": {"grid": {"batch": [3], "seqlen": [40], "dist": ["fixed"], "h_q": [2], "s_q": [1],
                           "page_size": [16], "kv_dtype": ["bf16"]}},
    "fp8_gemm": {"grid": {"m": [16], "n": [64], "k": [128]}},
    "attention": {"grid": {"mode": ["decode"], "batch": [2], "s_q": [1], "s_k": [40], "h_q": [4], "h_kv": [2],
                           "d": [32]}},
}  # fmt: skip
TINY_MEASURE = {
    "warmup_ms": 0,
    "min_samples": 2,
    "max_samples": 3,
    "max_time_s": 0.3,
    "min_time_s": 0,
    "seeds": 1,
}


def _tiny(family: str) -> dict:
    """The family's gpu-check spec with CPU-sized shapes and one Triton config; its backends as shipped."""
    path = ROOT / gpu_check.SPECS[family]
    data = yaml.safe_load(path.read_text())
    data["shapes"] = TINY_SHAPES[family]
    data["measure"] = TINY_MEASURE
    data["timeout_s"] = 120
    for b in data["backends"]:
        if b["name"] == "triton" and family == "fp8_gemm":
            b["configs"] = {"grid": {"block_m": [16], "block_n": [64], "block_k": [128], "group_m": [1],
                                     "num_warps": [4], "num_stages": [2]}}  # fmt: skip
        if b["name"] == "triton" and family == "attention":
            b["configs"] = {"grid": {"block_m": [16], "block_n": [16]}}
    return parse_spec(data, str(path))


@pytest.fixture(scope="module")
def cpu_store(tmp_path_factory, ray_local):
    db = tmp_path_factory.mktemp("gpu-check") / "farm.db"
    store = Store(str(db))
    try:
        quiet = RunOptions(gpus=1, show_progress=False, echo=lambda _msg: None)
        jobs = {family: run_sweep(_tiny(family), store, quiet).job_id for family in gpu_check.SPECS}
    finally:
        store.close()
    return db, jobs


def _rows(summary: dict, family: str, backend: str) -> list[dict]:
    return [r for r in summary["families"][family]["rows"] if r["backend"] == backend]


@pytest.mark.slow
def test_summary_of_cpu_sweeps_marks_cpu_timings_and_leaves_fractions_out(cpu_store, tmp_path):
    db, jobs = cpu_store
    steps = [gpu_check.Step(f"sweep {f}", 0, 1.0, f"sweep-{f}.log") for f in jobs]
    summary = gpu_check.summarize(db, jobs, steps)
    assert summary["ok"], summary["failed"]

    measured = [r for fam in summary["families"].values() for r in fam["rows"] if r["median_us"]]
    assert measured and all(r["timing"] == "cpu" for r in measured)
    assert all(r["verdict"] == "pass" for r in measured)
    (paged,) = _rows(summary, "paged_mla", "triton")
    assert paged["gbps"] > 0 and paged["hbm_fraction"] is None
    (gemm,) = _rows(summary, "fp8_gemm", "triton")
    assert gemm["tflops"] > 0 and gemm["peak_fraction"] is None and gemm["vs_scaled_mm"] is None
    (attn,) = _rows(summary, "attention", "triton")
    (sdpa,) = _rows(summary, "attention", "sdpa")
    assert attn["vs_sdpa"] == pytest.approx(sdpa["median_us"] / attn["median_us"]) and sdpa["vs_sdpa"] is None
    # a library that is not installed is a skipped row with its reason, not a failure
    for family, backend in (("paged_mla", "flash_mla"), ("fp8_gemm", "deep_gemm")):
        skipped = _rows(summary, family, backend)
        assert skipped and all(
            r["status"] == "skipped" and r["timing"] is None and r["reason"] for r in skipped
        )

    text = gpu_check.write_summary(tmp_path, summary)
    assert text.startswith(f"gpu-check on {summary['host']}: PASS")
    assert "(cpu: CPU timings; fractions of a GPU's limits are left out for them)" in text
    assert "of HBM" in text and "of FP8 peak" in text and "vs SDPA" in text
    assert "%" not in text  # no fraction was printed for a CPU timing
    assert text.count("best Triton") == 3 and "x SDPA at mode=decode" in text
    assert json.loads((tmp_path / "summary.json").read_text())["families"].keys() == jobs.keys()
    assert (tmp_path / "summary.txt").read_text() == text


@pytest.mark.slow
def test_summary_fails_on_a_failed_step_or_baseline_error(cpu_store, tmp_path):
    db, jobs = cpu_store
    steps = [
        gpu_check.Step("gpu tests", 1, 3.0, "gpu-tests.log"),
        gpu_check.Step("sweep attention", None, 180.0, "x"),
    ]
    scaled = [{"shape": {"m": 16, "n": 64, "k": 128}, "error": "RuntimeError: no fp8 GEMM here"}]
    summary = gpu_check.summarize(db, jobs, steps, scaled)
    assert not summary["ok"]
    assert summary["failed"] == [
        "gpu tests: exit 1",
        "sweep attention: timed out",
        "fp8_gemm torch._scaled_mm m=16 n=64 k=128: RuntimeError: no fp8 GEMM here",
    ]
    text = gpu_check.render(summary)
    assert text.startswith(f"gpu-check on {summary['host']}: FAIL") and "timed out" in text


# ---- the peer step (benchmarks/peers.py): FlashMLA / DeepGEMM against the project's kernels ------------


@requires_no_gpu
def test_peer_step_without_the_libraries_is_one_skipped_row_each_with_its_reason():
    from benchmarks import peers

    rows = peers.peer_rows(policy=None)
    assert [(r["peer"], r["verdict"]) for r in rows] == [("flash_mla", "skipped"), ("deep_gemm", "skipped")]
    assert all("CUDA GPU" in r["detail"] for r in rows)
    assert peers.failed_peers(rows) == []  # a library that is not there fails nothing


def test_peer_judges_take_the_library_as_reference_and_fail_what_it_would_not_pass():
    import torch

    from benchmarks import peers
    from kernels.common.mla.reference import mla_decode_reference
    from kernels.paged_mla.inputs import build_decode_inputs

    x = build_decode_inputs([5, 17], h_q=4, s_q=2, page_size=16, seed=1)
    out, lse = mla_decode_reference(x.q, x.kv_cache, x.block_table, x.cache_seqlens, d_v=x.d_v)
    assert peers.judge_decode(out.to(torch.bfloat16), lse, out, lse)[0]
    bad_out = out.clone()
    bad_out[1, 0, 2] += 0.05
    passed, detail = peers.judge_decode(bad_out.to(torch.bfloat16), lse, out, lse)
    assert not passed and "out:" in detail

    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(64, 96, generator=gen)
    ours = ref.to(torch.bfloat16)
    passed, detail = peers.judge_gemm(ours, ref.to(torch.bfloat16), ref)
    assert passed and detail.startswith("calc_diff to DeepGEMM 0.00e+00")
    assert not peers.judge_gemm(torch.zeros_like(ours), ref.to(torch.bfloat16), ref)[0]


def test_a_failed_peer_comparison_fails_the_check_and_is_printed_beside_its_timings(tmp_path):
    rows = [
        {"peer": "flash_mla", "case": "bf16 batch=64", "verdict": "FAIL", "detail": "out: 3 mismatches",
         "peer_us": 40.0, "ours_us": 50.0},
        {"peer": "deep_gemm", "case": "m=128", "verdict": "pass", "detail": "calc_diff 1e-6",
         "peer_us": 10.0, "ours_us": 20.0},
    ]  # fmt: skip
    db = tmp_path / "farm.db"
    Store(str(db)).close()
    summary = gpu_check.summarize(db, {}, [], None, rows)
    assert not summary["ok"]
    assert summary["failed"] == ["peer flash_mla bf16 batch=64: out: 3 mismatches"]
    text = gpu_check.render(summary)
    assert "== peers" in text
    assert "peer 40.0 us, project 50.0 us (0.80x)" in text and "FAIL" in text
    assert "peer 10.0 us, project 20.0 us (0.50x)" in text
