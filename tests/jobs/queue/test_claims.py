"""`Queue.claim_many` (issue 46): n trials taken in one transaction are the trials n claims one after
another take, in the same order; several takers at once, each taking batches (SQLite, and PostgreSQL where
a batch's rows are read FOR UPDATE SKIP LOCKED), take every trial exactly once; each trial's "taken" line
is in its job's log when asked for."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

from sqlalchemy import event
from test_queue import spec

from jobs.queue.queue import Queue
from jobs.spec.sweep import loads_spec
from jobs.store import Store


def _sent(q: Queue, call: Callable[[], object]) -> tuple[object, list[str]]:
    """What `call` returns, and the statements it sent to the queue's database."""
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):  # noqa: ARG001
        sent.append(statement)

    event.listen(q.engine, "before_cursor_execute", record)
    try:
        return call(), sent
    finally:
        event.remove(q.engine, "before_cursor_execute", record)


def _queue(url: str) -> Queue:
    q = Queue(Store(url))
    q.submit(spec("low", 4), priority=0, owner="ana")
    for i in range(3):
        q.submit(spec(f"ci{i}", 3), priority=5, owner="ci")
    q.submit(spec("bo", 5), priority=5, owner="bo")
    return q


def test_a_batch_takes_what_as_many_claims_one_after_another_take(tmp_path):
    one = _queue(str(tmp_path / "one.db"))
    batch = _queue(str(tmp_path / "batch.db"))
    singles = [one.claim("p") for _ in range(12)]
    taken = batch.claim_many("p", None, 12)
    assert [(c.job.id, c.trial.seq, c.owner) for c in taken] == [
        (c.job.id, c.trial.seq, c.owner) for c in singles
    ]
    rest = batch.claim_many("p", None, 100)  # what is left: fewer than asked
    assert len(rest) == 4 + 9 + 5 - 12
    assert batch.claim_many("p", None, 5) == []
    assert {c.trial.id for c in taken} | {c.trial.id for c in rest} == {
        t.id for job in range(1, 6) for t in batch.store.trials(job)
    }


def test_takers_at_once_taking_batches_take_every_trial_once(store_url):
    setup = Store(store_url)
    q = Queue(setup)
    jobs = [q.submit(spec(f"j{i}", 40), owner=f"o{i % 2}") for i in range(3)]
    got: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def take(i: int) -> None:
        mine = Queue(Store(store_url))
        start.wait()
        while batch := mine.claim_many(f"pool-{i}", None, 7):
            got[i] += [c.trial.id for c in batch]
        mine.store.close()

    threads = [threading.Thread(target=take, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [t for mine in got for t in mine]
    assert sorted(every) == sorted(t.id for job in jobs for t in setup.trials(job))  # each exactly once
    setup.close()


def test_each_trial_taken_in_a_logged_batch_has_its_line(tmp_path):
    q = _queue(str(tmp_path / "farm.db"))
    taken = q.claim_many("pool-x", None, 3, logged=True)
    for c in taken:
        assert f"trial #{c.trial.seq} taken by pool-x" in [e.line for e in q.events(c.job.id)]
    assert [e.line for e in q.events(1)] == ["queued by ana at priority 0"]  # not taken: no line


def test_a_claim_reads_its_job_without_the_spec_and_queue_spec_gives_it(store_url):
    """A 10^5-trial grid's spec is over 1 MB: read with each trial of a batch it was most of a pool's
    time in the store (issue 46). The claim reads the job's row without it; `Queue.spec` reads it."""
    q = Queue(Store(store_url))
    job = q.submit(spec("wide", 300))
    taken, sent = _sent(q, lambda: q.claim_many("p", None, 20))
    assert [c.trial.seq for c in taken] == list(range(20))
    assert [s for s in sent if re.search(r"\bjobs\.spec\b", s)] == []  # spec_hash is read, not spec
    assert loads_spec(q.spec(job)).name == "wide"
    q.store.close()


def test_a_batch_over_several_jobs_on_postgresql_is_claimed_in_one_statement(postgres):
    """The picks of a batch spread over jobs by fair share: their trials are locked, claimed and read in
    one statement (not one per job), and they are the trials claims one after another take."""
    one = _queue(postgres.url(postgres.create_database("one")))
    batch = _queue(postgres.url(postgres.create_database("batch")))
    singles = [one.claim("p") for _ in range(12)]
    taken, sent = _sent(batch, lambda: batch.claim_many("p", None, 12))
    assert [(c.job.id, c.trial.seq, c.owner) for c in taken] == [
        (c.job.id, c.trial.seq, c.owner) for c in singles
    ]
    assert len({c.job.id for c in taken}) > 1
    assert len([s for s in sent if "INSERT INTO trial_claims" in s]) == 1
    assert len([s for s in sent if "FOR UPDATE" in s]) == 1
    one.store.close()
    batch.store.close()


def test_the_eta_is_the_newest_written_trials_mean_duration_over_the_trials_running(tmp_path):
    """`farm jobs list`'s ETA: the trials left (pending, running among them) at the mean duration of the
    job's newest written trials, as many at once as run now. Two workers ran the first 94 trials two at a
    time: 30 slow ones (100 s) then 64 of 10 s; the pace is the last 64's (10 s), not the whole job's, and
    not the wall span over the trials written (the ETA read 1/workers of the time before), and the read
    stops at the newest PACE_SAMPLE of each status."""
    from datetime import datetime, timedelta

    from sqlalchemy import text

    from jobs.queue.claims import PACE_SAMPLE

    assert PACE_SAMPLE == 64  # the case below is built on it
    store = Store(str(tmp_path / "eta.db"))
    q = Queue(store)
    job = q.submit(spec("eta", 100), owner="ana")
    t0, rows = datetime(2026, 12, 7, 12, 0), []
    for seq in range(94):
        slow = seq < 30
        start = t0 + timedelta(seconds=100 * (min(seq, 30) // 2) + 10 * (max(seq - 30, 0) // 2))
        rows.append({"j": job, "seq": seq, "s": start, "f": start + timedelta(seconds=100 if slow else 10)})
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE trials SET status = 'ok', started_at = :s, finished_at = :f "
                 "WHERE job_id = :j AND seq = :seq"),
            rows,
        )  # fmt: skip
    q.claim_many("p", None, 2)
    (line,) = q.lines()
    assert (line.total, line.finished, line.taken) == (100, 94, 2)
    assert line.eta_s == 10 * 6 / 2  # 6 left (2 of them running), 2 at a time, 10 s each
    store.close()
