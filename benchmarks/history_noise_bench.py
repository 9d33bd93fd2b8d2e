"""History on a loaded machine (issue 32): is a slowing commit found, and nothing found where nothing changed?

Real sweeps through the runner (one local Ray for the whole run) with two busy loops beside them the whole
time. Twelve "commits" in order; at each, two jobs of the probe's `spin` backend (a busy loop of CPU work,
whose wall time grows with the share of a core the machine leaves it, as a CPU kernel's does): one spec
`changed` with 10 points (shapes) that becomes 1.6x slower from the 7th commit on (the `_slowdown: 0.6`
knob), one spec `unchanged` with 10 points that never changes. A series is one point across the 12 jobs.

Found: a series of `changed` whose one change point is the 7th job; false: any change point in a series of
`unchanged` (or a second one in `changed`). The figures are given for the level history uses (the median
of the kept samples, contended trials left out: jobs.history.series) and, beside it, for the fastest
samples (each job's p10), which were tried as the level.

    .venv/bin/python -m benchmarks history-noise [--commits 12] [--ms 20] [--fresh]

--fresh runs each job as its own `farm sweep run` (a local Ray each), so each job meets the load afresh,
as separate CI jobs on a shared runner do (issue 45); without it one Ray serves the whole run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testkit.kernels import faults

faults.enable()  # the injected faults its specs use: a FARM_PLUGINS module, for Ray and subprocesses too

SPEC = """
name: {name}
family: probe
backends: [{{name: spin, baseline: true, configs: {{grid: {{ms: [{ms}], _slowdown: [{slowdown}]}}}}}}]
shapes: {{grid: {{n: {shapes}}}}}
measure: {{warmup_ms: 0, min_samples: 10, max_samples: 10, max_time_s: 10.0, seeds: 1}}
timeout_s: 120
"""


def _busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv: list[str] | None = None) -> dict:
    from jobs.history.changepoints import e_divisive
    from jobs.history.series import Selection, collect
    from jobs.run.runner import RunOptions, run_sweep
    from jobs.spec.sweep import loads_spec
    from jobs.store import Store

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--commits", type=int, default=12)
    ap.add_argument("--slow-from", type=int, default=7, help="the first slowed commit (1-based)")
    ap.add_argument("--ms", type=float, default=20.0)
    ap.add_argument("--busy", type=int, default=2, help="busy loops beside the sweeps")
    ap.add_argument(
        "--fresh",
        action="store_true",
        help="each job its own `farm sweep run` (its own local Ray), as separate CI jobs would",
    )
    args = ap.parse_args(argv)

    db = Path(tempfile.mkdtemp(prefix="history-noise-")) / "farm.db"
    store = Store(str(db))
    options = RunOptions(gpus=2, show_progress=False, echo=lambda _m: None, oversubscribe=True)
    shapes = list(range(10))
    load = _busy(args.busy)
    t0 = time.perf_counter()
    try:
        for commit in range(1, args.commits + 1):
            slow = 0.6 if commit >= args.slow_from else 0.0
            for name, slowdown in (("changed", slow), ("unchanged", 0.0)):
                text = SPEC.format(name=name, ms=args.ms, slowdown=slowdown, shapes=shapes)
                if args.fresh:
                    _farm_sweep_run(text, db)
                else:
                    run_sweep(loads_spec(text), store, options)
    finally:
        for p in load:
            p.kill()
    wall = time.perf_counter() - t0

    res: dict = {"commits": args.commits, "slow_from": args.slow_from, "ms": args.ms, "busy": args.busy,
                 "wall_s": wall, "fresh": args.fresh}  # fmt: skip
    for name in ("changed", "unchanged"):
        series = collect(store, Selection(spec=name))
        target = args.slow_from - 1  # index of the first slowed job
        found = sum(1 for s in series if [c.index for c in s.changes] == [target])
        extra = sum(len(s.changes) for s in series) - (found if name == "changed" else 0)
        by_p10 = [e_divisive([p.p10_ns or p.median_ns for p in s.points]) for s in series]
        found_p10 = sum(1 for cps in by_p10 if [c.index for c in cps] == [target])
        extra_p10 = sum(len(cps) for cps in by_p10) - (found_p10 if name == "changed" else 0)
        contended = sum(p.contended for s in series for p in s.points)
        res[name] = {
            "series": len(series),
            "found": found if name == "changed" else 0,
            "false": extra,
            "found_by_p10": found_p10 if name == "changed" else 0,
            "false_by_p10": extra_p10,
            "contended_points": contended,
            "points": sum(len(s.points) for s in series),
            "median_spread": _spread([p.median_ns for s in series for p in s.points]),
            "level_spread": _spread([p.level_ns for s in series for p in s.points]),
        }
    store.close()
    print(report(res))
    return res


def _farm_sweep_run(spec_text: str, db: Path) -> None:
    """One job as a CI job runs it: `farm sweep run` in a process of its own, with a local Ray of its own."""
    spec = db.parent / "spec.yaml"
    spec.write_text(spec_text)
    farm = [sys.executable, "-c", "from jobs.entry import main; main()"]
    flags = ["--gpus", "2", "--oversubscribe", "--quiet", "--no-report", "--no-accept"]
    cmd = [*farm, "sweep", "run", str(spec), "--db", str(db), *flags]
    subprocess.run(cmd, check=False, capture_output=True, timeout=600)


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{xs[0] / 1e6:.1f}-{xs[-1] / 1e6:.1f} ms"


def report(res: dict) -> str:
    c, u = res["changed"], res["unchanged"]
    return "\n".join([
        f"history on a loaded machine: {res['commits']} commits, 1.6x slower from commit {res['slow_from']}, "
        f"spin {res['ms']:g} ms, {res['busy']} busy loops beside ({res['wall_s']:.0f} s of sweeps"
        + (", each job its own farm sweep run)" if res.get("fresh") else ")"),
        f"  level (median, contended left out): found {c['found']} of {c['series']} slowed series, "
        f"{c['false'] + u['false']} false change points ({u['series']} unchanged series)",
        f"  fastest samples (p10), tried:       found {c['found_by_p10']} of {c['series']}, "
        f"{c['false_by_p10'] + u['false_by_p10']} false",
        f"  contended trials: {c['contended_points'] + u['contended_points']} of "
        f"{c['points'] + u['points']}; medians {c['median_spread']} (changed) {u['median_spread']} "
        f"(unchanged), levels {c['level_spread']} / {u['level_spread']}",
        "  target: >= 9 of 10 found, 0 false",
    ])  # fmt: skip


if __name__ == "__main__":
    main()
