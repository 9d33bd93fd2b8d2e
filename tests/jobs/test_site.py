"""`farm site -o DIR`: the static site of a 30-job store with a slowdown from job 20 on (benchmarks/
history_store.py, written through the Store API; tests/jobs/test_history.py runs real sweeps into it),
its pages, and the index, a kernel page and a job page loaded in headless chromium."""

from __future__ import annotations

import re
import time

import pytest
from click.testing import CliRunner
from test_report_html import chromium_dom

from benchmarks.history_store import build_history_store
from jobs.cli import main
from jobs.store import Store


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    store = Store(str(root / "farm.db"))
    built = build_history_store(store, jobs=30, slow_from=20)
    start = time.perf_counter()
    out = CliRunner().invoke(main, ["site", "--db", store.url, "-o", str(root / "site"), "--last", "25"])
    print(f"site of 30 jobs built in {time.perf_counter() - start:.2f} s")  # the target (< 10 s): benchmarks/
    assert out.exit_code == 0, out.output
    yield root / "site", built
    store.close()


def test_site_has_index_kernel_and_job_pages(site):
    out, built = site
    assert (out / "plotly.min.js").stat().st_size > 1_000_000  # once for the whole site
    assert len(list((out / "jobs").glob("*.html"))) == 30
    kernels = sorted((out / "kernels").glob("*.html"))
    assert len(kernels) == 2  # spin x 2 shapes
    index = (out / "index.html").read_text()
    assert index.count('<svg class="spark"') == 2 and index.count('fill="#b00020"') == 2  # 2 change points
    assert f"job {built.slow_job}: +" in index
    spin = next(p for p in kernels if "spin" in p.name and "n=0" in p.name).read_text()
    m = re.search(rf"<li>job {built.slow_job} \(commit [0-9a-f]{{40}}\): .* <b>\+(\d+\.\d)%</b></li>", spin)
    assert m and abs(float(m.group(1)) - 20) <= 5
    assert '<script src="../plotly.min.js">' in spin
    first, before = built.job_ids[-25], built.job_ids[-26]  # --last 25: the newest 25 jobs of the point
    assert f'<a href="../jobs/{first}.html">' in spin and f'<a href="../jobs/{before}.html">' not in spin
    assert "its newest 25 jobs" in spin and "farm history --all" in spin


@pytest.mark.service("chromium")
def test_site_pages_render_in_chromium(site, browser):
    out, built = site
    dom, console = chromium_dom(browser, out / "index.html")
    assert console == [] and "history-probe" in dom and dom.count('class="spark"') == 2
    kernel = next((out / "kernels").glob("*spin*.html"))
    dom, console = chromium_dom(browser, kernel)
    assert console == []
    assert re.search(r'id="plot-history"[^>]*class="[^"]*js-plotly-plot', dom)
    assert "median" in dom and f"#{built.slow_job} " in dom  # the jobs are on the drawn x axis
    dom, console = chromium_dom(browser, out / "jobs" / f"{built.slow_job}.html")
    assert console == [] and dom.count('class="main-svg"') >= 4


def test_job_page_shows_each_points_recent_history(site):
    out, built = site
    first = (out / "jobs" / f"{built.job_ids[0]}.html").read_text()
    assert "Recent history" not in first  # no earlier job of its points
    page = (out / "jobs" / f"{built.slow_job}.html").read_text()
    section = page[page.index("<h2>Recent history of these points</h2>") :]
    section = section[: section.index("</table>")]
    rows = re.findall(
        r"<tr><td class=\"l\">(probe spin n=\d ms=3 float32)</td><td>(\d+)</td><td>(.*?)</td>", section
    )
    assert [r[0] for r in rows] == ["probe spin n=0 ms=3 float32", "probe spin n=1 ms=3 float32"]
    for _label, jobs, spark in rows:
        assert jobs == "20" and spark.startswith('<svg class="spark"') and spark.count("<circle") == 1
        assert len(re.search(r'points="([^"]*)"', spark)[1].split()) == 20  # jobs 1..20, this one last
    # the step is on the page: this job against the one before it, about +20%
    steps = [float(v) for v in re.findall(rf"([+-]\d+\.\d)% \(job {built.job_ids[18]}\)", section)]
    assert len(steps) == 2 and all(abs(v - 20) <= 5 for v in steps), steps
    later = (out / "jobs" / f"{built.job_ids[-1]}.html").read_text()
    assert later.count('<svg class="spark"') == 2 and "(job " in later
