"""How long raw samples are kept (`farm db prune --samples-older-than 90d`, issue 46): the sample arrays of
the trials of jobs created before a date are deleted, except those of a baseline's trials (what later jobs
are compared to) and of confirmation jobs (the A/B re-runs a verdict stands on). Every trial's summary
(median, spread, quantiles, n) stays, so reports, history and compare of old jobs read the same numbers;
only the statistics that need the raw values (a sample-level A/B test against a pruned trial) have none."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, delete, func, select
from sqlalchemy.engine import Engine

from jobs.store.tables import BaselineTrial, Job, Sample, TrialRow

# jobs.judge.confirm names a confirmation job after the job it confirms, with this suffix
CONFIRM_SUFFIX = "-confirm"


@dataclass(frozen=True)
class Pruned:
    """What a prune deletes (or, dry, would delete): trials whose samples go, their values, their bytes."""

    trials: int
    values: int
    bytes: int


def _prunable(before: datetime) -> ColumnElement[bool]:
    old = (
        select(TrialRow.id)
        .join(Job, Job.id == TrialRow.job_id)
        .where(Job.created_at < before, Job.name.not_like(f"%{CONFIRM_SUFFIX}"))
    )
    return Sample.trial_id.in_(old) & Sample.trial_id.not_in(select(BaselineTrial.trial_id))


class RetentionStore:
    """The retention part of jobs.store.Store."""

    engine: Engine

    def prune_samples(self, before: datetime, *, apply: bool = False) -> Pruned:
        """The samples of the jobs created before `before` (baselines' and confirmations' kept): counted,
        and deleted when `apply`, in one transaction."""
        where = _prunable(before)
        with self.engine.begin() as conn:
            q = select(
                func.count(),
                func.coalesce(func.sum(Sample.n), 0),
                func.coalesce(func.sum(func.length(Sample.data)), 0),
            ).where(where)
            trials, values, size = conn.execute(q).one()
            if apply and trials:
                conn.execute(delete(Sample).where(where))
        return Pruned(int(trials), int(values), int(size))
