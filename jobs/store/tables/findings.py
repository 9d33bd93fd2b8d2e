"""What an acceptance run of a job found: its anomalies (one row per trial and kind) and its failed
assertions (the failure bank, kept across jobs by fingerprint); and what each `farm compare` found."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobs.store.tables.base import Base, now


class Anomaly(Base):
    __tablename__ = "anomalies"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    baseline_trial_id: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    severity: Mapped[str] = mapped_column(String(16))  # info | warning | error
    fingerprint: Mapped[str] = mapped_column(String(32), index=True)
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class Failure(Base):
    """The failure bank: a failed (or ambiguous-as-failed) card assertion of one acceptance run."""

    __tablename__ = "failures"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    trial_id: Mapped[int | None] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))
    card: Mapped[str] = mapped_column(String(200))
    assertion: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))  # fail | ambiguous
    fingerprint: Mapped[str] = mapped_column(String(32), index=True)
    label: Mapped[str] = mapped_column(String(500))
    message: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict] = mapped_column(JSON)
    git_commit: Mapped[str | None] = mapped_column(String(64))
    tag: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class Comparison(Base):
    """One `farm compare` run: jobs A and B (B None: two configs inside A), the selectors and thresholds,
    the count of each verdict, and what differed between the two jobs' environments
    (jobs.judge.environment's [component, before, after] lists)."""

    __tablename__ = "comparisons"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_a: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    job_b: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    selector_a: Mapped[str | None] = mapped_column(String(500))
    selector_b: Mapped[str | None] = mapped_column(String(500))
    min_effect: Mapped[float] = mapped_column(Float)
    alpha: Mapped[float] = mapped_column(Float)
    verdicts: Mapped[dict] = mapped_column(JSON)
    environment: Mapped[list] = mapped_column(JSON)
    ambiguous: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)
