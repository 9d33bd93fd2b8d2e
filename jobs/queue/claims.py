"""The queue's statements on the store, each a bounded read on an index (issue 46: a pool's claims and
`farm jobs list` stay flat as the queue and the store grow; their PostgreSQL plans are checked in
tests/jobs/test_query_plans.py):

- `waiting_jobs`: every queued or running job (jobs.status, indexed) with its trials running (its claims
  on pending trials) and waiting (pending, not claimed: counted up to a cap, on trials (job_id, status,
  seq)), in one statement;
- `claim_first`: each picked job's first `n` waiting trials in grid order, read along (job_id, status,
  seq), and claimed. On PostgreSQL one statement for every job of a batch locks them (rows a concurrent
  claim holds skipped: FOR UPDATE SKIP LOCKED, two pools claiming at once take different trials instead
  of colliding on one and trying again), inserts their claims and returns them; on SQLite (one writer at
  a time) a read per job and one insert. The job's row comes without its spec (a 10^5-trial grid's is
  over 1 MB: read with each of a batch's rows it was 70% of a 64-worker pool's time in the store);
  `Queue.spec` reads it;
- `claimed_status`: a claim's trial's status, probed by the trial's id for each of the few claims;
- `TrialCounts`: each listed job's trials by status, counted once for `farm jobs list` (one grouped
  statement on (job_id, status, seq) for the jobs not counted yet) and given to its three users: the
  jobs table, the fair-share plan's waiting trials (pending less running) and the progress column;
- `progress`: every listed job's trial count (from the counts) and, for the jobs with trials running
  (the ETA's only users), the mean duration of their newest written trials, a bounded read of each
  (job, status) on (job_id, status, seq), one statement for all of them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Integer, column, exists, func, insert, literal, select, true, union_all, values
from sqlalchemy.orm import Session, defer

from jobs.store import PENDING, Job, QueuedJob, TrialClaim, TrialRow, status_counts

WAITING = ("queued", "running")  # the statuses of a job the pool serves


@dataclass(frozen=True)
class Waiting:
    """A queued or running job as the queue's order reads it."""

    entry: QueuedJob
    running: int  # trials claimed and not yet written
    waiting: int  # pending trials nobody has claimed (up to the cap it was read with)


def claimed_status():
    """The status of a claim's trial, looked up by its id for each claim (a subquery PostgreSQL runs per
    row): as a join, PostgreSQL merged the few claims with `trials` in id order, walking the primary
    key from the store's first trial to the claims' (24 ms a pool's turn at 1/64 of a year with a
    10^5-trial job under way, growing with the store and the job's trials written)."""
    return select(TrialRow.status).where(TrialRow.id == TrialClaim.trial_id).scalar_subquery()


def _unclaimed():
    return ~exists().where(TrialClaim.trial_id == TrialRow.id)


class TrialCounts:
    """Each job's trials by status, counted once however many readers a listing has: `of` counts the
    jobs not counted yet in one grouped statement (on (job_id, status, seq)); `known`: counts already
    read (`farm jobs list`'s table's)."""

    def __init__(self, known: Mapping[int, Mapping[str, int]] | None = None) -> None:
        self.by_job: dict[int, Mapping[str, int]] = dict(known or {})

    def of(self, s: Session, job_ids: Collection[int]) -> dict[int, Mapping[str, int]]:
        missing = sorted(set(job_ids) - self.by_job.keys())
        if missing:
            found = status_counts(s, missing)
            self.by_job.update({job_id: found.get(job_id, {}) for job_id in missing})
        return {job_id: self.by_job[job_id] for job_id in job_ids}


def waiting_jobs(s: Session, cap: int | None, counts: TrialCounts | None = None) -> list[Waiting]:
    """The queued and running jobs, each with its trials running and waiting; `cap`: count a job's
    waiting trials only up to this many (None: all of them, what a queued-trials quota needs);
    `counts`: take each job's waiting trials as its pending ones less those running, from these counts
    (`farm jobs list`: the trials counted once for the listing), not counted here."""
    running = (
        select(func.count())
        .select_from(TrialClaim)
        .where(TrialClaim.job_id == QueuedJob.job_id, claimed_status() == PENDING)
        .scalar_subquery()
    )
    listed = select(QueuedJob, running).join(Job, Job.id == QueuedJob.job_id).where(Job.status.in_(WAITING))
    if counts is not None:
        rows = s.execute(listed.order_by(QueuedJob.job_id)).all()
        by_job = counts.of(s, [entry.job_id for entry, _r in rows])
        pending = {job_id: c.get(PENDING, 0) for job_id, c in by_job.items()}
        return [Waiting(e, int(r), max(pending[e.job_id] - int(r), 0)) for e, r in rows]
    mine = select(TrialRow.id).where(TrialRow.job_id == QueuedJob.job_id, TrialRow.status == PENDING)
    mine = mine.where(_unclaimed()).correlate(QueuedJob)
    if cap is not None:
        mine = mine.limit(cap)
    waiting = select(func.count()).select_from(mine.subquery()).scalar_subquery()
    q = listed.add_columns(waiting).order_by(QueuedJob.job_id)
    return [Waiting(entry, int(r), int(w)) for entry, r, w in s.execute(q).all()]


def claim_first(
    s: Session, wanted: Mapping[int, int], pool: str, at: datetime
) -> dict[int, list[tuple[TrialRow, Job, str | None]]]:
    """Claim each wanted job's first `n` pending trials in grid order that no pool has claimed (job ->
    n), for `pool`: job -> its trials claimed, each with its job (without the spec) and its shipped
    kernel source's digest, in grid order."""
    out: dict[int, list[tuple[TrialRow, Job, str | None]]] = {job_id: [] for job_id in wanted}
    if not wanted:
        return out
    rows = (
        select(TrialRow, Job, QueuedJob.source_digest)
        .join(Job, Job.id == TrialRow.job_id)
        .join(QueuedJob, QueuedJob.job_id == TrialRow.job_id)
        .options(defer(Job.spec))
        .order_by(TrialRow.seq)
    )
    columns = ["trial_id", "job_id", "pool", "claimed_at"]
    if s.get_bind().dialect.name == "postgresql":  # lock, claim and read them all in one statement
        jobs = values(column("job_id", Integer), column("n", Integer), name="wanted")
        jobs = jobs.data(sorted(wanted.items()))
        first = (
            select(TrialRow.id, TrialRow.job_id)
            .where(*_waiting(jobs.c.job_id))
            .order_by(TrialRow.seq)
            .limit(jobs.c.n)
            .with_for_update(of=TrialRow, skip_locked=True)
            .lateral("first")
        )
        picked = select(first.c.id, first.c.job_id).select_from(jobs).join(first, true()).cte("picked")
        claims = select(picked.c.id, picked.c.job_id, literal(pool), literal(at))
        claimed = insert(TrialClaim).from_select(columns, claims).returning(TrialClaim.trial_id)
        ids = select(claimed.cte("claimed").c.trial_id)
        for t, j, d in s.execute(rows.where(TrialRow.id.in_(ids))):
            out[t.job_id].append((t, j, d))
        return out
    for job_id, n in wanted.items():  # SQLite: one writer at a time
        out[job_id] = [(t, j, d) for t, j, d in s.execute(rows.where(*_waiting(job_id)).limit(n))]
    new_claims = [
        {"trial_id": t.id, "job_id": t.job_id, "pool": pool, "claimed_at": at}
        for found in out.values()
        for t, _, _ in found
    ]
    if new_claims:  # one statement for all of them; a concurrent claim of one fails it (IntegrityError)
        s.execute(insert(TrialClaim).values(new_claims))
    return out


def _waiting(job_id):
    """A job's pending trials that no pool has claimed (`job_id`: a value or a column)."""
    return (TrialRow.job_id == job_id, TrialRow.status == PENDING, _unclaimed())


PACE_SAMPLE = 64  # the newest written trials of each (job, status) a running job's pace is read from


@dataclass(frozen=True)
class Progress:
    total: int  # trials of the job
    timed: int  # written trials that had started and finished among the newest read (the pace's sample)
    mean_s: float | None  # their mean duration

    def eta_s(self, left: int, taken: int) -> float | None:
        """Seconds to the end: the trials `left` at the mean duration of the sampled ones, `taken` (as many
        as run now) at a time."""
        if not left:
            return 0.0
        if not self.timed or self.mean_s is None or not taken:
            return None
        return self.mean_s * left / taken


def progress(
    s: Session, counts: Mapping[int, Mapping[str, int]], running: Collection[int]
) -> dict[int, Progress]:
    """Each job's progress: its trial count from `counts` (its trials by status) and, for the jobs with
    trials `running` (an ETA needs some), the pace of their newest written trials: for each status other
    than pending that the counts saw, the last PACE_SAMPLE trials in grid order (the pool claims in grid
    order: the last written), each read backwards on (job_id, status, seq) and stopped there, all in one
    statement. The read is bounded whatever the size of the job (the sum over all of a 10^5-trial job's
    written trials grew with it); a job without trials is left out."""
    out = {job_id: Progress(sum(c.values()), 0, None) for job_id, c in counts.items() if c}
    parts = [
        select(TrialRow.job_id, TrialRow.seq, TrialRow.started_at, TrialRow.finished_at)
        .where(TrialRow.job_id == job_id, TrialRow.status == status)
        .order_by(TrialRow.seq.desc())
        .limit(PACE_SAMPLE)
        .subquery()
        for job_id in sorted(j for j in running if j in out)
        for status in sorted(st for st in counts[job_id] if st != PENDING)
    ]
    if not parts:
        return out
    newest: dict[int, list[tuple[int, float]]] = {}
    for job_id, seq, started, finished in s.execute(union_all(*(select(*p.c) for p in parts))).all():
        if started is not None and finished is not None:
            newest.setdefault(job_id, []).append((seq, max((finished - started).total_seconds(), 0.0)))
    for job_id, timed in newest.items():
        sample = [d for _seq, d in sorted(timed, reverse=True)[:PACE_SAMPLE]]
        out[job_id] = Progress(out[job_id].total, len(sample), sum(sample) / len(sample))
    return out
