"""The interactive commands of `python -m benchmarks scale`, timed on one store (issue 46).

Each command runs in this process through the CLI (click's CliRunner: parsing, the store's reads, the
rendering; not the interpreter's start, which is the same at every size), once, then `repeat` more times
when the first took under 3 s; the figure is the median of those. The modules the commands import when
they run (WARM: SciPy, Plotly, the report's and the history's, and the kernel families of the store's
jobs, torch with them) are imported before the first: a first run over 3 s was the figure, and the first
command timed paid 1-5 s of imports the others did not.
`--memory` (or `--memory-only`, without the in-process times) runs each command once more in a fresh
process (multiprocessing's spawn) that imports the same modules first: its figure is the peak resident
memory while the command ran over what the process held after the imports (VmHWM, set back to VmRSS
by /proc/self/clear_refs before the command: what the command itself costs), beside that run's time.
`accept` is the judge's read (`Store.judging` of the job with its baseline and samples), what `farm
accept` waits on before judging.

This file imports only what the farm had before issue 46 (the CLI, `Store`, `point_key`), so that
`--before` can run it on a checkout of the commit the work started from (a `git worktree`), against the
same store downgraded to that schema:

    PYTHONPATH=/tmp/before python benchmarks/scale_commands.py --db farm.db --out before.json --old-schema
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERIES = ["--family", "gemm", "--backend", "torch_bf16", "--shape", "m=64,n=256,k=256"]
# what the commands import when they run (those a checkout lacks are left out: --before's)
WARM = (
    "scipy.stats", "plotly.graph_objects", "rich.table", "jobs.report.render", "jobs.report.html",
    "jobs.report.ab", "jobs.history.series", "jobs.judge.baselines", "jobs.drafts.client",
)  # fmt: skip


def _cli(args: list[str]) -> Callable[[], object]:
    from click.testing import CliRunner

    from jobs.cli import main

    def run() -> object:
        res = CliRunner().invoke(main, args)
        if res.exit_code not in (0, 1):  # 1: a verdict (a failed assertion), not an error
            raise RuntimeError(f"farm {' '.join(args)}: exit {res.exit_code}: {res.output[-2000:]}")
        return res

    return run


def _judging(db: str, job: int) -> Callable[[], object]:
    from jobs.judge.baselines import point_key
    from jobs.store import Store

    def run() -> object:
        store = Store(db, create=False)
        try:
            return store.judging(job, key=point_key)
        finally:
            store.close()

    return run


def _latest(db: str, name: str, n: int = 2) -> list[int]:
    """The newest `n` jobs of the spec `name`, newest first."""
    from sqlalchemy import select

    from jobs.store import Job, Store

    store = Store(db, create=False)
    try:
        with store.engine.connect() as conn:
            q = select(Job.id).where(Job.name == name).order_by(Job.id.desc()).limit(n)
            return list(conn.scalars(q))
    finally:
        store.close()


def commands(db: str, work: Path) -> dict[str, Callable[[], object]]:
    """What is timed: the name of each command as the table shows it -> a call that runs it."""
    new, old = _latest(db, "gemm-nightly")
    d = ["--db", db]
    return {
        "jobs list": _cli(["jobs", "list", *d]),
        "report JOB": _cli(["report", str(new), *d]),
        "report JOB --html": _cli(["report", str(new), "--html", str(work / "job.html"), *d]),
        "compare A B": _cli(["compare", str(old), str(new), *d]),
        "history (one series)": _cli(["history", *SERIES, *d]),
        "history (a family: gemm, --json)": _cli(["history", "--family", "gemm", "--json", *d]),
        "accept JOB (the judge's reads)": _judging(db, new),
        "failures list": _cli(["failures", "list", *d]),
        "drafts list JOB": _cli(["drafts", "list", str(new), *d]),
        "drafts account": _cli(["drafts", "account", *d]),
    }


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}  # cpu: this process's, not the database's


def timed(run: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    run()
    first = clock() - start
    if first >= 3 or repeat <= 0:
        return first
    times = []
    for _ in range(repeat):
        start = clock()
        run()
        times.append(clock() - start)
    return statistics.median(times)


def warm(db: str) -> None:
    """Import WARM's modules and the kernel families of the jobs in `db` (see the module's docstring)."""
    import importlib

    from sqlalchemy import select

    from jobs.store import Job, Store
    from kernels.registry import get_family

    for name in WARM:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    store = Store(db, create=False)
    try:
        with store.engine.connect() as conn:
            families = list(conn.scalars(select(Job.family).distinct()))
    finally:
        store.close()
    for family in families:
        try:
            get_family(family)
        except Exception:  # noqa: BLE001 - a family no longer installed: the report renders without it
            pass


def time_all(
    db: str, repeat: int = 3, only: list[str] | None = None, clock: str = "wall"
) -> dict[str, float]:
    warm(db)
    tick = CLOCKS[clock]
    with tempfile.TemporaryDirectory(prefix="kf-scale-") as tmp:
        found = commands(db, Path(tmp))
        return {name: timed(run, repeat, tick) for name, run in found.items() if not only or name in only}


# --- every clock in the same runs: wall, this process's CPU and a PostgreSQL server's CPU on this machine ---
def server_cpu_clock(db: str) -> Callable[[], float] | None:
    """A clock of the CPU seconds a PostgreSQL server on this machine has spent (its postmaster, its live
    processes, and the backends it has reaped: a command's connections end when its store closes), or None
    for SQLite or a server whose postmaster is not readable here. The server's other databases' work is
    counted too: time on a server nothing else uses."""
    if not db.startswith("postgresql"):
        return None
    from sqlalchemy import create_engine, text

    engine = create_engine(db)
    try:
        with engine.connect() as conn:
            data = conn.scalar(text("SHOW data_directory"))
    finally:
        engine.dispose()
    try:
        pid = int((Path(data) / "postmaster.pid").read_text().split()[0])
        Path(f"/proc/{pid}/stat").read_text()
    except (OSError, ValueError, IndexError):
        return None
    import os

    hz = os.sysconf("SC_CLK_TCK")

    def ticks(p: int, reaped: bool) -> int:
        try:  # the fields after the command's name (which may hold spaces): utime is the 14th field
            f = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # a backend that ended since it was listed: its time is in the postmaster's
            return 0
        return sum(int(x) for x in (f[11:15] if reaped else f[11:13]))

    def clock() -> float:
        try:
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            kids = []
        return (ticks(pid, True) + sum(ticks(int(k), False) for k in kids)) / hz

    return clock


def timed_clocks(
    run: Callable[[], object], repeat: int, clocks: dict[str, Callable[[], float]]
) -> dict[str, float]:
    """`timed` on every clock at once: the same runs (a first, then `repeat` more when it took under 3 s
    of wall), each clock's median."""
    start = {k: c() for k, c in clocks.items()}
    run()
    first = {k: c() - start[k] for k, c in clocks.items()}
    if first["wall"] >= 3 or repeat <= 0:
        return first
    runs: dict[str, list[float]] = {k: [] for k in clocks}
    for _ in range(repeat):
        start = {k: c() for k, c in clocks.items()}
        run()
        for k, c in clocks.items():
            runs[k].append(c() - start[k])
    return {k: statistics.median(v) for k, v in runs.items()}


def time_all_clocks(db: str, repeat: int = 3, only: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Every command (or those in `only`) on every clock in the same runs: {"wall": {name: s}, "cpu":
    {...}} and, for a PostgreSQL server on this machine, "server_cpu" (`server_cpu_clock`)."""
    warm(db)
    clocks = dict(CLOCKS)
    server = server_cpu_clock(db)
    if server is not None:
        clocks["server_cpu"] = server
    out: dict[str, dict[str, float]] = {k: {} for k in clocks}
    with tempfile.TemporaryDirectory(prefix="kf-scale-") as tmp:
        for name, run in commands(db, Path(tmp)).items():
            if only and name not in only:
                continue
            for k, v in timed_clocks(run, repeat, clocks).items():
                out[k][name] = v
    return out


# --- memory: each command in a fresh process --------------------------------------------------------------
def _status_mb(field: str) -> float:
    """This process's VmRSS (resident now) or VmHWM (its peak) in MB, from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status (memory is read on Linux only)")


def _reset_peak() -> bool:
    """The peak (VmHWM) set back to what is resident now (Linux: clear_refs 5); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_over(run: Callable[[], object], clock: str = "wall") -> dict[str, Any]:
    """`run` once in this process: what was resident before it ("base_mb"), the peak while it ran
    ("peak_mb"; the process's peak set back to the base first, else its peak so far: "reset"), the
    peak's increase over the base ("mb") and the run's time ("s", on `clock`)."""
    import gc

    tick = CLOCKS[clock]
    gc.collect()
    base = _status_mb("VmRSS")
    reset = _reset_peak()
    start = tick()
    run()
    took = tick() - start
    peak = _status_mb("VmHWM")
    return {"s": took, "base_mb": base, "peak_mb": peak, "mb": max(0.0, peak - base), "reset": reset}


def _one_in_child(db: str, name: str, clock: str, old_schema: bool, conn) -> None:
    """In a fresh process: the modules imported as `time_all` imports them, the command run once
    (`peak_over`); sends its figures."""
    try:
        if old_schema:
            _old_schema()
        warm(db)
        import jobs.cli  # noqa: F401 - what every command imports

        with tempfile.TemporaryDirectory(prefix="kf-scale-mem-") as tmp:
            conn.send(peak_over(commands(db, Path(tmp))[name], clock))
    except BaseException as e:  # noqa: BLE001 - the parent raises it with the command's name
        conn.send({"error": f"{type(e).__name__}: {e}"})
    finally:
        conn.close()


def memory_one(db: str, name: str, clock: str = "wall", old_schema: bool = False) -> dict[str, Any]:
    """`name` run once in a fresh process (multiprocessing's spawn: nothing of this one's heap): "mb" is
    its peak resident memory over what the process held after importing the commands' modules (what
    the command itself costs), with "base_mb" and "peak_mb", and "s" the run's time on `clock`."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_one_in_child, args=(db, name, clock, old_schema, send))
    child.start()
    send.close()
    try:
        got = recv.recv()
    except EOFError:
        got = {"error": "the process ended without a figure"}
    child.join()
    if "error" in got:
        raise RuntimeError(f"{name}: {got['error']} (exit {child.exitcode})")
    return got


def memory_all(
    db: str, only: list[str] | None = None, clock: str = "wall", old_schema: bool = False
) -> dict[str, dict[str, Any]]:
    """`memory_one` for each command (or those in `only`: a name not among them is an error)."""
    with tempfile.TemporaryDirectory(prefix="kf-scale-") as tmp:
        known = list(commands(db, Path(tmp)))
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise ValueError(f"no command named {unknown}; the commands: {'; '.join(known)}")
    names = [n for n in known if not only or n in only]
    return {name: memory_one(db, name, clock, old_schema) for name in names}


def memory_table(rows: dict[str, dict[str, dict[str, Any]]]) -> str:
    """Commands (rows) at each store (columns, the keys of `rows`): MB over the imports, and the time of
    that run in a fresh process."""
    cols = list(rows)
    names = list(dict.fromkeys(n for r in rows.values() for n in r))
    out = ["| command | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name in names:
        cells = []
        for col in cols:
            m = rows[col].get(name)
            cells.append("-" if m is None else f"{m['mb']:.1f} MB, {m['s']:.2f} s")
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def _old_schema() -> None:
    """The old checkout refuses a store at a revision it does not know: its schema check is skipped (the
    tables it reads are as it had them: the store was downgraded to its revision's samples)."""
    import jobs.store.engine as engine

    engine.ensure_schema = lambda *a, **k: None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--old-schema", action="store_true")
    ap.add_argument("--only", default=None, help="command names, separated by ';'")
    ap.add_argument(
        "--clock", choices=[*sorted(CLOCKS), "all"], default="wall", help="cpu: this process's CPU time (a "
        "busy host's share of a core left out; the database server's time too); all: wall, cpu and a "
        "PostgreSQL server's CPU on this machine, in the same runs (--memory's run on cpu)",
    )  # fmt: skip
    ap.add_argument(
        "--memory", action="store_true", help="each command also run once in a fresh process: its peak "
        'memory over the imports; --out then holds {"times": {...}, "memory": {...}}',
    )  # fmt: skip
    ap.add_argument("--memory-only", action="store_true", help="--memory without the in-process times")
    args = ap.parse_args(argv)
    if args.old_schema:
        _old_schema()
    only = args.only.split(";") if args.only else None

    def times() -> Any:
        if args.clock == "all":
            return time_all_clocks(args.db, args.repeat, only)
        return time_all(args.db, args.repeat, only, args.clock)

    if not (args.memory or args.memory_only):
        Path(args.out).write_text(json.dumps(times()))
        return 0
    out: dict[str, Any] = {}
    if not args.memory_only:
        out["times"] = times()
    out["memory"] = memory_all(args.db, only, "cpu" if args.clock == "all" else args.clock, args.old_schema)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(memory_table({args.db: out["memory"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
