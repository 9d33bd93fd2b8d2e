"""The drafts of the agent acceptance layer (jobs.drafts.client, via the gateway's summaries endpoint):
one drafting of a job's anomalies and the drafts it returned, with their review state."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, DateTime, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from jobs.store.tables.base import Base, now


class DraftRun(Base):
    """One drafting of a job's anomalies: what was sent (sizes before and after compression), to which
    model, what it cost. A new drafting of the job replaces the previous one."""

    __tablename__ = "draft_runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    task: Mapped[str] = mapped_column(String(32))  # checklist | log_summary
    model: Mapped[str | None] = mapped_column(String(128))
    provider: Mapped[str | None] = mapped_column(String(64))
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    cached: Mapped[bool] = mapped_column(Boolean, default=False)
    anomalies: Mapped[int] = mapped_column(Integer)  # anomalies of the job
    sent: Mapped[int] = mapped_column(Integer)  # after folding duplicate fingerprints
    raw_bytes: Mapped[int] = mapped_column(Integer)
    compressed_bytes: Mapped[int] = mapped_column(Integer)
    input_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    batch: Mapped[dict | None] = mapped_column(JSON)  # requests, items, gateway request ids
    created_at: Mapped[datetime] = mapped_column(DateTime, default=now)


DRAFT_NEW = "new"  # a draft nobody has reviewed (jobs.drafts.review names the other states)


class DraftRow(Base):
    """A draft an engineer edits; `fingerprints` names the anomalies it explains (stable across runs)."""

    __tablename__ = "drafts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("draft_runs.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    assertion: Mapped[str] = mapped_column(Text)
    verify_how: Mapped[str] = mapped_column(Text)
    failure_signature: Mapped[str] = mapped_column(Text)
    needs_local_profiler: Mapped[bool] = mapped_column(Boolean, default=False)
    fingerprints: Mapped[list] = mapped_column(JSON)
    # fingerprint -> digest of the compressed item sent (jobs.drafts.compress.content_digest); None: a draft
    # stored before revision 0006
    contents: Mapped[dict | None] = mapped_column(JSON)
    offline: Mapped[bool] = mapped_column(Boolean, default=False)
    check_spec: Mapped[dict | None] = mapped_column(JSON)  # the check, valid in the card's grammar
    check_error: Mapped[str | None] = mapped_column(Text)  # why the draft's check did not validate
    state: Mapped[str] = mapped_column(String(16), default=DRAFT_NEW, server_default=DRAFT_NEW, index=True)
    reason: Mapped[str | None] = mapped_column(Text)
    reviewed_at: Mapped[datetime | None] = mapped_column(DateTime)
    promoted_to: Mapped[str | None] = mapped_column(String(1000))
