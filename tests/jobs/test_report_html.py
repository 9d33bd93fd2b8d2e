"""The interactive HTML report (jobs.report.html, Plotly): every section on a job with known numbers,
`farm report --html` and `farm compare --html`, and the pages loaded in a real headless chromium."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobs.cli import main
from jobs.report.render import render_html
from jobs.spec.sweep import loads_spec
from jobs.store.repository import Store

SPEC = """
name: report-test
family: probe
backends:
  - {name: noop, baseline: true}
  - {name: spin, configs: {grid: {ms: [1, 2, 5]}}}
shapes: {grid: {n: [0, 1]}}
"""
ENV = {"host": "h", "device_kind": "cpu", "device_name": "Some CPU"}
# median ns per (backend, ms, n): spin ms=1 is 2x faster than the baseline on n=0 and 2x slower on n=1
MEDIAN = {("noop", None, 0): 1e6, ("noop", None, 1): 1e6, ("spin", 1, 0): 5e5, ("spin", 1, 1): 2e6}
MEDIAN |= {("spin", 2, 0): 9.1e5, ("spin", 2, 1): 9.2e5}  # ms=5 is pruned on both shapes


def _samples(median: float) -> list[int]:
    return [int(median * f) for f in (0.98, 0.99, 1.0, 1.0, 1.01, 1.02, 1.03)]


def make_job(store: Store, scale: float = 1.0, failures: bool = True) -> int:
    spec = loads_spec(SPEC)
    job = store.create_job(
        name=spec.name,
        family="probe",
        spec_yaml=SPEC,
        spec_hash=spec.spec_hash(),
        trials=spec.trials(),
        git_commit="c0ffee",
    )
    results = []
    for t in store.trials(job):
        key = (t.backend, t.config.get("ms"), t.shape["n"])
        if key not in MEDIAN:
            results.append(
                {
                    "trial_id": t.id,
                    "status": "pruned",
                    "attempt": 1,
                    "error": "pruned: shared memory 300 KB > 227 KB per block",
                }
            )
            continue
        samples = _samples(MEDIAN[key] * (scale if t.backend == "spin" else 1.0))
        summary = {"median": float(sorted(samples)[3]), "n": 7, "iqr": 0.03 * samples[3]}
        summary |= {"p10": float(samples[0]), "p90": float(samples[-1])}
        results.append(
            {
                "trial_id": t.id,
                "status": "ok",
                "attempt": 1,
                "summary": summary,
                "samples_ns": samples,
                "correct": True,
                "environment": ENV,
            }
        )
    store.record_results(results)
    if failures:
        spin = next(t for t in store.trials(job) if t.backend == "spin")
        store.replace_failures(
            job,
            [
                {
                    "trial_id": spin.id,
                    "card": "probe-card",
                    "assertion": "performance",
                    "outcome": "fail",
                    "fingerprint": "f" * 32,
                    "label": "spin n=1 ms=1",
                    "message": "median 2.00x the baseline's (max 1.10x)",
                    "evidence": {"ratio": 2.0},
                    "git_commit": "c0ffee",
                    "tag": None,
                }
            ],
        )
    return job


@pytest.fixture
def store(tmp_path):
    s = Store(str(tmp_path / "farm.db"))
    yield s
    s.close()


def _plot_data(page: str, div: str) -> list[dict]:
    m = re.search(rf'Plotly\.newPlot\("{div}", (\[.*?\]), (\{{.*?\}}), \{{responsive', page, re.S)
    assert m, f"no plot {div}"
    return json.loads(m.group(1)), json.loads(m.group(2))


def test_report_has_verdict_speedups_heatmap_pruned_and_samples(store):
    job = make_job(store)
    page = render_html(store, job)
    # one file that opens offline: plotly.js inside, nothing loaded from elsewhere
    assert "<script src" not in page and len(page) > 3_000_000
    # the verdict with the failed assertion
    assert "Acceptance: FAIL (1 failed, 0 ambiguous; card probe-card)" in page
    assert "median 2.00x the baseline&#x27;s (max 1.10x)" in page
    # geometric-mean speedup and fast_p (p = 0, 0.1, 0.5): ms=1 is 2x and 0.5x -> geomean 1, fast_p 50%;
    # ms=2 is about 1.09x on both shapes: fast_0 100%, fast_0.1 0%
    cells = "".join(f"<td>{c}</td>" for c in ("2", "1.000x", "50%", "50%", "50%"))
    assert '<td class="l">spin ms=1</td>' + cells in page
    cells = "".join(f"<td>{c}</td>" for c in ("2", "1.093x", "100%", "0%", "0%"))
    assert '<td class="l">spin ms=2</td>' + cells in page
    # time per shape on a log axis, the backends side by side
    data, layout = _plot_data(page, "plot-time")
    assert layout["yaxis"]["type"] == "log" and layout["barmode"] == "group"
    assert {d["name"] for d in data} == {"noop (baseline)", "spin ms=1", "spin ms=2"}
    assert next(d for d in data if d["name"] == "spin ms=1")["y"] == [0.5, 2.0]
    # speedup with its interval, around 2x and 0.5x
    data, _ = _plot_data(page, "plot-speedup")
    ms1 = next(d for d in data if d["name"] == "spin ms=1")
    assert ms1["y"] == pytest.approx([2.0, 0.5]) and all(v > 0 for v in ms1["error_y"]["array"])
    # the shape x config heatmap of the tile sweep: the pruned config is a blank cell with its status
    data, _ = _plot_data(page, "plot-heatmap-spin")
    assert data[0]["x"] == ["ms=1", "ms=2", "ms=5"] and data[0]["z"][0][2] is None
    assert data[0]["text"][0][2] == "pruned"
    # pruned configs with their reason; every sample of every timed trial
    assert "Pruned configs" in page and "pruned: shared memory 300 KB &gt; 227 KB per block" in page
    data, _ = _plot_data(page, "plot-samples")
    assert len(data) == 6 and sorted(data[0]["y"]) == [v / 1e6 for v in _samples(1e6)]
    assert "plot-roofline" not in page  # CPU timings: no roofline


def test_roofline_on_a_known_gpu(store):
    gpu = {"host": "g", "device_kind": "gpu", "device_name": "NVIDIA H200"}
    # a GPU trial with rates: 400 TFLOPS at 2000 GB/s is 200 FLOP/byte
    spec = loads_spec(SPEC)
    job2 = store.create_job(
        name="gpu", family="probe", spec_yaml=SPEC, spec_hash=spec.spec_hash(), trials=spec.trials()[:1],
        git_commit=None,
    )  # fmt: skip
    (trial,) = store.trials(job2)
    store.record_results(
        [
            {
                "trial_id": trial.id,
                "status": "ok",
                "attempt": 1,
                "summary": {"median": 1e6, "n": 3},
                "samples_ns": [1e6, 1e6, 1e6],
                "metrics": {"tflops": 400.0, "gbps": 2000.0},
                "environment": gpu,
            }
        ]
    )
    page = render_html(store, job2)
    data, layout = _plot_data(page, "plot-roofline")
    assert layout["xaxis"]["type"] == "log"
    assert any(d["name"].startswith("H200 roof") or "roof" in d["name"] for d in data)
    point = next(d for d in data if d.get("mode") == "markers")
    assert point["x"] == [200.0] and point["y"] == [400.0]


def test_farm_report_and_compare_write_html(store, tmp_path):
    a = make_job(store, failures=False)
    b = make_job(store, scale=1.5)
    report_file = tmp_path / "r.html"
    out = CliRunner().invoke(main, ["report", str(b), "--db", store.url, "--html", str(report_file)])
    assert out.exit_code == 0, out.output
    assert "Acceptance: FAIL" in report_file.read_text()
    ab = tmp_path / "ab.html"
    args = ["compare", str(a), str(b), "--db", store.url, "--config-a", "ms=1", "--config-b", "ms=1"]
    out = CliRunner().invoke(main, [*args, "--html", str(ab)])
    assert out.exit_code == 0, out.output
    page = ab.read_text()
    data, layout = _plot_data(page, "plot-ab-ratio")
    assert data[0]["y"] == pytest.approx([1.5, 1.5]) and layout["yaxis"]["type"] == "log"
    assert "slower" in page


# ---- in a real browser ------------------------------------------------------------------------------


def chromium_dom(path: Path) -> tuple[str, list[str]]:
    """Load a page in headless chromium: (the DOM after its scripts ran, the console messages)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed (scripts/debian-deps.sh chromium installs it)")
    proc = subprocess.run(
        [exe, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0",
         "--window-size=1400,1000", "--dump-dom", path.resolve().as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line]
    return proc.stdout, console


def test_report_renders_in_chromium_without_javascript_errors(store, tmp_path):
    job = make_job(store)
    path = tmp_path / "report.html"
    path.write_text(render_html(store, job))
    dom, console = chromium_dom(path)
    assert console == []  # no JavaScript error, no warning
    for div in ("plot-time", "plot-speedup", "plot-heatmap-spin", "plot-samples"):
        # plotly drew it: its div holds the rendered svg
        assert re.search(rf'id="{div}"[^>]*class="[^"]*js-plotly-plot', dom), div
    assert dom.count('class="main-svg"') >= 8
    # the trials' data is on the drawn plots: the legend names the backends, the axes the shapes
    assert "spin ms=1" in dom and "noop (baseline)" in dom and "n=1" in dom
