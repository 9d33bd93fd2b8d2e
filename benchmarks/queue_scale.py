"""`python -m benchmarks queue-scale`: the queue at a team's scale on PostgreSQL (issue 46).

Two parts, on a throwaway PostgreSQL server started as the tests start theirs (tests/pgserver.py):

- **store**: a store grown to a fraction of the team's year (benchmarks/scale_store.py), then trials
  taken through the queue one at a time as a pool takes them (`Queue.claim`, the result written with
  `Store.record_results`, `Queue.finish`) while the queue holds 1, 8, 32 and 96 waiting jobs of 400
  trials; per depth: the median ms per trial, the statements per trial, and `farm jobs list` (through
  the CLI in this process) with that queue. Flat means the store's part of a trial does not grow with
  the queue or the store.
- **ray** (`--ray-trials N`): one job of N trials of the probe family's no-op backend on `--workers`
  logical workers of a `ray.cluster_utils` cluster, served by `farm pool serve`'s loop
  (jobs.queue.pool.serve) from the queue on PostgreSQL. The store time per trial is the time the pool's
  process spent in statements on the store (SQLAlchemy's cursor events) over the trials written, per
  tenth of the job (start, middle, end: flat or not), and `farm jobs list` is timed while it runs.
  Bounded by `--ray-budget-s`: the figures say how many of the N trials ran. What the server's backends
  were doing is sampled meanwhile (pg_stat_activity: running, or waiting on a lock, the disk, ...).

Both parts report the server's own time per statement beside the client's (pg_stat_statements, loaded
into the benchmark's server at its start): calls and mean ms of the statements that took most, and the
server's ms and executions per trial (an executemany of n rows is n executions there, one statement for
the client). On a shared host the client's ms move 2-5x with the load; the server's are steadier.

    python -m benchmarks queue-scale --size 1/64 --trials 200
    python -m benchmarks queue-scale --size 1/64 --trials 0 --ray-trials 100000 --workers 64
"""

from __future__ import annotations

import argparse
import atexit
import statistics
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from sqlalchemy import event

REPO = Path(__file__).resolve().parents[1]
DEPTHS = (1, 8, 32, 96)


class StoreClock:
    """Statements sent on an engine and the seconds they took (cursor events): what `reset` returns."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.n, self.s = engine, 0, 0.0
        self.kinds: dict[str, list] = {}  # a statement's first words -> [count, seconds], never reset
        self._started: dict[int, float] = {}
        event.listen(engine, "before_cursor_execute", self._before)
        event.listen(engine, "after_cursor_execute", self._after)

    def _before(self, conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ARG002
        self._started[id(cursor)] = time.perf_counter()

    def _after(self, conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ARG002
        began = self._started.pop(id(cursor), None)
        if began is not None:
            took = time.perf_counter() - began
            self.n += 1
            self.s += took
            kind = self.kinds.setdefault(_kind(statement), [0, 0.0])
            kind[0] += 1
            kind[1] += took

    def top(self, n: int = 6) -> dict[str, tuple[int, float]]:
        """The statements that took longest in all, with how many were sent and their seconds."""
        ranked = sorted(self.kinds.items(), key=lambda kv: -kv[1][1])[:n]
        return {k: (c, round(s, 3)) for k, (c, s) in ranked}

    def reset(self) -> tuple[int, float]:
        out, self.n, self.s = (self.n, self.s), 0, 0.0
        return out

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._before)
        event.remove(self.engine, "after_cursor_execute", self._after)


class ServerClock:
    """The server's own time per statement (pg_stat_statements, where the server loads it): what the
    database spent executing, without the client's waits (its GIL, its share of the cores), so steadier
    than the client's clock on a busy host. `read` gives each statement's calls and milliseconds since
    the last `reset`; without the extension both do nothing and `read` gives {}."""

    def __init__(self, url: str) -> None:
        from sqlalchemy import create_engine

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
                conn.exec_driver_sql("SELECT pg_stat_statements_reset()")
            self.on = True
        except Exception:  # noqa: BLE001 - not preloaded, or not PostgreSQL: no server times
            self.on = False

    def reset(self) -> None:
        if self.on:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_stat_statements_reset()")

    def read(self) -> dict[str, tuple[int, float]]:
        """Statement (its first words) -> (calls, server ms in all), since the last reset."""
        if not self.on:
            return {}
        q = (
            "SELECT query, calls, total_exec_time FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND query NOT LIKE '%%pg_stat_statements%%' AND query NOT ILIKE 'VACUUM%%'"
        )
        out: dict[str, tuple[int, float]] = {}
        with self.engine.connect() as conn:
            for query, calls, ms in conn.exec_driver_sql(q):
                key = _kind(query)
                n, t = out.get(key, (0, 0.0))
                out[key] = (n + int(calls), t + float(ms))
        return out

    def close(self) -> None:
        self.engine.dispose()


class WaitSampler:
    """What the server's backends on the store's database are doing, sampled every `every_s` on a
    connection of its own (pg_stat_activity): per statement, how often it was seen active and on what it
    waited (no wait event: running, or waiting for a core). Rows locked show as Lock:transactionid or
    Lock:tuple, the disk as IO:..., the server's own queues as LWLock:..."""

    def __init__(self, url: str, every_s: float = 0.2) -> None:
        import threading

        from sqlalchemy import create_engine

        self.engine = create_engine(url, isolation_level="AUTOCOMMIT")
        self.every_s, self.samples = every_s, 0
        self.seen: dict[str, dict[str, int]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> WaitSampler:
        self.thread.start()
        return self

    def _run(self) -> None:
        q = (
            "SELECT query, coalesce(wait_event_type || ':' || wait_event, 'CPU') FROM pg_stat_activity "
            "WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()"
        )
        try:
            with self.engine.connect() as conn:
                while not self.stop.wait(self.every_s):
                    self.samples += 1
                    for query, wait in conn.exec_driver_sql(q):
                        per = self.seen.setdefault(_kind(query or ""), {})
                        per[wait] = per.get(wait, 0) + 1
        except Exception as e:  # noqa: BLE001 - not PostgreSQL, or the server went: no more samples
            self.seen.setdefault("(sampling stopped)", {})[type(e).__name__] = 1

    def close(self) -> dict[str, dict[str, int]]:
        """Stop; each statement's samples active, by wait (the most seen first)."""
        self.stop.set()
        self.thread.join(10)
        self.engine.dispose()
        ranked = sorted(self.seen.items(), key=lambda kv: -sum(kv[1].values()))
        return {"samples": {"taken": self.samples}} | {
            k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in ranked[:8]
        }


def _kind(statement: str) -> str:
    """A statement's name in the figures: its first words, and what a SELECT ... FOR UPDATE locks."""
    words = statement.split()
    kind = " ".join(words[:4])[:60]
    if "SKIP LOCKED" in statement:
        kind += " ... SKIP LOCKED"
    return kind


def per_trial(server: dict[str, tuple[int, float]], trials: int, top: int = 5) -> dict[str, Any]:
    """Server ms per trial in all, and the statements that took most of it (calls, mean ms)."""
    if not server or not trials:
        return {}
    ranked = sorted(server.items(), key=lambda kv: -kv[1][1])[:top]
    return {
        "server ms per trial": sum(ms for _, ms in server.values()) / trials,
        "server statements per trial": sum(n for n, _ in server.values()) / trials,
        "server: calls, mean ms": {k: (n, round(ms / max(n, 1), 3)) for k, (n, ms) in ranked},
    }


def _preload_stat_statements(server: Any) -> None:
    """Restart the test server with pg_stat_statements loaded (pg_ctl restart keeps its options)."""
    import psycopg

    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
    log = str(server.root / "server.log")  # as start_server: the server writes there, not to our pipe
    server._check(
        "restart", "pg_ctl", "-D", str(server.data), "-l", log, "-w", "-t", "60", "-m", "fast", "restart"
    )


def pg_store(size: str):
    """A store on a new PostgreSQL server grown to `size` of the team's year."""
    from benchmarks import scale_store
    from jobs.store import Store

    sys.path.insert(0, str(REPO / "tests"))  # pgserver, as pytest finds it
    import psycopg
    from pgserver import Unavailable, start_server

    server = start_server()
    atexit.register(server.stop)
    try:
        _preload_stat_statements(server)
    except (Unavailable, OSError, psycopg.Error) as e:
        print(f"no server-side times: {e}", flush=True)
    store = Store(server.url(server.create_database("queue")))
    start = time.perf_counter()
    scale_store.build(store, scale_store.days_of(Fraction(size)))
    print(f"store at {size}: built in {time.perf_counter() - start:.0f} s", flush=True)
    return store


def jobs_list_s(url: str, repeat: int = 3) -> float:
    """`farm jobs list` through the CLI in this process: the median of `repeat` runs after a first."""
    from click.testing import CliRunner

    from jobs.cli import main

    times = []
    for _ in range(repeat + 1):
        start = time.perf_counter()
        res = CliRunner().invoke(main, ["jobs", "list", "--db", url])
        times.append(time.perf_counter() - start)
        if res.exit_code != 0:
            raise RuntimeError(f"farm jobs list: exit {res.exit_code}: {res.output[-2000:]}")
    return statistics.median(times[1:] or times)


def _serve_once(queue: Any, store: Any, results: Any, batch: int) -> list[int]:
    """Claim (one trial, or `batch` at once as a pool with that many free workers does), write, finish;
    the trials taken."""
    claimed = queue.claim_many("scale-pool", None, batch)
    if claimed:
        store.record_results([results(c.trial.id) for c in claimed])
        queue.finish({c.job.id for c in claimed})
    return claimed


def store_part(store: Any, depths: tuple[int, ...], trials: int, batch: int) -> dict[str, float]:
    """Per depth: ms per trial (claim + write + finish, one trial at a time, then `batch` at a time),
    statements per trial, and `farm jobs list` in seconds."""
    from benchmarks import scale_queue, scale_store
    from jobs.queue.queue import Queue
    from jobs.spec.sweep import loads_spec
    from jobs.store.results import result_of

    queue, spec = Queue(store), loads_spec(scale_queue.SPEC)
    samples = [100_000 + i for i in range(100)]

    def results(trial_id: int) -> Any:
        return result_of(trial_id, samples, environment=scale_store.ENV)

    clock, server = StoreClock(store.engine), ServerClock(store.url)
    out: dict[str, Any] = {}
    waiting: list[int] = []
    for depth in depths:
        while len(waiting) < depth:
            waiting.append(queue.submit(spec, owner=f"owner{len(waiting) % 4}"))
        for size, label in ((1, "one at a time"), (batch, f"{batch} at a time")):
            times, statements, db_ms, taken = [], [], [], 0
            server.reset()
            for _ in range(max(1, trials // size)):
                clock.reset()
                start = time.perf_counter()
                got = _serve_once(queue, store, results, size)
                if not got:
                    break
                times.append((time.perf_counter() - start) / len(got))
                taken += len(got)
                n, s = clock.reset()
                statements.append(n / len(got))
                db_ms.append(1e3 * s / len(got))
            if times:
                out[f"ms per trial, {label}, {depth} jobs waiting"] = 1e3 * statistics.median(times)
                out[f"of which in statements, {label}, {depth} jobs waiting"] = statistics.median(db_ms)
                out[f"statements per trial, {label}, {depth} jobs waiting"] = statistics.median(statements)
                for k, v in per_trial(server.read(), taken).items():
                    out[f"{k}, {label}, {depth} jobs waiting"] = v
        out[f"farm jobs list s, {depth} jobs waiting"] = jobs_list_s(store.url)
        print({k: _round(v) for k, v in out.items() if k.endswith(f" {depth} jobs waiting")}, flush=True)
    clock.close()
    server.close()
    return out


def _round(v: Any) -> Any:
    return round(v, 3) if isinstance(v, float) else v


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks queue-scale", description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="1/64", help="the store's size, a fraction of the team's year")
    ap.add_argument("--url", default=None, help="an existing store instead of a new one grown to --size")
    ap.add_argument("--depths", default=",".join(map(str, DEPTHS)), help="jobs waiting, comma-separated")
    ap.add_argument("--trials", type=int, default=200, help="trials timed per depth (0: no store part)")
    ap.add_argument("--batch", type=int, default=32, help="trials claimed at once in the batched timing")
    ap.add_argument("--ray-trials", type=int, default=0, help="trials of the job the ray part serves")
    ap.add_argument("--workers", type=int, default=64, help="logical workers of the ray part's cluster")
    ap.add_argument("--ray-budget-s", type=float, default=1200.0, help="the ray part stops after this")
    opts = ap.parse_args(list(argv or []))
    if opts.url:
        from jobs.store import Store

        store = Store(opts.url)
    else:
        store = pg_store(opts.size)
    out: dict[str, Any] = {"size": opts.size}
    if opts.trials:
        out["store"] = store_part(
            store, tuple(int(d) for d in opts.depths.split(",")), opts.trials, opts.batch
        )
    if opts.ray_trials:
        from benchmarks.queue_scale_ray import ray_part

        out["ray"] = ray_part(store, opts.ray_trials, opts.workers, opts.ray_budget_s)
    store.close()
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
