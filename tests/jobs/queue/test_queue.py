"""The queue in the store (jobs.queue.queue): the order trials are taken in, exactly once under many
takers at once (SQLite and PostgreSQL), cancel, finish, stale pools, and what `farm jobs list` shows."""

from __future__ import annotations

import threading
from datetime import timedelta

from sqlalchemy import event, update

from jobs.queue.queue import Queue
from jobs.run.source import kernels_source
from jobs.spec.sweep import loads_spec
from jobs.store import Pool, Store, now
from jobs.store.results import result_of

SPEC = """
name: {name}
family: probe
backends: [{{name: noop, baseline: true}}]
shapes: {{grid: {{n: {grid}}}}}
"""


def spec(name: str, n: int):
    return loads_spec(SPEC.format(name=name, grid=list(range(n))))


def test_higher_priority_first_equal_jobs_share_trial_by_trial_grid_order_inside(store):
    q = Queue(store)
    low = q.submit(spec("low", 3), priority=0, owner="ana")
    a = q.submit(spec("a", 3), priority=5, owner="ci")
    b = q.submit(spec("b", 3), priority=5, owner="ci")
    taken = [q.claim("p1") for _ in range(9)]
    assert q.claim("p1") is None  # everything is taken
    order = [(c.job.id, c.trial.seq) for c in taken]
    # a and b alternate (the one with fewer trials taken goes next), each in grid order; low waits
    assert order == [(a, 0), (b, 0), (a, 1), (b, 1), (a, 2), (b, 2), (low, 0), (low, 1), (low, 2)]
    assert store.get_job(low).status == "running" and store.get_job(a).started_at is not None


def test_every_trial_is_taken_exactly_once_by_takers_at_once(store_url):
    """Several pools (threads with stores of their own) take from one queue at once: each trial once."""
    setup = Store(store_url)
    q = Queue(setup)
    jobs = [q.submit(spec(f"j{i}", 30), priority=i % 2) for i in range(3)]
    got: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def take(i: int) -> None:
        mine = Queue(Store(store_url))
        start.wait()
        while (c := mine.claim(f"pool-{i}")) is not None:
            got[i].append(c.trial.id)
        mine.store.close()

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    taken = [tid for g in got for tid in g]
    every = [t.id for j in jobs for t in setup.trials(j)]
    assert sorted(taken) == sorted(every)  # none twice, none lost
    setup.close()


def test_a_cancelled_job_leaves_the_queue_and_keeps_its_results(store):
    q = Queue(store)
    job = q.submit(spec("c", 4))
    first = q.claim("p")
    store.record_results([result_of(first.trial.id, [5, 6, 7])])
    assert q.cancel(job) == "running"
    assert q.claim("p") is None  # nothing of a cancelled job is taken
    assert store.get_job(job).status == "cancelled" and "3 trials not run" in store.get_job(job).message
    assert store.status_counts(job) == {"ok": 1, "pending": 3}
    assert q.cancel(job) == "cancelled"  # a second cancel changes nothing
    assert q.lines() == []


def test_a_job_is_completed_when_its_last_trial_is_written(store):
    q = Queue(store)
    job = q.submit(spec("f", 2))
    claims = [q.claim("p"), q.claim("p")]
    store.record_results([result_of(claims[0].trial.id, [1, 2, 3])])
    assert q.finish({job}) == []
    store.record_results([result_of(claims[1].trial.id, [1, 2, 3])])
    assert q.finish({job}) == [job]
    assert store.get_job(job).status == "completed" and store.get_job(job).finished_at is not None


def test_a_pools_turn_finds_its_finished_and_cancelled_jobs_in_one_probe(store):
    """Queue.settle, a pool's turn: the jobs whose trials are all written completed, the cancelled ones
    named, read by one statement (the pool sent a cancel probe and a pending probe apart; issue 46)."""
    q = Queue(store)
    done, cancelled, running = (q.submit(spec(name, 2)) for name in ("done", "cancelled", "running"))
    taken = [q.claim("p") for _ in range(6)]
    store.record_results([result_of(c.trial.id, [1, 2, 3]) for c in taken if c.job.id == done])
    q.cancel(cancelled)
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        sent.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert q.settle({done, cancelled, running}, finish=False) == ([], {cancelled})
        assert len(sent) == 1
        assert q.settle({done, cancelled, running}) == ([done], {cancelled})
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    assert [s.split()[0] for s in sent[1:3]] == ["DELETE", "SELECT"]  # then the completion's writes
    assert store.get_job(done).status == "completed" and store.get_job(running).status == "running"
    assert q.finish({done, running}) == [] and q.cancelled({done, cancelled}) == {cancelled}


def test_the_trials_of_a_pool_that_went_quiet_are_taken_again(store):
    q = Queue(store)
    q.submit(spec("s", 2))
    q.register_pool("dead", 1)
    q.register_pool("live", 1)
    taken = q.claim("dead")
    with store.engine.begin() as conn:  # the dead pool last beat a minute ago
        conn.execute(update(Pool).where(Pool.id == "dead").values(seen_at=now() - timedelta(minutes=1)))
    q.beat("live")
    assert [p.id for p in q.alive_pools()] == ["live"]
    again = [q.claim("live"), q.claim("live")]
    assert taken.trial.id in {c.trial.id for c in again}


def test_the_queue_lines_show_place_progress_and_owner(store):
    q = Queue(store)
    a = q.submit(spec("a", 2), priority=1, owner="ana", source=kernels_source())
    b = q.submit(spec("b", 2), priority=9, owner="ci")
    lines = q.lines()
    assert [(line.job.id, line.place, line.owner) for line in lines] == [(b, 1, "ci"), (a, 2, "ana")]
    c = q.claim("p")
    store.record_results([result_of(c.trial.id, [1, 2, 3])])
    q.claim("p")
    first = q.lines()[0]
    assert (first.job.id, first.place, first.finished, first.total, first.taken) == (b, None, 1, 2, 1)
