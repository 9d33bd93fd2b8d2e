"""`python -m benchmarks scale`: a synthetic year of a team's farm data, and every interactive command
timed on it (issue 46).

The store is benchmarks/scale_store.py's team (20 jobs a night of 500 trials with 100 samples each, with
baselines, anomalies, failures, drafts and queue history), grown to each size in turn (a fraction of a
year) on SQLite and on a throwaway PostgreSQL server started as the tests start theirs (tests/pgserver.py:
fsync off, shared_buffers 32 MB). At each size: the store's size (bytes per trial, of the trial rows and of
the sample arrays) and benchmarks/scale_commands.py's commands, each the median of `--repeat` runs in this
process. At the first size the site is built once, then one more night is added and `farm site` rebuilds
into the same folder (only what changed). `--before DIR` (a `git worktree` of the commit issue 46 started
from) times the same commands with that code, on a copy of the SQLite store downgraded to its schema
(samples one row each), at the sizes up to `--before-max`.

The gateway ledger's half (benchmarks/scale_ledger.py's `ledger_part(size_fraction, args)`), when that
module exists, runs at each size too and its rows are kept beside these.

    .venv/bin/python -m benchmarks scale                       # 1/64 of a year (a few minutes)
    .venv/bin/python -m benchmarks scale --full                # 1/64, 1/16, 1/4
    .venv/bin/python -m benchmarks scale --sizes 1/256 --backends sqlite --before /tmp/before
    .venv/bin/python -m benchmarks scale --sizes 1/64,1/16 --backends sqlite --memory   # and peak memory
"""

from __future__ import annotations

import argparse
import atexit
import datetime
import importlib.util
import json
import platform
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHORT, FULL = ("1/64",), ("1/64", "1/16", "1/4")
TARGET_S = 1.0


def _ledger_part():
    """benchmarks.scale_ledger.ledger_part, or None while that module does not exist."""
    if importlib.util.find_spec("benchmarks.scale_ledger") is None:
        return None
    from benchmarks.scale_ledger import ledger_part

    return ledger_part


def _options(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="the curve: 1/64, 1/16, 1/4 of a year")
    ap.add_argument("--sizes", default=None, help="fractions of a year, comma-separated (1/64,1/16)")
    ap.add_argument("--backends", default="sqlite,postgresql")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", default=None, help="a checkout of the commit before issue 46 (git worktree)")
    ap.add_argument("--before-max", default="1/64", help="the largest size timed with --before")
    ap.add_argument("--no-ledger", action="store_true", help="leave out benchmarks/scale_ledger.py's part")
    ap.add_argument("--site", action="store_true", help="time `farm site` after one more night (first size)")
    ap.add_argument("--queue", type=int, default=0, help="trials per queue depth through the queue (0: none)")
    ap.add_argument("--commands", default=None, help="only these commands (names as the table has them, ';')")
    ap.add_argument("--memory", action="store_true", help="each command's peak memory in a fresh process too")
    ap.add_argument(
        "--keep-server", action="store_true", help="PostgreSQL: the server and its store left running at the "
        "end (its URL and data folder printed) until this process gets SIGTERM or ^C",
    )  # fmt: skip
    known, _ = ap.parse_known_args(argv)  # the ledger's options are its own
    return known


# --- the stores ------------------------------------------------------------------------------------------
_PG: Any = None


def _new_store(backend: str, work: Path):
    global _PG
    from jobs.store import Store

    if backend == "sqlite":
        return Store(str(work / "farm.db"))
    if _PG is None:
        sys.path.insert(0, str(REPO / "tests"))  # pgserver, as pytest finds it
        from pgserver import start_server

        _PG = start_server()
        atexit.register(_PG.stop)
    return Store(_PG.url(_PG.create_database("scale")))


def _sizes(store) -> dict[str, Any]:
    """Rows and bytes: the whole store, the trial rows and the sample arrays, each per trial."""
    from sqlalchemy import text

    with store.engine.connect() as conn:
        trials = conn.scalar(text("SELECT count(*) FROM trials"))
        jobs = conn.scalar(text("SELECT count(*) FROM jobs"))
        if store.engine.dialect.name == "sqlite":
            pages = dict(conn.execute(text("SELECT name, sum(pgsize) FROM dbstat GROUP BY name")).all())
            total = sum(pages.values())
            samples = sum(v for k, v in pages.items() if "samples" in k)
            trial_rows = sum(
                v
                for k, v in pages.items()
                if k == "trials" or k.startswith(("ix_trials", "sqlite_autoindex_trials"))
            )
        else:
            total = conn.scalar(text("SELECT pg_database_size(current_database())"))
            samples = conn.scalar(text("SELECT pg_total_relation_size('samples')"))
            trial_rows = conn.scalar(text("SELECT pg_total_relation_size('trials')"))
    return {
        "jobs": jobs,
        "trials": trials,
        "db_bytes": total,
        "bytes_per_trial": round(total / max(trials, 1)),
        "trial_row_bytes_per_trial": round(trial_rows / max(trials, 1)),
        "sample_bytes_per_trial": round(samples / max(trials, 1)),
    }


# --- the site: built once, then one more night ------------------------------------------------------------
def _site(store, pools, work: Path) -> dict[str, float]:
    """`farm site` into a folder that holds the site of the store as it was, after one more night: the
    folder's manifest is made as a build leaves it (its job pages are not rendered: a 500-trial job page
    is seconds of bootstrap intervals, and a full build of every job is not what is measured)."""
    from benchmarks import scale_store
    from benchmarks.site_bench import prime_site
    from jobs.report import site

    out = work / "site"
    start = time.perf_counter()
    prime_site(store, out)
    primed = time.perf_counter() - start
    scale_store.build(store, 1, pools=pools)
    start = time.perf_counter()
    night = site.build_site(store, out)
    return {
        "site: every kernel's kept series (read and detected, as a full build keeps them)": primed,
        "site (after one more night)": time.perf_counter() - start,
        "site pages rewritten after the night": night.pages,
    }


# --- before: the commit issue 46 started from, on the same store at its schema ------------------------------
def _before(db: Path, checkout: Path, repeat: int, only: str | None) -> dict[str, Any]:
    """The commands timed by `checkout`'s code on a copy of the SQLite store at revision 0009 (one row
    per sample), and that copy's sizes."""
    from jobs.store import Store

    copy = db.with_name("before.db")
    src, dst = sqlite3.connect(db), sqlite3.connect(copy)
    with dst:
        src.backup(dst)  # a consistent copy, the WAL's pages included
    src.close()
    dst.close()
    _downgrade(copy, "0009")
    store = Store.__new__(Store)  # the schema is older than this code's: read its sizes only
    from jobs.store import make_engine

    store.engine = make_engine(str(copy), check_schema=False)
    sizes = _sizes(store)
    store.engine.dispose()
    out = copy.with_suffix(".json")
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "scale_commands.py"),
        "--db",
        str(copy),
        "--out",
        str(out),
    ]
    cmd += ["--repeat", str(repeat), "--old-schema"] + (["--only", only] if only else [])
    env = {"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    subprocess.run(cmd, check=True, cwd=checkout, env=env)
    times = json.loads(out.read_text())
    copy.unlink()
    return {"times": times, "sizes": sizes}


def _downgrade(path: Path, target: str) -> None:
    from alembic import command
    from alembic.config import Config

    from jobs.store import make_engine
    from jobs.store.schema import MIGRATIONS_DIR, VERSION_TABLE

    engine = make_engine(str(path), check_schema=False)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("version_table", VERSION_TABLE)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, target)
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM")
    finally:
        engine.dispose()


# --- one backend over the sizes ---------------------------------------------------------------------------
def _measure(backend: str, sizes: list[str], opts: argparse.Namespace) -> list[dict]:
    from benchmarks import scale_commands, scale_store

    work = Path(tempfile.mkdtemp(prefix=f"kf-scale-{backend}-"))
    store = _new_store(backend, work)
    rows = []
    try:
        start = time.perf_counter()
        pools = scale_store.make_pools(store)
        print(f"{backend}: result pools made in {time.perf_counter() - start:.0f} s", flush=True)
        for i, size in enumerate(sizes):
            start = time.perf_counter()
            scale_store.build(
                store, scale_store.days_of(Fraction(size)) - scale_store._days_done(store), pools=pools
            )
            _analyze(store)
            built = time.perf_counter() - start
            row = {"backend": backend, "size": size, "build_s": built, "url": store.url, **_sizes(store)}
            mb = row["db_bytes"] / 1e6
            print(f"{backend} {size}: {row['jobs']:,} jobs, {row['trials']:,} trials, {mb:.0f} MB "
                  f"(built in {built:.0f} s); timing the commands ...", flush=True)  # fmt: skip
            only = opts.commands.split(";") if opts.commands else None
            clocks = scale_commands.time_all_clocks(store.url, opts.repeat, only)
            row["times"] = clocks.pop("wall")
            row["clocks"] = clocks  # cpu: this process's; server_cpu: PostgreSQL's (its processes' CPU)
            if opts.memory:  # before the queue's jobs are added: the same commands as timed
                row["memory"] = scale_commands.memory_all(store.url, only, clock="cpu")
            if opts.queue:  # after the commands: its jobs stay in the store
                from benchmarks.scale_queue import queue_part

                row["times"] |= queue_part(store, trials=opts.queue)
            if i == 0 and opts.site:
                row["times"] |= _site(store, pools, work)
            if opts.before and backend == "sqlite" and Fraction(size) <= Fraction(opts.before_max):
                print(f"{backend} {size}: the same commands at the commit before issue 46 ...", flush=True)
                row["before"] = _before(Path(store.url), Path(opts.before), opts.repeat, opts.commands)
            rows.append(row)
            print(table([row]), flush=True)
    finally:
        store.close()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def _analyze(store) -> None:
    """PostgreSQL: VACUUM ANALYZE after a bulk load, as a team's server's autovacuum would have done (the
    benchmark's server, tests/pgserver.py's, runs without autovacuum): the planner's statistics and the
    visibility map the index-only scans read."""
    if store.engine.dialect.name != "postgresql":
        return
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE")


def _hold(url: str) -> None:
    """--keep-server: the PostgreSQL server and its store kept until SIGTERM or ^C (then stopped)."""
    import os
    import signal

    print(
        f"PostgreSQL kept: {url} (data {_PG.data}; this process {os.getpid()}: kill it to stop the server)",
        flush=True,
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # atexit stops the server
    try:
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3f}" if v < 100 else f"{v:.0f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def table(rows: list[dict], clock: str = "wall") -> str:
    """Every command (rows) at every size and backend (columns), after, with before in brackets where
    measured; a figure over TARGET_S in bold. `clock`: wall, or one of the row's "clocks" (cpu,
    server_cpu), without before's figures (timed on wall)."""
    cols = [(r["backend"], r["size"]) for r in rows]
    if clock != "wall":
        rows = [r | {"times": r.get("clocks", {}).get(clock, {}), "before": {}} for r in rows]
    names = list(dict.fromkeys(n for r in rows for n in r["times"]))
    out = ["| command | " + " | ".join(f"{b} {s}" for b, s in cols) + " |", "|---|" + "---:|" * len(cols)]
    for name in names:
        cells = []
        for r in rows:
            v = r["times"].get(name)
            text = _cell(v)
            if isinstance(v, float) and v > TARGET_S and not name.startswith(("site", "queue")):
                text = f"**{text}**"
            before = r.get("before", {}).get("times", {}).get(name)
            cells.append(text + (f" ({_cell(before)})" if before is not None else ""))
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    for key in (
        "jobs",
        "trials",
        "db_bytes",
        "bytes_per_trial",
        "trial_row_bytes_per_trial",
        "sample_bytes_per_trial",
    ):
        cells = []
        for r in rows:
            before = r.get("before", {}).get("sizes", {}).get(key)
            cells.append(_cell(r[key]) + (f" ({_cell(before)})" if before is not None else ""))
        out.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> dict:
    opts = _options(list(argv or []))
    sizes = opts.sizes.split(",") if opts.sizes else list(FULL if opts.full else SHORT)
    sizes.sort(key=Fraction)
    rows: list[dict] = []
    for backend in [b for b in opts.backends.split(",") if b]:
        rows += _measure(backend, sizes, opts)
    part = None if opts.no_ledger else _ledger_part()
    ledger = [r for size in sizes for r in part(size, argv or [])] if part else []
    text = table(rows)
    for clock, what in (("cpu", "this process's CPU"), ("server_cpu", "the PostgreSQL server's CPU")):
        if any(r.get("clocks", {}).get(clock) for r in rows):
            text += f"\n\n{what}, seconds per command in the same runs (median)\n\n{table(rows, clock)}"
    if any("memory" in r for r in rows):
        from benchmarks.scale_commands import memory_table

        mem = memory_table({f"{r['backend']} {r['size']}": r["memory"] for r in rows if "memory" in r})
        text += f"\n\npeak memory over the imports, each command once in a fresh process (its CPU s)\n\n{mem}"
    print(
        "\nseconds per command, in this process (median of runs); (before issue 46) where measured\n" + text
    )
    stamp = datetime.datetime.now().strftime("%Y%m%d")
    tag = "full" if opts.full else "-".join(s.replace("/", "_") for s in sizes)
    md = RESULTS / f"scale-{tag}-{platform.node()}-{stamp}.md"
    md.write_text(f"# python -m benchmarks scale {' '.join(argv or [])}\n\n{text}\n")
    print(f"(table written to {md})")
    if opts.keep_server and _PG is not None:
        _hold(next(r["url"] for r in reversed(rows) if r["backend"] == "postgresql"))
    return {"sizes": sizes, "farm": rows, "ledger": ledger}
