"""`python -m benchmarks site`: how long `farm site` takes on the 30-job history store (target < 10 s),
and `farm history` over all of its points (change-point detection included).

The store is the all-real one: 30 sweeps of the history probe spec through the runner on local Ray, a
real 20% slowdown (the probe's `_slowdown` knob) from job 20 on (about 2 minutes on 2 cores); the
change points found are printed and checked against the "Done when" of issue 20 (one at job 20, within
5 points of +20%, none elsewhere). `--written` builds the store through the Store API instead (seconds)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.history_store import build_history_store
from cluster import session
from jobs.history.series import collect
from jobs.report.site import build_site
from jobs.store import Store
from testkit.kernels import faults

faults.enable()  # the injected faults its specs use: a FARM_PLUGINS module, for Ray and subprocesses too


def main(argv: list[str] | None = None) -> dict[str, float]:
    written = "--written" in (argv or [])
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
