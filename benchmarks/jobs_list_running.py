"""`farm jobs list` while a large job runs, on PostgreSQL (issue 46): one job of `--trials` no-op trials
queued, `--done` of them written (ok, with their start and end), 64 claimed by a pool, and `--jobs`
finished jobs of 400 trials beside it; `farm jobs list` timed through the CLI in this process (its CPU
seconds and wall, median of `--repeat` after a first run), with the statements it sends and the
server's time for each (EXPLAIN ANALYZE is not used: pg_stat_statements where the server has it, else
the client's time per statement)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def build(url: str, trials: int, done: int, jobs: int, vacuum: bool = False) -> int:
    """The store: the finished jobs, the large job with `done` trials written and 64 claimed; analyzed,
    and vacuumed only with `vacuum` (the written trials' old row versions left, as between two of
    autovacuum's runs while a pool writes)."""
    from sqlalchemy import text

    from benchmarks.queue_scale_ray import SPEC
    from jobs.queue.queue import Queue
    from jobs.spec.sweep import loads_spec
    from jobs.store import Store

    store = Store(url)
    queue = Queue(store)
    for i in range(jobs):  # finished jobs listed beside it
        j = queue.submit(
            loads_spec(SPEC.format(n=list(range(400))).replace("queue-scale", f"old{i}")), owner="o"
        )
        with store.engine.begin() as conn:
            conn.execute(
                text("UPDATE trials SET status='ok', started_at=now(), finished_at=now() WHERE job_id=:j"),
                {"j": j},
            )
            conn.execute(text("UPDATE jobs SET status='done' WHERE id=:j"), {"j": j})
    job = queue.submit(loads_spec(SPEC.format(n=list(range(trials)))), owner="scale")
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE trials SET status='ok', started_at=now() - (seq || ' ms')::interval, "
                "finished_at=now() - (seq || ' ms')::interval + interval '1 ms' WHERE job_id=:j AND seq < :n"
            ),
            {"j": job, "n": done},
        )
    queue.claim_many("bench-pool", None, 64)
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE" if vacuum else "ANALYZE")
    store.close()
    return job


def time_list(url: str, repeat: int) -> dict:
    from click.testing import CliRunner
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    from jobs.cli import main

    runs = []
    sent: list[tuple[str, float]] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        conn.info["t0"] = time.perf_counter()

    def after(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        sent.append((" ".join(statement.split())[:90], time.perf_counter() - conn.info["t0"]))

    for _ in range(repeat + 1):
        sent.clear()
        # the CLI makes its own Store: listen on every engine
        event.listen(Engine, "before_cursor_execute", before)
        event.listen(Engine, "after_cursor_execute", after)
        cpu, wall = time.process_time(), time.perf_counter()
        res = CliRunner().invoke(main, ["jobs", "list", "--db", url])
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        event.remove(Engine, "before_cursor_execute", before)
        event.remove(Engine, "after_cursor_execute", after)
        if res.exit_code != 0:
            raise RuntimeError(res.output[-2000:])
        runs.append({"cpu_s": cpu, "wall_s": wall, "statements": len(sent), "sent": list(sent)})
    runs = runs[1:] or runs
    slowest = sorted(runs[-1]["sent"], key=lambda s: -s[1])[:5]
    return {
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "wall_s": statistics.median(r["wall_s"] for r in runs),
        "statements": runs[-1]["statements"],
        "slowest_statements_ms": [(s, round(t * 1000, 1)) for s, t in slowest],
        "output": res.output,
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.jobs_list_running", description=__doc__.splitlines()[0]
    )
    ap.add_argument("--url", default=None, help="a store an earlier run built (--serve-s prints its URL)")
    ap.add_argument("--trials", type=int, default=100_000)
    ap.add_argument("--done", type=int, default=40_000)
    ap.add_argument("--jobs", type=int, default=20, help="finished jobs of 400 trials listed beside it")
    ap.add_argument("--vacuum", action="store_true", help="vacuum the store after it is built")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--serve-s", type=float, default=0, help="build, print the store's URL, keep its server this long"
    )
    args = ap.parse_args(argv)
    url, server = args.url, None
    if url is None:
        sys.path.insert(0, str(REPO / "tests"))
        from pgserver import start_server

        server = start_server()
    try:
        if server is not None:
            url = server.url(server.create_database("jobslist"))
            start = time.perf_counter()
            build(url, args.trials, args.done, args.jobs, args.vacuum)
            print(f"built in {time.perf_counter() - start:.0f} s: {url}", flush=True)
            if args.serve_s:
                time.sleep(args.serve_s)  # until then, or ^C
                return {}
        out = time_list(url, args.repeat)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps({k: v for k, v in out.items() if k != "output"}, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
