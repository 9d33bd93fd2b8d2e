"""`make bench`: every benchmark, one after another, each printing its own figures.

Pick some with `python -m benchmarks dispatch gateway`. Figures are also written as JSON under
benchmarks/results/ (one file per benchmark, named with the host and the date).
"""

from __future__ import annotations

import datetime
import importlib
import inspect
import json
import platform
import sys
from pathlib import Path

BENCHES = {
    "dispatch": "benchmarks.dispatch_bench",
    "gateway": "benchmarks.gateway_bench",
    "acceptance": "benchmarks.acceptance_bench",
    "soak": "benchmarks.soak",
}


def main(argv: list[str]) -> int:
    names = argv or list(BENCHES)
    unknown = [n for n in names if n not in BENCHES]
    if unknown:
        print(f"unknown benchmark(s) {unknown}; known: {', '.join(BENCHES)}", file=sys.stderr)
        return 2
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d")
    for name in names:
        print(f"\n=== {name} ===", flush=True)
        bench_main = importlib.import_module(BENCHES[name]).main
        # a benchmark with its own argument parser gets no arguments: its defaults are the reported run
        figures = bench_main([]) if inspect.signature(bench_main).parameters else bench_main()
        if isinstance(figures, dict):
            path = out_dir / f"{name}-{platform.node()}-{stamp}.json"
            path.write_text(json.dumps(figures, indent=2, default=str))
            print(f"(figures written to {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
