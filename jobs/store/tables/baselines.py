"""The named baselines: which job a name points at, its points (one baseline trial per match key) and
every move of the name."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from jobs.store.tables.base import Base, now


class Baseline(Base):
    """A named reference job. `farm baseline set JOB --name NAME` moves the name to a newer job."""

    __tablename__ = "baselines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    family: Mapped[str] = mapped_column(String(64))
    git_commit: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class BaselineMove(Base):
    """Every setting of a named baseline, oldest first (`farm baseline list --history`): which job it was
    set to, from which job (None: the name was new), and whether `--force` moved it. Kept by name, so the
    history outlives the jobs it names."""

    __tablename__ = "baseline_history"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    job_id: Mapped[int] = mapped_column(Integer)
    previous_job_id: Mapped[int | None] = mapped_column(Integer)
    family: Mapped[str] = mapped_column(String(64))
    spec_name: Mapped[str] = mapped_column(String(200))
    git_commit: Mapped[str | None] = mapped_column(String(64))
    points: Mapped[int] = mapped_column(Integer)
    forced: Mapped[bool] = mapped_column(Boolean, default=False)
    set_at: Mapped[datetime] = mapped_column(DateTime, default=now)


class BaselineTrial(Base):
    """One baseline point: the trial that a job's trial with the same match key is compared to. The key
    hashes family, backend, shape, config (without `_` test knobs), dtype and the environment class."""

    __tablename__ = "baseline_trials"
    __table_args__ = (UniqueConstraint("baseline_id", "match_key", name="uq_baseline_match"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    baseline_id: Mapped[int] = mapped_column(ForeignKey("baselines.id", ondelete="CASCADE"), index=True)
    match_key: Mapped[str] = mapped_column(String(32), index=True)
    env_class: Mapped[str] = mapped_column(String(255))
    # indexed: "is this trial a baseline's" (farm db prune keeps its samples) and a trial's deletion
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), index=True)
