"""`python -m benchmarks site`: how long `farm site` takes on the 30-job history store (target < 10 s),
and `farm history` over all of its points (change-point detection included).

The store is the all-real one: 30 sweeps of the history probe spec through the runner on local Ray, a
real 20% slowdown (the probe's `_slowdown` knob) from job 20 on (about 2 minutes on 2 cores); the
change points found are printed and checked against the "Done when" of issue 20 (one at job 20, within
5 points of +20%, none elsewhere). `--written` builds the store through the Store API instead (seconds).

`--store PATH` instead times them on a store of benchmarks/scale_store.py's team (issue 46; see
benchmarks/results/history-site-*.md): `farm history` of one series and of the gemm family (`--json`),
as shown by default (the newest jobs) and with `--all`, and, with `--site`, `farm site` into a folder
that holds the site of the store as it was after one more night (as `python -m benchmarks scale --site`
times it), on a copy of the store, and the night's job pages alone (jobs.report.html's part of it). Run
as a script with PYTHONPATH at another checkout (a `git worktree` of an earlier commit, its store at that
commit's schema) it times that checkout's code; there, without `--all`, the plain commands are every
job's.

    .venv/bin/python -m benchmarks site --store /tmp/1_64.db --site --repeat 2
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/site_bench.py --store /tmp/1_64-0010.db --site
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.history_store import build_history_store
from cluster import session
from jobs.history.series import DEFAULT_LAST, collect
from jobs.report.site import build_site
from jobs.store import Store
from testkit.kernels import faults

faults.enable()  # the injected faults its specs use: a FARM_PLUGINS module, for Ray and subprocesses too


SERIES = ["--family", "gemm", "--backend", "torch_bf16", "--shape", "m=64,n=256,k=256"]


def _timed(run, repeat: int) -> tuple[float, float]:
    """(wall, CPU) seconds of this process: the median of `repeat` runs after a first (a first over 3 s is
    the figure). The CPU time is what other processes on a shared machine disturb least."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    first = (time.perf_counter() - wall, time.process_time() - cpu)
    if first[0] >= 3:
        return first
    times = []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return statistics.median(t[0] for t in times), statistics.median(t[1] for t in times)


def _cli(args: list[str]):
    from click.testing import CliRunner

    from jobs.cli import main

    def run() -> None:
        res = CliRunner().invoke(main, args)
        if res.exit_code != 0:
            raise RuntimeError(f"farm {' '.join(args)}: exit {res.exit_code}: {res.output[-2000:]}")

    return run


PRIME_JOBS = 8 * DEFAULT_LAST  # the store's newest jobs whose series the primed site keeps


def prime_site(store: Store, out: Path) -> dict:
    """`out` as a build of the store as it is leaves it, but for the pages themselves (a 500-trial job page
    is a fraction of a second of bootstrap intervals, a year holds 7,300: a full build is not what is
    measured): the manifest, and each kernel's kept series, the newest DEFAULT_LAST points of the series
    among the store's newest PRIME_JOBS jobs (the synthetic team's nightly specs have each point's newest
    100 in them, 5 jobs of its spec a night). Returns the manifest."""
    from jobs.history.series import Selection
    from jobs.report import site
    from jobs.report.site_series import dumps, found, window

    (out / "jobs").mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(parents=True, exist_ok=True)
    windows = [window(s, DEFAULT_LAST) for s in collect(store, Selection(last=PRIME_JOBS), detect=False)]
    found(windows)
    for w in windows:
        (out / "kernels" / f"{w.key.slug}.json").write_text(dumps(w))
    manifest = {
        "version": site.MANIFEST_VERSION,
        "last": DEFAULT_LAST,
        "jobs": {str(j): v for j, v in store.job_stamps().items()},
        "kernels": {w.key.slug: site._index_row(w) for w in windows},  # noqa: SLF001 - the build's own rows
    }
    (out / site.MANIFEST).write_text(json.dumps(manifest))
    return manifest


def _night(db: Path, work: Path) -> dict[str, float]:
    """`farm site` after one more night into a folder that held the site of the store as it was (its
    manifest as a build leaves it; benchmarks/scale_bench.py's `_site`), on a copy of the store."""
    from benchmarks import scale_store
    from jobs.report import site
    from jobs.report.html import render_job
    from jobs.report.views import NAV_INDEX

    copy = work / "farm.db"
    src, dst = sqlite3.connect(db), sqlite3.connect(copy)
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    store = Store(str(copy), create=False)
    out = work / "site"
    wall, cpu = time.perf_counter(), time.process_time()
    manifest = prime_site(store, out)
    primed = (time.perf_counter() - wall, time.process_time() - cpu)
    scale_store.build(store, 1, pools=scale_store.make_pools(store))
    wall, cpu = time.perf_counter(), time.process_time()
    night = site.build_site(store, out)
    built = (time.perf_counter() - wall, time.process_time() - cpu)
    new = [j for j in store.job_stamps() if str(j) not in manifest["jobs"]]
    wall, cpu = time.perf_counter(), time.process_time()
    pages_of = _job_pages(store)
    for job_id in new:  # the part that is jobs.report.html's: the night's job pages, once more
        render_job(store, job_id, "../plotly.min.js", NAV_INDEX, pages_of(job_id, new))
    pages = (time.perf_counter() - wall, time.process_time() - cpu)
    store.close()
    index = "site: every kernel's kept series (read and detected, as a full build keeps them)"
    return {
        index: primed[0],
        f"{index} [cpu]": primed[1],
        "site (after one more night)": built[0],
        "site (after one more night) [cpu]": built[1],
        f"site: its {len(new)} job pages alone (jobs.report.html, rendered again)": pages[0],
        f"site: its {len(new)} job pages alone (jobs.report.html, rendered again) [cpu]": pages[1],
        "site pages rewritten after the night": night.pages,
    }


def _job_pages(store: Store):
    """job id, the night's jobs -> the reads its page is rendered from, as the site's build makes them:
    one jobs.report.recent.RecentReads for the night's pages (none in a checkout without it)."""
    try:
        from jobs.report.recent import RecentReads
        from jobs.report.rows import JobReads
    except ImportError:
        return lambda _job_id, _night: None
    shared: dict[tuple, RecentReads] = {}

    def reads(job_id: int, night: list[int]) -> JobReads:
        if tuple(night) not in shared:
            shared[tuple(night)] = RecentReads(store, night)
        return JobReads(store, job_id, recent=shared[tuple(night)])

    return reads


def at_scale(db: Path, repeat: int, with_site: bool) -> dict[str, float]:
    """The history commands (and the site after a night) on a scale store; seconds."""
    from jobs.history.series import Selection

    windowed = "last" in Selection.__dataclass_fields__  # this checkout shows the newest jobs by default
    d = ["--db", str(db)]
    family = ["--family", "gemm", "--json"]
    runs = {"history (one series)": SERIES, "history (a family: gemm, --json)": family}
    out: dict[str, float] = {}
    _cli(["history", *SERIES, *d])()  # the imports a first command pays (torch, the kernel families)
    for name, args in runs.items():
        if windowed:
            out |= _shown(name, _timed(_cli(["history", *args, *d]), repeat))
        every = _cli(["history", *args, *d] + (["--all"] if windowed else []))
        out |= _shown(f"{name} --all", _timed(every, repeat))
    if with_site:
        with tempfile.TemporaryDirectory(prefix="kf-site-") as tmp:
            night = _night(db, Path(tmp))
        for name, v in night.items():
            print(f"{name}: {v:.3f}" if isinstance(v, float) else f"{name}: {v}", flush=True)
        out |= night
    return out


def _shown(name: str, figures: tuple[float, float]) -> dict[str, float]:
    """A command's (wall, CPU) seconds as they are kept, printed as they come."""
    print(f"{name}: {figures[0]:.3f} s ({figures[1]:.3f} s CPU)", flush=True)
    return {name: figures[0], f"{name} [cpu]": figures[1]}


def main(argv: list[str] | None = None) -> dict[str, float]:
    argv = list(argv or [])
    if "--store" in argv:
        ap = argparse.ArgumentParser(prog="python -m benchmarks site")
        ap.add_argument("--store", type=Path, required=True)
        ap.add_argument("--site", action="store_true")
        ap.add_argument("--repeat", type=int, default=2)
        opts = ap.parse_args(argv)
        return at_scale(opts.store, opts.repeat, opts.site)
    written = "--written" in argv
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "farm.db"))
        start = time.perf_counter()
        if written:
            built = build_history_store(store, jobs=30, slow_from=20)
        else:
            session.connect(gpus=1)
            try:
                built = build_history_store(
                    store, jobs=30, slow_from=20, real=range(1, 31), echo=lambda _: None
                )
            finally:
                session.disconnect()
        build_s = time.perf_counter() - start
        print(f"store of 30 jobs ({len(built.real_jobs)} real sweeps) built in {build_s:.1f} s")
        start = time.perf_counter()
        series = collect(store)
        history_s = time.perf_counter() - start
        as_expected = True
        for s in series:
            found = ", ".join(f"job {c.job_id} {c.magnitude:+.1%}" for c in s.changes) or "none"
            print(f"  {s.key.label}: change points {found}")
            ok = [c.job_id for c in s.changes] == [built.slow_job]
            ok = ok and abs(s.changes[0].magnitude - 0.2) <= 0.05
            if not ok:  # what the method saw: the per-job medians (a busy machine shows here)
                print("    medians (ms):", " ".join(f"{p.median_ns / 1e6:.3f}" for p in s.points))
            as_expected &= ok
        print(f"one change point at job 20 within 5 points of +20%, none elsewhere: {as_expected}")
        start = time.perf_counter()
        result = build_site(store, Path(tmp) / "site")
        site_s = time.perf_counter() - start
        store.close()
    print(f"history of {len(series)} points over 30 jobs (E-divisive): {history_s:.2f} s")
    print(
        f"site: {result.pages} pages ({result.kernels} kernels, {result.jobs} jobs) in {site_s:.2f} s"
        " (target < 10 s)"
    )
    return {
        "real_sweeps": len(built.real_jobs),
        "build_s": build_s,
        "history_s": history_s,
        "site_s": site_s,
        "pages": result.pages,
        "change_points_as_expected": as_expected,
    }


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
