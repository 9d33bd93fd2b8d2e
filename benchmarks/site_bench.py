"""`python -m benchmarks site`: how long `farm site` takes on the 30-job history store (target < 10 s),
and `farm history` over all of its points (change-point detection included)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from benchmarks.history_store import build_history_store
from jobs.history.series import collect
from jobs.report.site import build_site
from jobs.store.repository import Store


def main() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(str(Path(tmp) / "farm.db"))
        build_history_store(store, jobs=30, slow_from=20)
        start = time.perf_counter()
        series = collect(store)
        history_s = time.perf_counter() - start
        start = time.perf_counter()
        result = build_site(store, Path(tmp) / "site")
        site_s = time.perf_counter() - start
        store.close()
    print(f"history of {len(series)} points over 30 jobs (E-divisive): {history_s:.2f} s")
    print(
        f"site: {result.pages} pages ({result.kernels} kernels, {result.jobs} jobs) in {site_s:.2f} s"
        " (target < 10 s)"
    )
    return {"history_s": history_s, "site_s": site_s, "pages": result.pages}


if __name__ == "__main__":
    main()
