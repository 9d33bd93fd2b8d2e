"""The store's baselines: moving a name to a job (checked against a concurrent move), its points, its
history, and the reads of them."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from jobs.store.errors import BaselineMoved
from jobs.store.records import BaselinePoint, columns
from jobs.store.tables import Baseline, BaselineMove, BaselineTrial, Job, now


class BaselineStore:
    """The baselines part of jobs.store.Store."""

    engine: Engine

    # ---- baselines ------------------------------------------------------------------------------
    def set_baseline(
        self,
        name: str,
        job: Job,
        points: Sequence[BaselinePoint],
        *,
        expect_job_id: int | None = None,
        forced: bool = False,
    ) -> tuple[Baseline, int | None]:
        """Point the baseline `name` at `job` with `points`, and keep the
        setting in its history. A name in use moves (its old points are dropped) only while it still
        points at `expect_job_id` (checked in this transaction): another `baseline set` that moved it
        since raises BaselineMoved. Returns (row, the job it pointed at before, None for a new name)."""
        with Session(self.engine, expire_on_commit=False) as s, s.begin():
            row = s.scalar(select(Baseline).where(Baseline.name == name).with_for_update())
            previous = row.job_id if row is not None else None
            if previous != expect_job_id:
                raise BaselineMoved(
                    f"baseline {name} was moved to job {previous} while this command ran; run it again"
                )
            if row is None:
                row = Baseline(name=name, job_id=job.id, family=job.family, git_commit=job.git_commit)
                s.add(row)
                s.flush()
            else:
                s.execute(delete(BaselineTrial).where(BaselineTrial.baseline_id == row.id))
                row.job_id, row.family, row.git_commit, row.created_at = (
                    job.id, job.family, job.git_commit, now()
                )  # fmt: skip
            if points:
                s.execute(
                    insert(BaselineTrial),
                    [columns(p, baseline_id=row.id) for p in points],
                )
            s.add(
                BaselineMove(
                    name=name, job_id=job.id, previous_job_id=previous, family=job.family,
                    spec_name=job.name, git_commit=job.git_commit, points=len(points), forced=forced,
                )
            )  # fmt: skip
            return row, previous

    def baseline_history(self, name: str | None = None) -> list[BaselineMove]:
        """Every setting of the baselines (or of one), oldest first."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(BaselineMove).order_by(BaselineMove.id)
            if name is not None:
                q = q.where(BaselineMove.name == name)
            return list(s.scalars(q))

    def get_baseline(self, name: str) -> Baseline | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.scalar(select(Baseline).where(Baseline.name == name))

    def list_baselines(self) -> list[tuple[Baseline, int]]:
        """Baselines, newest first, with their number of points."""
        with Session(self.engine, expire_on_commit=False) as s:
            n = (
                select(BaselineTrial.baseline_id, func.count().label("n"))
                .group_by(BaselineTrial.baseline_id)
                .subquery()
            )
            q = (
                select(Baseline, func.coalesce(n.c.n, 0))
                .outerjoin(n, n.c.baseline_id == Baseline.id)
                .order_by(Baseline.created_at.desc(), Baseline.id.desc())
            )
            return [(b, int(count)) for b, count in s.execute(q)]

    def baseline_points(self, baseline_id: int) -> dict[str, int]:
        """match_key -> baseline trial id."""
        with Session(self.engine) as s:
            q = select(BaselineTrial.match_key, BaselineTrial.trial_id).where(
                BaselineTrial.baseline_id == baseline_id
            )
            return {k: t for k, t in s.execute(q)}
