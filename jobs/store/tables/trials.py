"""A job, its trials (one row per grid point, created pending, updated once with its result), their raw
timing samples and the environments they ran in (deduplicated by fingerprint)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from jobs.store.tables.base import PENDING, Base, now
from kernels.base import Summary


def _canonical(value: Any) -> Any:
    """A shape value as the key hashes it: an integral float is its int (64.0 and 64 are one point, as
    Python's == has them)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def shape_key(shape: Mapping[str, Any]) -> str:
    """The stored, indexed key of a trial's shape (`trials.shape_key`): what `farm history` of one point
    finds its trials by, across every job, without reading any other shape's."""
    canonical = {str(k): _canonical(v) for k, v in shape.items()}
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(64))
    spec: Mapped[str] = mapped_column(Text)  # the spec as validated, YAML
    spec_hash: Mapped[str] = mapped_column(String(32), index=True)
    # created running completed ...; indexed: the queue reads its waiting jobs (migration 0011)
    status: Mapped[str] = mapped_column(String(16), default="created", index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    git_commit: Mapped[str | None] = mapped_column(String(64))
    cluster: Mapped[dict | None] = mapped_column(JSON)  # address, nodes, workers, mode (gpu or cpu)
    message: Mapped[str | None] = mapped_column(Text)


class Environment(Base):
    __tablename__ = "environments"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(32), unique=True)
    host: Mapped[str] = mapped_column(String(255))
    device_kind: Mapped[str] = mapped_column(String(8))  # "gpu" or "cpu"
    device_name: Mapped[str] = mapped_column(String(255))  # GPU model, or CPU model
    data: Mapped[dict] = mapped_column(JSON)  # versions, driver, CUDA, clocks, counts


class TrialRow(Base):
    """A trial of a job as stored: its grid point, then its result (the point: jobs.spec.sweep.TrialSpec)."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("job_id", "key", name="uq_trial_job_key"),
        # one point's series across jobs (jobs.history.series): family, backend, then the shape's key
        Index("ix_trials_series", "family", "backend", "shape_key"),
        # a job's trials of a status in grid order (migration 0011): the first pending trial a pool
        # claims, a job's pending and status counts (jobs.queue.queue, `farm jobs list`)
        Index("ix_trials_job_status_seq", "job_id", "status", "seq"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # no index of its own: uq_trial_job_key and ix_trials_job_status_seq lead with it (migration 0011)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    key: Mapped[str] = mapped_column(String(32))
    seq: Mapped[int] = mapped_column(Integer)  # position in the expanded grid
    family: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(64))
    baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    shape: Mapped[dict] = mapped_column(JSON)
    shape_key: Mapped[str | None] = mapped_column(String(32))  # shape_key(shape), set when created
    config: Mapped[dict] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(32))
    # no index of its own: every read by status names the job too (ix_trials_job_status_seq, 0011)
    status: Mapped[str] = mapped_column(String(16), default=PENDING)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str | None] = mapped_column(String(255))
    worker: Mapped[str | None] = mapped_column(String(64))
    gpu_id: Mapped[str | None] = mapped_column(String(32))
    gpu_type: Mapped[str | None] = mapped_column(String(64))  # the node's accelerator type (migration 0008)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    started_at: Mapped[datetime | None] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)
    error: Mapped[str | None] = mapped_column(Text)
    median_ns: Mapped[float | None] = mapped_column(Float)
    summary: Mapped[dict | None] = mapped_column(JSON)
    stop_reason: Mapped[str | None] = mapped_column(String(32))
    timer: Mapped[str | None] = mapped_column(String(32))
    correct: Mapped[bool | None] = mapped_column(Boolean)
    correctness: Mapped[dict | None] = mapped_column(JSON)
    metrics: Mapped[dict | None] = mapped_column(JSON)
    memory: Mapped[dict | None] = mapped_column(JSON)
    resources: Mapped[dict | None] = mapped_column(JSON)

    @property
    def stats(self) -> Summary:
        """The measurement summary, typed (kernels.base.Summary.from_stored): what every reader uses
        instead of the stored dict."""
        return Summary.from_stored(self.summary)


class Sample(Base):
    """A trial's raw samples, one array per trial (jobs.store.sample_codec: int64, zlib when it pays)."""

    __tablename__ = "samples"
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    n: Mapped[int] = mapped_column(Integer)  # how many samples
    codec: Mapped[str] = mapped_column(String(8))
    data: Mapped[bytes] = mapped_column(LargeBinary)
