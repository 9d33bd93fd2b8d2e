"""The store's drafts: one drafting of a job's anomalies and its drafts, replacing the unreviewed ones,
and the read of the latest. (Their review, jobs.drafts.review, updates the rows it owns.)"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from jobs.store.records import DraftRecord, DraftRunRecord, columns
from jobs.store.tables import DRAFT_NEW, DraftRow, DraftRun


class DraftStore:
    """The drafts part of jobs.store.Store."""

    engine: Engine

    def replace_drafts(self, job_id: int, run: DraftRunRecord, drafts: Sequence[DraftRecord]) -> int:
        """Store one drafting of the job: it replaces the job's drafts nobody reviewed yet and keeps the
        reviewed ones (a rejection must outlive the next drafting: jobs.drafts.review). Returns the run id."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(DraftRow).where(DraftRow.job_id == job_id, DraftRow.state == DRAFT_NEW))
            kept = select(DraftRow.run_id).where(DraftRow.job_id == job_id)
            s.execute(delete(DraftRun).where(DraftRun.job_id == job_id, DraftRun.id.not_in(kept)))
            row = DraftRun(**columns(run, job_id=job_id))
            s.add(row)
            s.flush()
            if drafts:
                s.execute(insert(DraftRow), [columns(d, run_id=row.id, job_id=job_id) for d in drafts])
            return row.id

    def drafts(self, job_id: int) -> tuple[DraftRun | None, list[DraftRow]]:
        with Session(self.engine, expire_on_commit=False) as s:
            run = s.scalar(select(DraftRun).where(DraftRun.job_id == job_id).order_by(DraftRun.id.desc()))
            rows = list(s.scalars(select(DraftRow).where(DraftRow.job_id == job_id).order_by(DraftRow.id)))
            return run, rows
