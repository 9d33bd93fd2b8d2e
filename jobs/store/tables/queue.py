"""The queue's tables in the results store (migrations 0003, 0005, 0008): which jobs wait for the pool, at
what priority, for whom and whom to tell, on which shipped kernel source; which pending trials a pool has
taken; what happened to each job; which pools are alive.

A trial stays `pending` until its result is written (so `farm sweep resume` and the store's own rule,
"a finished trial is never overwritten", hold as they are); a pool takes it by inserting its claim, whose
primary key is the trial: two pools (or two processes of one) can never take one trial. A claim of a
pool that stopped beating (jobs.queue.queue.POOL_STALE_S) is void, and its trial is taken again.
The queue's logic (jobs.queue) reads and writes these rows.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobs.store.tables.base import Base, now


class QueuedJob(Base):
    """A job submitted to the queue (`farm submit`). The job's own row keeps its status: queued, running,
    completed, cancelled."""

    __tablename__ = "job_queue"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, index=True)  # higher first
    owner: Mapped[str] = mapped_column(String(128))
    submitted_at: Mapped[datetime] = mapped_column(DateTime, default=now)
    source: Mapped[str | None] = mapped_column(String(128))  # commit, "+dirty:<hash of the diff>"
    notify: Mapped[str | None] = mapped_column(String(2048))  # webhook told the verdict (Slack-compatible)
    # the kernels/ it was submitted with (None: the pool's own, a job queued before migration 0005)
    source_digest: Mapped[str | None] = mapped_column(String(64))  # a kernel_sources.digest
    # migration 0008 (fair share): the project it is charged to (None: the pool policy's, else the owner's),
    # the GPU it needs (None: any), when it last got a worker (its wait ages from there)
    project: Mapped[str | None] = mapped_column(String(128))
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    min_gpu_memory_gb: Mapped[float | None] = mapped_column(Float)
    last_taken_at: Mapped[datetime | None] = mapped_column(DateTime)


class KernelSource(Base):
    """kernels/ as a submitter's tree had it, packed (jobs.run.source.pack_kernels); one row per content."""

    __tablename__ = "kernel_sources"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    archive: Mapped[bytes] = mapped_column(LargeBinary)
    files: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class TrialClaim(Base):
    """A pending trial a pool has taken and not yet finished."""

    __tablename__ = "trial_claims"
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pool: Mapped[str] = mapped_column(String(64), index=True)
    claimed_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class JobEvent(Base):
    """One line of what happened to a queued job (taken, finished, cancelled, completed): `farm jobs logs`."""

    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(DateTime, default=now)
    line: Mapped[str] = mapped_column(Text)


class Pool(Base):
    """A pool serving the queue (`farm pool serve`); it writes `seen_at` while it lives."""

    __tablename__ = "farm_pools"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    workers: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(DateTime, default=now)
    seen_at: Mapped[datetime] = mapped_column(DateTime, default=now)
    policy: Mapped[dict | None] = mapped_column(JSON)  # what it serves by (jobs.queue.fairshare.Policy), 0008


class OwnerUsage(Base):
    """An owner's past use of workers (worker-seconds), decayed to `at` with the pool policy's half-life:
    fair share remembers it across pool restarts (migration 0008)."""

    __tablename__ = "owner_usage"
    owner: Mapped[str] = mapped_column(String(128), primary_key=True)
    usage_s: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(DateTime, default=now)


class TrialPreemption(Base):
    """A running trial a pool stopped for a job that had more right to the worker; the trial went back to
    the queue with its attempt unchanged (migration 0008). `ran_s`: the worker time it lost."""

    __tablename__ = "trial_preemptions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    pool: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(DateTime, default=now)
    ran_s: Mapped[float] = mapped_column(Float)
