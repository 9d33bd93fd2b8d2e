"""`make gpu-check`: the first thing to run on a GPU host (one H100/H200, under 10 minutes).

scripts/gpu-check.sh checks that a GPU is visible, builds .venv with the host's torch (FARM_TORCH /
FARM_TRITON), then runs this driver, which:
  1. runs the GPU tests (every test file that skips with "needs a CUDA GPU" on a CPU);
  2. runs one small sweep per family through the real `farm sweep run` (jobs/specs/*_gpu_check.yaml);
  3. times torch._scaled_mm on the FP8 GEMM shapes (the fp8_gemm family has no such backend);
  4. where FlashMLA or DeepGEMM is installed, runs the library and the project's Triton kernel on the same
     inputs and judges the project's output against the library's by the peer's own rule, beside both
     timings (benchmarks/peers.py);
  5. prints the key figures against the device's limits (kernels/hardware.py): paged MLA GB/s against
     HBM bandwidth, FP8 TFLOPS against the dense FP8 peak and against torch._scaled_mm, attention
     against torch SDPA, each row with its correctness verdict.
Everything lands in one folder, benchmarks/results/gpu-check-<host>-<YYYYMMDD>/: a log per step, the
SQLite store (farm.db: `farm report JOB --db ...` works on it), summary.txt and summary.json.

Rows timed on a CPU are marked `cpu` and get no roofline fractions: a fraction of an H200's peak is only
meaningful for a time taken on that device.

    python -m benchmarks.gpu_check [--out DIR] [--skip-tests]      (exit 0: every step and verdict passed)
    python -m benchmarks gpu-check                                 (the same, figures also as JSON)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SPECS = {
    "paged_mla": "jobs/specs/paged_mla_gpu_check.yaml",
    "fp8_gemm": "jobs/specs/fp8_gemm_gpu_check.yaml",
    "attention": "jobs/specs/attention_gpu_check.yaml",
}
GPU_TEST_MARK = "needs a CUDA GPU"  # the skip reason every GPU-only test file gives on a CPU
EXIT_NO_GPU = 4  # infrastructure, as the farm's exit codes have it
TEST_TIMEOUT_S = 240
SWEEP_TIMEOUT_S = 180


class NoGpu(RuntimeError):
    """No CUDA GPU is visible: the check cannot run here."""


def no_gpu_reason() -> str | None:
    """Why this process sees no CUDA GPU, or None when it sees one."""
    import torch

    if torch.cuda.is_available():
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else f"torch {torch.__version__}"
    return (
        f"no CUDA GPU is visible ({where}, torch.cuda.is_available() is False): run gpu-check on a GPU host"
    )


def output_dir(root: Path, host: str, day: datetime.date) -> Path:
    return root / f"gpu-check-{host}-{day:%Y%m%d}"


def gpu_test_files(tests: Path = ROOT / "tests") -> list[Path]:
    """The test files that skip without a GPU, found by their skip reason (new ones join by themselves)."""
    return sorted(p for p in tests.rglob("test_*.py") if GPU_TEST_MARK in p.read_text(errors="replace"))


# ---- steps -------------------------------------------------------------------------------------------


@dataclass
class Step:
    name: str
    rc: int | None  # None: killed at its timeout
    seconds: float
    log: str  # file name inside the output folder

    @property
    def ok(self) -> bool:
        return self.rc == 0


def run_step(name: str, argv: list[str], out: Path, log_name: str, timeout_s: float) -> Step:
    """Run one command with its output going to out/log_name; a step past its timeout is killed."""
    print(f"[gpu-check] {name}: {' '.join(argv)}  (log: {out / log_name})", flush=True)
    start = time.monotonic()
    with open(out / log_name, "w") as log:
        try:
            rc: int | None = subprocess.run(
                argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            rc = None
            log.write(f"\n[gpu-check] killed after {timeout_s:.0f} s\n")
    step = Step(name, rc, time.monotonic() - start, log_name)
    print(
        f"[gpu-check] {name}: {'timed out' if rc is None else f'exit {rc}'} in {step.seconds:.0f} s",
        flush=True,
    )
    return step


def farm_executable() -> str:
    beside = Path(sys.executable).with_name("farm")
    return str(beside) if beside.exists() else (shutil.which("farm") or "farm")


def run_sweeps(out: Path, db: Path, timeout_s: float = SWEEP_TIMEOUT_S) -> tuple[list[Step], dict[str, int]]:
    """One `farm sweep run` per family into one store; the job ids by family (a sweep that created no job
    has none)."""
    from jobs.spec.sweep import load_spec
    from jobs.store import Store

    steps, jobs = [], {}
    for family, spec_path in SPECS.items():
        argv = [farm_executable(), "sweep", "run", spec_path, "--db", str(db), "--gpus", "1"]
        steps.append(
            run_step(f"sweep {family}", [*argv, "--no-accept"], out, f"sweep-{family}.log", timeout_s)
        )
        name = load_spec(ROOT / spec_path).name
        if db.exists():
            store = Store(str(db))
            try:
                ids = [job.id for job, _counts in store.list_jobs(limit=1000) if job.name == name]
            finally:
                store.close()
            if ids:
                jobs[family] = max(ids)
    return steps, jobs


# ---- torch._scaled_mm, the vendor FP8 GEMM the Triton kernel is set against --------------------------


def _scaled_mm_call(x: Any) -> tuple[Any, str]:
    """A zero-argument call of torch._scaled_mm on the trial's inputs and the scaling it uses: DeepGEMM's
    own 1x128 / 128x128 block scales where this torch/cuBLAS supports them, else row-wise scales of 1
    (the same operands, so the same work, but another product: a speed reference only)."""
    import torch

    b_t = x.b_fp8.t()
    block = {"scale_a": x.a_scales.t().contiguous().t(), "scale_b": x.b_scales.t().contiguous().t()}
    try:
        torch._scaled_mm(x.a_fp8, b_t, out_dtype=torch.bfloat16, **block)
        return (
            lambda: torch._scaled_mm(x.a_fp8, b_t, out_dtype=torch.bfloat16, **block)
        ), "block 1x128/128x128"
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        pass
    m, n = x.a_fp8.shape[0], x.b_fp8.shape[0]
    ones_a = torch.ones(m, 1, dtype=torch.float32, device=x.a_fp8.device)
    ones_b = torch.ones(1, n, dtype=torch.float32, device=x.a_fp8.device)
    return (
        lambda: torch._scaled_mm(x.a_fp8, b_t, scale_a=ones_a, scale_b=ones_b, out_dtype=torch.bfloat16)
    ), "row-wise (scales of 1: speed reference only)"


def scaled_mm_figures(shapes: list[dict[str, int]], policy: Any) -> list[dict[str, Any]]:
    """torch._scaled_mm on each FP8 GEMM shape, timed by the farm's own measurement core under the
    sweep's MeasurePolicy."""
    import torch

    from kernels.base import derive_rates
    from kernels.fp8_gemm.check import CALC_DIFF_THRESHOLD, check_fp8_gemm
    from kernels.fp8_gemm.cost import gemm_cost
    from kernels.fp8_gemm.inputs import build_inputs
    from kernels.fp8_gemm.reference import gemm_bf16
    from kernels.hardware import device_limits
    from kernels.measure.timing import measure

    limits = device_limits("cuda")
    rows = []
    for shape in shapes:
        row: dict[str, Any] = {"shape": shape}
        try:
            x = build_inputs(shape["m"], shape["n"], shape["k"], seed=0, device="cuda")
            call, scaling = _scaled_mm_call(x)
            row["scaling"] = scaling
            if scaling.startswith("block"):
                report = check_fp8_gemm(call(), gemm_bf16(x.a, x.b), threshold=CALC_DIFF_THRESHOLD)
                row["correct"], row["calc_diff"] = report.passed, report.calc_diff
            s = measure(call, policy, device="cuda").summary
            rates = derive_rates(gemm_cost(**shape), s.median, limits, precision="fp8")
            row.update(median_us=s.median / 1e3, tflops=rates.tflops)
        except Exception as e:  # noqa: BLE001 - one shape's failure is a row of the summary, not the end
            row["error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


# ---- the summary: figures from the store, set against the device -------------------------------------


def _point(d: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items()) or "-"


def family_rows(store: Any, job_id: int, scaled_mm: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """One row per trial of a job: time, rates, the roofline fraction that applies to the family (only for
    GPU timings on a device of known limits), the speed against the family's reference point (SDPA for
    attention, torch._scaled_mm for FP8 GEMM) and the correctness verdict."""
    from kernels.base import TrialStatus
    from kernels.hardware import limits_for

    envs = {e.id: e for e in store.environments(job_id)}
    trials = store.trials(job_id)
    sdpa = {(_point(t.shape), t.dtype): t.median_ns for t in trials if t.backend == "sdpa" and t.median_ns}
    rows = []
    for t in trials:
        env = envs.get(t.environment_id)
        timing = None if env is None or t.median_ns is None else env.device_kind  # "gpu" or "cpu"
        limits = limits_for(env.device_name) if env is not None and timing == "gpu" else None
        m = t.metrics or {}
        row: dict[str, Any] = {
            "backend": t.backend,
            "shape": _point(t.shape),
            "config": _point(t.config),
            "status": t.status,
            "timing": timing,
            "device": env.device_name if env is not None else None,
            "median_us": t.median_ns / 1e3 if t.median_ns else None,
            "tflops": m.get("tflops"),
            "gbps": m.get("gbps"),
            "correct": t.correct,
            "verdict": {True: "pass", False: "FAIL"}.get(t.correct, t.status),  # type: ignore[arg-type]
        }
        if t.status != TrialStatus.OK and t.error:
            row["reason"] = t.error.strip().splitlines()[-1][:160]
        if t.family == "paged_mla":
            row["hbm_fraction"] = m["gbps"] / limits.hbm_gbps if limits and m.get("gbps") else None
        elif t.family == "fp8_gemm":
            row["peak_fraction"] = (
                m["tflops"] / limits.dense_tflops["fp8"] if limits and m.get("tflops") else None
            )
            ref = (scaled_mm or {}).get(row["shape"])
            row["vs_scaled_mm"] = ref / t.median_ns if ref and t.median_ns and timing == "gpu" else None
        elif t.family == "attention":
            ref = sdpa.get((row["shape"], t.dtype))
            row["vs_sdpa"] = ref / t.median_ns if ref and t.median_ns and t.backend != "sdpa" else None
        rows.append(row)
    return rows


def summarize(
    db: Path,
    jobs: dict[str, int],
    steps: list[Step] = (),  # type: ignore[assignment]
    scaled_mm: list[dict[str, Any]] | None = None,
    peers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The summary of a check as a JSON-ready dict; `ok` is every step exiting 0, no trial failing and no
    peer comparison failing."""
    from benchmarks.peers import failed_peers
    from jobs.store import Store
    from kernels.base import NOT_FAILED, TrialStatus

    by_shape = {_point(r["shape"]): r["median_us"] * 1e3 for r in scaled_mm or [] if r.get("median_us")}
    store = Store(str(db))
    try:
        families = {
            family: {
                "job": job_id,
                "rows": family_rows(store, job_id, by_shape if family == "fp8_gemm" else None),
            }
            for family, job_id in jobs.items()
        }
    finally:
        store.close()
    failed = [
        f"{family} {r['backend']} {r['shape']} {r['config']}: {r['verdict']}"
        for family, fam in families.items()
        for r in fam["rows"]
        if r["correct"] is False or (r["status"] != TrialStatus.OK and r["status"] not in NOT_FAILED)
    ]
    failed += [f"{s.name}: {'timed out' if s.rc is None else f'exit {s.rc}'}" for s in steps if not s.ok]
    failed += [
        f"fp8_gemm torch._scaled_mm {_point(r['shape'])}: {r['error']}"
        for r in scaled_mm or []
        if "error" in r
    ]
    failed += failed_peers(peers or [])
    return {
        "host": platform.node(),
        "store": str(db),
        "steps": [{**s.__dict__, "ok": s.ok} for s in steps],
        "families": families,
        "scaled_mm": scaled_mm,
        "peers": peers,
        "failed": failed,
        "ok": not failed,
    }


def _fmt(v: Any, spec: str, suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


FIGURES = {  # what each family's table shows beyond time and verdict: (key, header, format)
    "paged_mla": (("gbps", "GB/s", ".1f"), ("hbm_fraction", "of HBM", ".1%")),
    "fp8_gemm": (
        ("tflops", "TFLOPS", ".1f"),
        ("peak_fraction", "of FP8 peak", ".1%"),
        ("vs_scaled_mm", "vs _scaled_mm", ".2fx"),
    ),
    "attention": (("tflops", "TFLOPS", ".1f"), ("gbps", "GB/s", ".1f"), ("vs_sdpa", "vs SDPA", ".2fx")),
}  # fmt: skip


HEADLINE = {  # the figure each family is judged by, over its Triton rows: (key, what it is set against)
    "paged_mla": ("gbps", "hbm_fraction", "GB/s", "of HBM bandwidth"),
    "fp8_gemm": ("tflops", "peak_fraction", "TFLOPS", "of the dense FP8 peak"),
    "attention": ("vs_sdpa", None, "x SDPA", ""),
}


def headline(family: str, rows: list[dict[str, Any]]) -> str | None:
    """The best Triton row of a family by its key figure, with its fraction of the device's limit."""
    key, fraction, unit, against = HEADLINE[family]
    measured = [r for r in rows if r["backend"] == "triton" and r.get(key)]
    if not measured:
        return None
    best = max(measured, key=lambda r: r[key])
    text = f"best Triton {best[key]:.2f}{'' if unit.startswith('x') else ' '}{unit} at {best['shape']}"
    if fraction and best.get(fraction) is not None:
        text += f" = {best[fraction]:.1%} {against}"
    if best.get("vs_scaled_mm") is not None:
        text += f", {best['vs_scaled_mm']:.2f}x torch._scaled_mm"
    return text + f" ({best['timing']} timing, {best['verdict']})"


def render(summary: dict[str, Any]) -> str:
    """summary.txt: the steps, then per family one line per trial with its figures and verdict."""
    lines = [
        f"gpu-check on {summary['host']}: {'PASS' if summary['ok'] else 'FAIL'} (store {summary['store']})"
    ]
    for s in summary["steps"]:
        state = "timed out" if s["rc"] is None else f"exit {s['rc']}"
        lines.append(f"  {s['name']:<22} {state:<10} {s['seconds']:6.0f} s   log {s['log']}")
    for family, fam in summary["families"].items():
        rows = fam["rows"]
        devices = sorted({f"{r['timing']} timings on {r['device']}" for r in rows if r["timing"]})
        lines += ["", f"== {family} (job {fam['job']}; {', '.join(devices) or 'nothing measured'})"]
        best = headline(family, rows) if family in HEADLINE else None
        if best:
            lines.append(f"  {best}")
        figures = FIGURES.get(family, ())
        header = [
            "backend",
            "shape",
            "config",
            "timing",
            "median us",
            *(h for _k, h, _f in figures),
            "verdict",
        ]
        table = [header]
        for r in rows:
            cells = [r["backend"], r["shape"], r["config"], r["timing"] or "-", _fmt(r["median_us"], ".1f")]
            for key, _h, spec in figures:
                x = spec.endswith("x")
                cells.append(_fmt(r.get(key), spec[:-1] if x else spec, "x" if x else ""))
            cells.append(r["verdict"] + (f" ({r['reason']})" if r.get("reason") else ""))
            table.append(cells)
        widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
        lines += [
            "  " + "  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]
            for row in table
        ]
        if any(r["timing"] == "cpu" for r in rows):
            lines.append("  (cpu: CPU timings; fractions of a GPU's limits are left out for them)")
    if summary.get("scaled_mm"):
        lines += ["", "== torch._scaled_mm (the FP8 GEMM reference point)"]
        for r in summary["scaled_mm"]:
            figures = f"{_fmt(r.get('median_us'), '.1f')} us  {_fmt(r.get('tflops'), '.1f')} TFLOPS"
            verdict = {True: "pass", False: "FAIL"}.get(r.get("correct"), "-")  # type: ignore[arg-type]
            lines.append(
                f"  {_point(r['shape'])}: {r.get('error') or figures}  {r.get('scaling', '')}  {verdict}"
            )
    if summary.get("peers"):
        from benchmarks.peers import render_peers

        lines += render_peers(summary["peers"])
    if summary["failed"]:
        lines += ["", "failed:"] + [f"  {f}" for f in summary["failed"]]
    return "\n".join(lines) + "\n"


def write_summary(out: Path, summary: dict[str, Any]) -> str:
    text = render(summary)
    (out / "summary.txt").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return text


# ---- the whole check ---------------------------------------------------------------------------------


def run_check(out: Path, *, skip_tests: bool = False) -> dict[str, Any]:
    reason = no_gpu_reason()
    if reason:
        raise NoGpu(reason)
    out.mkdir(parents=True, exist_ok=True)
    db = out / "farm.db"
    steps = []
    if not skip_tests:
        tests = [str(p.relative_to(ROOT)) for p in gpu_test_files()]
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *tests]
        steps.append(
            run_step(
                "gpu tests",
                [*argv, "--junitxml", str(out / "gpu-tests.xml")],
                out,
                "gpu-tests.log",
                TEST_TIMEOUT_S,
            )
        )
    sweep_steps, jobs = run_sweeps(out, db)
    steps += sweep_steps
    scaled_mm = None
    from benchmarks.peers import peer_rows
    from jobs.spec.sweep import load_spec

    print("[gpu-check] FlashMLA / DeepGEMM against the project's kernels, where installed", flush=True)
    peers = peer_rows(load_spec(ROOT / SPECS["paged_mla"]).measure)
    if "fp8_gemm" in jobs:
        spec = load_spec(ROOT / SPECS["fp8_gemm"])
        shapes = list({_point(t.shape): t.shape for t in spec.trials()}.values())
        print("[gpu-check] timing torch._scaled_mm on the FP8 GEMM shapes", flush=True)
        scaled_mm = scaled_mm_figures(shapes, spec.measure)
    summary = summarize(db, jobs, steps, scaled_mm, peers)
    print(write_summary(out, summary), flush=True)
    print(f"[gpu-check] logs, store and summary in {out}", flush=True)
    return summary


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", type=Path, help="output folder (default benchmarks/results/gpu-check-HOST-DATE)"
    )
    parser.add_argument("--skip-tests", action="store_true", help="only the sweeps and the summary")
    return parser.parse_args(argv)


def _out(args: argparse.Namespace) -> Path:
    return args.out or output_dir(ROOT / "benchmarks" / "results", platform.node(), datetime.date.today())


def main(argv: list[str]) -> dict[str, Any]:
    """`python -m benchmarks gpu-check`: the summary is the figures; no GPU is exit 4."""
    args = _parse(argv)
    try:
        return run_check(_out(args), skip_tests=args.skip_tests)
    except NoGpu as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        raise SystemExit(EXIT_NO_GPU) from None


def cli(argv: list[str]) -> int:
    try:
        return 0 if main(argv)["ok"] else 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
