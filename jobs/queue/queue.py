"""The queue on the results store's queue tables (jobs.store.tables.queue): submit, take the next trial,
cancel, finish, and what `farm jobs list` shows of it.

Order: the job of highest priority that has a pending trial nobody has taken goes first; among jobs of
equal priority, the one with the fewest trials taken right now (so equal jobs share the workers trial by
trial), then the one submitted first. Inside a job, trials go in grid order. Every step is a statement
on the store, so several pools, or several submitters, can use one store at once (PostgreSQL for a team):
a trial is taken by inserting its claim (the claim's key is the trial), and written once (the store's
pending -> finished rule).
"""

from __future__ import annotations

import getpass
import os
import socket
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, exists, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from cluster.shipping import PackedSource
from jobs.spec.sweep import SweepSpec, dump_spec
from jobs.store import PENDING, Job, JobEvent, KernelSource, Pool, QueuedJob, Store, TrialClaim, TrialRow, now

WAITING = ("queued", "running")  # the statuses of a job the pool serves
POOL_STALE_S = 30.0  # a pool not seen for this long is gone: its claims are void


@dataclass(frozen=True)
class Claimed:
    trial: TrialRow
    job: Job
    source_digest: str | None = None  # the kernels/ shipped with the job (None: the pool's own)


@dataclass(frozen=True)
class QueueLine:
    """A queued or running job as `farm jobs list` shows it."""

    job: Job
    priority: int
    owner: str
    place: int | None  # 1: served first; None: running (its trials are being taken)
    total: int
    finished: int
    taken: int  # trials running now
    eta_s: float | None  # at the pace of its finished trials, with the workers it has now


def default_owner() -> str:
    """The submitting user's login name."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no name for this uid (a container)
        return f"uid {os.getuid()}"


class Queue:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.engine = store.engine

    # ---- submitting --------------------------------------------------------------------------------
    def submit(
        self,
        spec: SweepSpec,
        *,
        priority: int = 0,
        owner: str | None = None,
        source: str | None = None,
        packed: PackedSource | None = None,
        notify: str | None = None,
    ) -> int:
        """Create the job (every trial pending) and put it in the queue; returns its id at once. `packed`:
        the kernels/ its trials run on (stored once per content); None: the pool's own."""
        if packed is not None:
            self._keep_source(packed)
        job_id = self.store.create_job(
            name=spec.name, family=spec.family, spec_yaml=dump_spec(spec),
            spec_hash=spec.spec_hash(), trials=spec.iter_trials(), git_commit=source,
        )  # fmt: skip
        with Session(self.engine) as s, s.begin():
            who = owner or default_owner()
            s.add(
                QueuedJob(
                    job_id=job_id,
                    priority=priority,
                    owner=who,
                    source=source,
                    notify=notify or spec.notify,
                    source_digest=packed.digest if packed is not None else None,
                )  # fmt: skip
            )
            s.add(JobEvent(job_id=job_id, line=f"queued by {who} at priority {priority}"))
            s.execute(update(Job).where(Job.id == job_id).values(status="queued"))
        return job_id

    def _keep_source(self, packed: PackedSource) -> None:
        if self.source_archive(packed.digest) is not None:
            return
        try:
            with Session(self.engine) as s, s.begin():
                s.add(KernelSource(digest=packed.digest, archive=packed.archive, files=packed.files))
        except IntegrityError:  # another submitter stored the same content first
            pass

    def source_archive(self, digest: str) -> bytes | None:
        """The packed kernels/ of that digest, or None when the store has none."""
        with Session(self.engine) as s:
            return s.scalar(select(KernelSource.archive).where(KernelSource.digest == digest))

    # ---- taking trials -----------------------------------------------------------------------------
    def claim(self, pool: str) -> Claimed | None:
        """Take the next trial for `pool` (see the module docstring for the order), or None when no job
        has a pending trial nobody has taken."""
        for _ in range(8):  # another pool took the trial between the read and the insert: look again
            try:
                with Session(self.engine, expire_on_commit=False) as s, s.begin():
                    found = s.execute(_next_trial()).first()
                    if found is None:
                        return None
                    trial, job, digest = found
                    s.execute(insert(TrialClaim).values(trial_id=trial.id, job_id=job.id, pool=pool))
                    if job.status == "queued":
                        s.execute(
                            update(Job)
                            .where(Job.id == job.id, Job.status == "queued")
                            .values(status="running", started_at=func.coalesce(Job.started_at, now()))
                        )
            except IntegrityError:
                continue
            return Claimed(trial, job, digest)
        return None

    def release(self, trial_ids: list[int]) -> None:
        """Give back trials a pool took and did not finish (a cancelled job's, a stopping pool's)."""
        if trial_ids:
            with self.engine.begin() as conn:
                conn.execute(delete(TrialClaim).where(TrialClaim.trial_id.in_(trial_ids)))

    # ---- what happened ------------------------------------------------------------------------------
    def log(self, job_id: int, line: str) -> None:
        with Session(self.engine) as s, s.begin():
            s.add(JobEvent(job_id=job_id, line=line))

    def events(self, job_id: int, after: int = 0) -> list[JobEvent]:
        """The job's lines after the one of id `after`, oldest first."""
        q = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after).order_by(JobEvent.id)
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(q))

    def entry(self, job_id: int) -> QueuedJob | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(QueuedJob, job_id)

    # ---- pools -------------------------------------------------------------------------------------
    def register_pool(self, pool: str, workers: int) -> None:
        with Session(self.engine) as s, s.begin():
            s.add(Pool(id=pool, host=socket.gethostname(), workers=workers))

    def beat(self, pool: str) -> None:
        """The pool is alive; claims of pools gone quiet are voided (their trials are taken again)."""
        stale = now() - timedelta(seconds=POOL_STALE_S)
        with self.engine.begin() as conn:
            conn.execute(update(Pool).where(Pool.id == pool).values(seen_at=now()))
            gone = select(Pool.id).where(Pool.seen_at < stale)
            conn.execute(delete(TrialClaim).where(TrialClaim.pool.in_(gone)))
            conn.execute(delete(Pool).where(Pool.seen_at < stale))

    def unregister_pool(self, pool: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(delete(TrialClaim).where(TrialClaim.pool == pool))
            conn.execute(delete(Pool).where(Pool.id == pool))

    def alive_pools(self) -> list[Pool]:
        stale = now() - timedelta(seconds=POOL_STALE_S)
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(Pool).where(Pool.seen_at >= stale)))

    # ---- cancelling and finishing ------------------------------------------------------------------
    def cancel(self, job_id: int) -> str:
        """Cancel a queued or running job: it leaves the queue (a pool stops its running trials within a
        tick), its finished results stay. Returns the status it had."""
        with Session(self.engine) as s, s.begin():
            job = s.get(Job, job_id)
            if job is None:
                raise LookupError(job_id)
            before = job.status
            if before in WAITING:
                job.status, job.finished_at = "cancelled", now()
                job.message = f"cancelled ({s.scalar(_count(job_id, PENDING))} trials not run)"
                s.add(JobEvent(job_id=job_id, line=job.message))
        return before

    def cancelled(self, job_ids: set[int]) -> set[int]:
        if not job_ids:
            return set()
        q = select(Job.id).where(Job.id.in_(job_ids), Job.status == "cancelled")
        with self.engine.connect() as conn:
            return set(conn.scalars(q))

    def finish(self, job_ids: set[int]) -> list[int]:
        """Mark the running jobs among `job_ids` that have no pending trial left completed, and drop the
        claims of finished trials. Returns the jobs finished now."""
        done: list[int] = []
        with Session(self.engine) as s, s.begin():
            # the claims of trials written since (a join over the few claims, not a scan of every trial)
            written = (
                select(TrialClaim.trial_id)
                .join(TrialRow, TrialRow.id == TrialClaim.trial_id)
                .where(TrialRow.status != PENDING)
            )
            s.execute(delete(TrialClaim).where(TrialClaim.trial_id.in_(written)))
            for job_id in sorted(job_ids):
                if s.scalar(_count(job_id, PENDING)) == 0:
                    changed = s.execute(
                        update(Job)
                        .where(Job.id == job_id, Job.status.in_(WAITING))
                        .values(status="completed", finished_at=now())
                    ).rowcount
                    if changed:
                        done.append(job_id)
                        s.add(JobEvent(job_id=job_id, line="completed"))  # with the status: one commit
        return done

    # ---- what farm jobs list shows -----------------------------------------------------------------
    def lines(self) -> list[QueueLine]:
        """Queued and running jobs in the order they are served, with progress and an ETA."""
        with Session(self.engine, expire_on_commit=False) as s:
            rows = s.execute(
                select(Job, QueuedJob)
                .join(QueuedJob, QueuedJob.job_id == Job.id)
                .where(Job.status.in_(WAITING))
                .order_by(QueuedJob.priority.desc(), QueuedJob.submitted_at, Job.id)
            ).all()
            out, place = [], 0
            for job, q in rows:
                total = s.scalar(select(func.count()).where(TrialRow.job_id == job.id)) or 0
                left = s.scalar(_count(job.id, PENDING)) or 0
                taken = s.scalar(_running(job.id)) or 0
                if taken == 0:
                    place += 1
                out.append(
                    QueueLine(job, q.priority, q.owner, None if taken else place, total, total - left,
                              taken, _eta(s, job, left, taken))
                )  # fmt: skip
            return out


def _running(job_id: int):
    """Trials of the job taken by a pool and not yet written."""
    return (
        select(func.count())
        .select_from(TrialClaim)
        .join(TrialRow, TrialRow.id == TrialClaim.trial_id)
        .where(TrialClaim.job_id == job_id, TrialRow.status == PENDING)
    )


def _count(job_id: int, status: str):
    return select(func.count()).where(TrialRow.job_id == job_id, TrialRow.status == status)


def _next_trial():
    """The next trial to take, with its job (see the module docstring)."""
    claimed = exists().where(TrialClaim.trial_id == TrialRow.id)
    taken = (  # trials of each job taken and not yet written
        select(TrialClaim.job_id, func.count().label("n"))
        .join(TrialRow, TrialRow.id == TrialClaim.trial_id)
        .where(TrialRow.status == PENDING)
        .group_by(TrialClaim.job_id)
        .subquery("taken")
    )
    has_work = exists().where(TrialRow.job_id == QueuedJob.job_id, TrialRow.status == PENDING, ~claimed)
    job = (
        select(QueuedJob.job_id)
        .join(Job, Job.id == QueuedJob.job_id)
        .outerjoin(taken, taken.c.job_id == QueuedJob.job_id)
        .where(Job.status.in_(WAITING), has_work)
        .order_by(
            QueuedJob.priority.desc(), func.coalesce(taken.c.n, 0), QueuedJob.submitted_at, QueuedJob.job_id
        )
        .limit(1)
        .scalar_subquery()
    )
    return (
        select(TrialRow, Job, QueuedJob.source_digest)
        .join(Job, Job.id == TrialRow.job_id)
        .join(QueuedJob, QueuedJob.job_id == Job.id)
        .where(TrialRow.job_id == job, TrialRow.status == PENDING, ~claimed)
        .order_by(TrialRow.seq)
        .limit(1)
    )


def _eta(s: Session, job: Job, left: int, taken: int) -> float | None:
    """Seconds to the end at the pace of the job's finished trials, with as many at once as run now."""
    if not left:
        return 0.0
    first, last, n = s.execute(
        select(func.min(TrialRow.started_at), func.max(TrialRow.finished_at), func.count()).where(
            TrialRow.job_id == job.id, TrialRow.status != PENDING, TrialRow.started_at.is_not(None)
        )
    ).one()
    if not n or first is None or last is None or not taken:
        return None
    per_trial = max((last - first).total_seconds(), 0.0) / n
    return per_trial * left / taken
