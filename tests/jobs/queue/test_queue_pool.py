"""The pool (jobs.queue.pool) on the session's real local Ray: a job of higher priority submitted while a
sweep runs takes the next free workers; a job cancelled mid-run stops and keeps what it finished; every
trial runs once; `farm jobs wait` ends on the verdict."""

from __future__ import annotations

import threading
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from benchmarks.service_bench import SPEC  # `name` waiting `ms` per trial at `grid` shapes
from jobs.cli import main
from jobs.queue.pool import PoolOptions, serve
from jobs.queue.queue import Queue
from jobs.run.runner import RunOptions
from jobs.spec.sweep import loads_spec
from jobs.store import Store


def spec(name: str, n: int, ms: int = 20):
    return loads_spec(SPEC.format(name=name, grid=list(range(n)), ms=ms))


def pool_options(workers: int, observer=None) -> PoolOptions:
    run = RunOptions(
        gpus=workers, show_progress=False, echo=lambda _m: None, oversubscribe=True, observer=observer
    )
    return PoolOptions(run=run, idle_exit_s=0.5)


def test_a_higher_priority_job_takes_the_next_free_workers(ray_local, tmp_path):
    url = str(tmp_path / "farm.db")
    store = Store(url)
    low = Queue(store).submit(spec("low", 12), priority=0, owner="explorer")
    high: list[int] = []

    def observer(result, _worker) -> None:  # once the sweep runs, CI submits from another store handle
        if not high:
            high.append(Queue(Store(url)).submit(spec("ci", 4), priority=10, owner="ci"))

    done = serve(store, pool_options(2, observer))
    assert done == 2 and high
    trials = sorted(store.trials(low) + store.trials(high[0]), key=lambda t: t.started_at)
    assert all(t.status == "ok" for t in trials)
    order = [t.job_id for t in trials]
    first_ci = order.index(high[0])
    last_ci = len(order) - 1 - order[::-1].index(high[0])
    # once CI's job is queued, no more than the trials already taken by the two workers run before its own
    low_between = order[first_ci:last_ci].count(low)
    assert first_ci <= 1 + 2 and low_between <= 2, order
    assert store.get_job(low).status == store.get_job(high[0]).status == "completed"
    store.close()


def test_a_cancelled_job_stops_and_keeps_what_it_finished_and_another_goes_on(ray_local, tmp_path):
    url = str(tmp_path / "farm.db")
    store = Store(url)
    queue = Queue(store)
    doomed = queue.submit(spec("doomed", 10, ms=50), priority=5)
    other = queue.submit(spec("other", 3), priority=0)
    cancelled = threading.Event()

    def observer(result, _worker) -> None:
        if not cancelled.is_set():
            Queue(Store(url)).cancel(doomed)
            cancelled.set()

    serve(store, pool_options(2, observer))
    counts = store.status_counts(doomed)
    assert store.get_job(doomed).status == "cancelled"
    assert counts.get("ok", 0) <= 3 and counts["pending"] >= 7, counts  # at most the trials then in flight
    assert store.status_counts(other) == {"ok": 3} and store.get_job(other).status == "completed"
    # every finished trial has its samples once
    for t in store.trials(doomed) + store.trials(other):
        assert len(store.samples(t.id)) == (3 if t.status == "ok" else 0)
    store.close()


@pytest.mark.parametrize("cancel", [False, True])
def test_farm_jobs_wait_ends_on_the_verdict_with_a_junit_report(ray_local, tmp_path, cancel):
    url = str(tmp_path / "farm.db")
    store = Store(url)
    out = CliRunner().invoke(main, ["submit", "--db", url, "--priority", "3", _write(tmp_path, spec_text(2))])
    assert out.exit_code == 0, out.output
    job = int(out.output.split()[0])
    assert "no pool serves" in out.output
    if cancel:
        assert CliRunner().invoke(main, ["jobs", "cancel", str(job), "--db", url]).exit_code == 0
    else:
        serve(store, pool_options(2))
    junit = tmp_path / "report.xml"
    waited = CliRunner().invoke(main, ["jobs", "wait", str(job), "--db", url, "--junit", str(junit)])
    assert waited.exit_code == (130 if cancel else 0), waited.output
    suite = ET.parse(junit).getroot()
    assert suite.get("tests") == "2" and suite.get("failures") == ("2" if cancel else "0")
    store.close()


def spec_text(n: int) -> str:
    return SPEC.format(name="waited", grid=list(range(n)), ms=5)


def _write(tmp_path, text: str) -> str:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path)


class _Hook:
    """A webhook on 127.0.0.1 (a real HTTP server) that keeps what it is posted."""

    def __init__(self) -> None:
        import http.server
        import json

        got = self.got = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args) -> None:
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_the_verdict_goes_to_the_jobs_webhook_and_its_log_says_what_happened(ray_local, tmp_path):
    hook = _Hook()
    url = str(tmp_path / "farm.db")
    store = Store(url)
    text = SPEC.format(name="hooked", grid=[0, 1], ms=5) + f"notify: {hook.url}\n"
    job = Queue(store).submit(loads_spec(text), owner="ana")
    options = pool_options(2)
    serve(store, options)
    for thread in options.notified:
        thread.join(30)
    hook.close()
    (body,) = hook.got
    assert body["job"] == job and body["verdict"] == "passed" and body["counts"] == {"ok": 2}
    assert f"farm job {job} (hooked, probe): passed" in body["text"] and "farm report" in body["text"]
    logs = CliRunner().invoke(main, ["jobs", "logs", str(job), "--db", url, "--follow"])
    lines = [line.split(" ", 1)[1] for line in logs.output.splitlines()]
    assert lines[0] == "queued by ana at priority 0" and lines[-1] == "completed", lines
    assert sum("taken by pool-" in line for line in lines) == 2
    assert sum(" ok on w" in line and "median" in line for line in lines) == 2
    store.close()


def test_a_webhook_that_is_not_an_url_is_refused_before_anything_is_queued(tmp_path):
    path = _write(tmp_path, spec_text(1))
    out = CliRunner().invoke(
        main, ["submit", path, "--db", str(tmp_path / "f.db"), "--notify", "hooks.example"]
    )
    assert out.exit_code == 2 and "expected an http(s):// URL" in out.output
    bad = CliRunner().invoke(
        main, ["submit", _write(tmp_path, spec_text(1) + "notify: ftp://x\n"), "--db", str(tmp_path / "f.db")]
    )
    assert bad.exit_code == 2 and "notify" in bad.output


def test_the_seen_case_on_the_pool_the_second_owner_is_served_from_the_first_trials(ray_local, tmp_path):
    """Issue 47's case on a real pool: ana queued four 12-trial jobs, bo one, all at priority 0, before
    the pool started on 2 workers; in the order the pool took trials (its job log), bo's job is among
    the first two and keeps one of the two workers (the old order gave it none of the first 30)."""
    store = Store(str(tmp_path / "farm.db"))
    queue = Queue(store)
    ana = [queue.submit(spec(f"a{i}", 12, ms=5), owner="ana") for i in range(4)]
    bo = queue.submit(spec("b", 12, ms=5), owner="bo")
    assert serve(store, pool_options(2)) == 5
    taken = sorted((e.id, job) for job in [*ana, bo] for e in queue.events(job) if "taken by" in e.line)
    order = [job for _id, job in taken]
    assert len(order) == 60 and bo in order[:2], order
    assert order[:24].count(bo) >= 8, order  # one worker of two, whatever the two workers' pace
    assert all(t.status == "ok" for job in [*ana, bo] for t in store.trials(job))
    store.close()
