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
import re
import sys
from pathlib import Path

BENCHES = {
    "dispatch": "benchmarks.dispatch_bench",
    "gateway": "benchmarks.gateway_bench",
    "gateway-ir": "benchmarks.gateway_ir",  # instructions per request under valgrind (load-independent)
    "acceptance": "benchmarks.acceptance_bench",
    "soak": "benchmarks.soak",
    "shared": "benchmarks.shared_limits_bench",
    "site": "benchmarks.site_bench",
    "history-noise": "benchmarks.history_noise_bench",  # change points found on a loaded machine
    "service": "benchmarks.service_bench",  # farm --help, farm bench, a warm pool's queue and priorities
    "spec": "benchmarks.spec_bench",  # a 10^6-point grid refused: seconds and peak MB
    "validity": "benchmarks.validity_bench",  # what the checks after timing cost a trial (issue 45)
    "call-path": "benchmarks.call_path",  # the modules `farm accept` walks a job id through (issue 44)
    "scale": "benchmarks.scale_bench",  # a synthetic year of a team: every command timed per size (issue 46)
    "caching": "benchmarks.caching_bench",  # a Codex session with and without cache breakpoints (issue 48)
    "routing": "benchmarks.routing_bench",  # share on a 3x slower deployment, strategy latency (issue 48)
    "fairness": "benchmarks.fairness_bench",  # a day of a team against the pool's fair share (issue 47)
    "queue-scale": "benchmarks.queue_scale",  # store ms a trial, jobs list; PostgreSQL (issue 46)
    "gpu-check": "benchmarks.gpu_check",  # GPU hosts only (make gpu-check); not in the default run
}


def split_args(argv: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """The benchmarks named, and the options that follow each name, with their values:
    `gateway --redis`, `history-noise --fresh --commits 8` (a word that is not a benchmark's name, after
    an option, is that option's value)."""
    flags: dict[str, list[str]] = {}
    names: list[str] = []
    for arg in argv:
        if names and (arg.startswith("-") or (arg not in BENCHES and flags.get(names[-1]))):
            flags.setdefault(names[-1], []).append(arg)
        else:
            names.append(arg)
    return names, flags


def main(argv: list[str]) -> int:
    names, flags = split_args(argv)
    names = names or [n for n in BENCHES if n != "gpu-check"]
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
        # a benchmark with its own argument parser gets only the options given after its name: its
        # defaults are the reported run
        params = inspect.signature(bench_main).parameters
        figures = bench_main(flags.get(name, [])) if params else bench_main()
        if isinstance(figures, dict):
            tag = "".join(f"-{f.lstrip('-').replace('=', '')}" for f in flags.get(name, []))  # gateway-redis
            tag = re.sub(r"[^A-Za-z0-9_.,-]+", "_", tag)[:120]  # option values may hold / or spaces
            path = out_dir / f"{name}{tag}-{platform.node()}-{stamp}.json"
            path.write_text(json.dumps(figures, indent=2, default=str))
            print(f"(figures written to {path})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
