"""What `farm site` asks the store to rebuild only what changed (issue 46): a stamp per job of everything
its page shows that can change after the job was made (its status and end, its verdict's failures and
anomalies, the baselines of its family), and the series keys (family, backend, shape key) of some jobs'
trials, the kernel pages those jobs touch."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from jobs.store.tables import Anomaly, BaselineMove, Failure, Job, TrialRow


def _move_then(moves: list[tuple[datetime, int]], end: datetime | None) -> int | None:
    """The id of the last of a family's `moves` (set at, id; in order) set by `end` (None: the last)."""
    if end is None:
        return moves[-1][1] if moves else None
    at = bisect_right(moves, (end, math.inf))
    return moves[at - 1][1] if at else None


class PageReads:
    """The site's incremental reads, part of jobs.store.Store."""

    engine: Engine

    def job_stamps(self) -> dict[int, list]:
        """job id -> [status, finished_at, failures, anomalies, its family's last baseline move by its end
        (the last one while it runs: jobs.report.job_view.stored_baseline)]: a page whose stamp is
        unchanged shows the same."""
        with self.engine.connect() as conn:
            failures = dict(conn.execute(select(Failure.job_id, func.count()).group_by(Failure.job_id)).all())
            anomalies = dict(
                conn.execute(select(Anomaly.job_id, func.count()).group_by(Anomaly.job_id)).all()
            )
            moves: dict[str, list[tuple[datetime, int]]] = {}  # family -> (set at, move id), in order
            q = select(BaselineMove.family, BaselineMove.set_at, BaselineMove.id)
            for fam, at, move in conn.execute(q.order_by(BaselineMove.set_at, BaselineMove.id)):
                moves.setdefault(fam, []).append((at, move))
            jobs = conn.execute(select(Job.id, Job.status, Job.finished_at, Job.family)).all()
        return {
            j: [
                status,
                end.isoformat() if end else None,
                failures.get(j, 0),
                anomalies.get(j, 0),
                _move_then(moves.get(fam, []), end),
            ]
            for j, status, end, fam in jobs
        }

    def series_keys_of(self, job_ids: Iterable[int]) -> set[tuple[str, str, str | None]]:
        """The (family, backend, shape key) of the jobs' trials."""
        ids = sorted(set(job_ids))
        out: set[tuple[str, str, str | None]] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(ids), 1000):
                q = (
                    select(TrialRow.family, TrialRow.backend, TrialRow.shape_key)
                    .where(TrialRow.job_id.in_(ids[start : start + 1000]))
                    .distinct()
                )
                out |= {tuple(r) for r in conn.execute(q)}
        return out

    def jobs_brief(self) -> list[tuple[int, str, str | None]]:
        """(id, name, commit) of every job, oldest first: the site's list of jobs."""
        with self.engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(Job.id, Job.name, Job.git_commit).order_by(Job.id))]
