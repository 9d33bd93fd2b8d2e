"""The store's jobs and trials: a job created with one pending row per trial, its status, the results
written once per trial (with their raw samples and the environment they ran in), and the reads of them.

A job's trials are all inserted as `pending` rows when the job is created, one row per trial key (unique
per job), and each result updates its row as it arrives. So a trial can never be stored twice, and
resuming a job means running the rows that are not finished.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import bindparam, func, insert, select, update
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session, defer

from jobs.store.engine import insert_or_ignore
from jobs.store.records import TrialPoint
from jobs.store.results import TrialResult
from jobs.store.sample_codec import pack, unpack
from jobs.store.tables import PENDING, Environment, Job, Sample, TrialRow, now
from jobs.store.tables.trials import shape_key
from kernels.base import FINISHED, Summary


def kept(samples: Sequence[int], summary: dict[str, Any] | None) -> list[int]:
    """The samples a trial's summary stands on: all of them but those the measurement discarded
    (summary["discarded"], e.g. taken while the GPU was throttled)."""
    if summary is None or (isinstance(summary, Mapping) and not summary.get("discarded")):
        return list(samples)  # nothing discarded (most trials): no summary to read back
    dropped = set(Summary.from_stored(summary).discarded)
    return [v for i, v in enumerate(samples) if i not in dropped]


def pending_row(job_id: int, seq: int, t: TrialPoint) -> dict[str, Any]:
    """The row a new job's trial is created as: its grid point, pending."""
    return dict(
        job_id=job_id,
        key=t.key,
        seq=seq,
        family=t.family,
        backend=t.backend,
        baseline=t.baseline,
        shape=t.shape,
        shape_key=shape_key(t.shape),
        config=t.config,
        dtype=t.dtype,
        status=PENDING,
        attempt=0,
    )


def result_row(r: TrialResult, environment_id: int | None) -> dict[str, Any]:
    """What a finished trial's row is updated with (its samples go to `sample_row`)."""
    row = r.columns()
    row["finished_at"] = row["finished_at"] or now()
    row["environment_id"] = environment_id
    return row


def sample_row(trial_id: int, samples: Sequence[int]) -> dict[str, Any]:
    """The `samples` row of a trial's raw samples: one array (jobs.store.sample_codec)."""
    codec, data = pack(samples)
    return {"trial_id": trial_id, "n": len(samples), "codec": codec, "data": data}


class TrialStore:
    """The jobs and trials part of jobs.store.Store."""

    CREATE_BATCH = 2000  # trial rows per INSERT when a job is created
    engine: Engine
    _env_ids: dict[str, int]

    # ---- jobs -----------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        name: str,
        family: str,
        spec_yaml: str,
        spec_hash: str,
        trials: Iterable[TrialPoint],
        git_commit: str | None,
    ) -> int:
        """Create the job and one pending row per trial, in one transaction."""
        with Session(self.engine) as s, s.begin():
            job = Job(name=name, family=family, spec=spec_yaml, spec_hash=spec_hash, git_commit=git_commit)
            s.add(job)
            s.flush()
            rows = (pending_row(job.id, i, t) for i, t in enumerate(trials))
            # in batches: a large grid (an iterable of trials) streams into the store in flat memory
            while batch := list(itertools.islice(rows, self.CREATE_BATCH)):
                s.execute(insert(TrialRow), batch)
            return job.id

    def get_job(self, job_id: int) -> Job | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(Job, job_id)

    def list_jobs(self, limit: int = 50) -> list[tuple[Job, dict[str, int]]]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(Job).options(defer(Job.spec))  # megabytes for a large grid, and not listed
            jobs = list(s.scalars(q.order_by(Job.id.desc()).limit(limit)))
            counts = status_counts(s, [j.id for j in jobs])
            return [(j, counts.get(j.id, {})) for j in jobs]

    def status_counts(self, job_id: int) -> dict[str, int]:
        with Session(self.engine) as s:
            return status_counts(s, [job_id]).get(job_id, {})  # the module's function, by (job_id, status)

    def recent_jobs(self, family: str, up_to: int, limit: int) -> list[int]:
        """The ids of the family's newest `limit` jobs created up to job `up_to` (it included)."""
        with Session(self.engine) as s:
            at = select(Job.created_at).where(Job.id == up_to).scalar_subquery()
            q = (
                select(Job.id)
                .where(
                    Job.family == family, (Job.created_at < at) | ((Job.created_at == at) & (Job.id <= up_to))
                )
                .order_by(Job.created_at.desc(), Job.id.desc())
                .limit(limit)
            )
            return list(s.scalars(q))

    def set_job_status(
        self, job_id: int, status: str, *, message: str | None = None, cluster: dict | None = None
    ) -> None:
        values: dict[str, Any] = {"status": status}
        if status == "running":  # a resumed job keeps the time it first started
            values["started_at"] = func.coalesce(Job.started_at, now())
            values["finished_at"] = None
        elif status in ("completed", "failed", "interrupted", "cancelled"):
            values["finished_at"] = now()
        if message is not None:
            values["message"] = message
        if cluster is not None:
            values["cluster"] = cluster
        with Session(self.engine) as s, s.begin():
            s.execute(update(Job).where(Job.id == job_id).values(**values))

    # ---- trials ---------------------------------------------------------------------------------
    def unfinished_trials(self, job_id: int) -> list[TrialRow]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = (
                select(TrialRow)
                .where(TrialRow.job_id == job_id, TrialRow.status.not_in(FINISHED))
                .order_by(TrialRow.seq)
            )
            return list(s.scalars(q))

    def iter_unfinished_trials(self, job_id: int, page: int = 2000) -> Iterator[TrialRow]:
        """The unfinished trials in seq order, read a page at a time (flat memory for a large job)."""
        after = -1
        while True:
            with Session(self.engine, expire_on_commit=False) as s:
                q = (
                    select(TrialRow)
                    .where(TrialRow.job_id == job_id, TrialRow.status.not_in(FINISHED), TrialRow.seq > after)
                    .order_by(TrialRow.seq)
                    .limit(page)
                )
                rows = list(s.scalars(q))
            yield from rows
            if len(rows) < page:
                return
            after = rows[-1].seq

    def trials(self, job_id: int) -> list[TrialRow]:
        with Session(self.engine, expire_on_commit=False) as s:
            return list(s.scalars(select(TrialRow).where(TrialRow.job_id == job_id).order_by(TrialRow.seq)))

    def samples(self, trial_id: int) -> list[int]:
        """The trial's raw samples in the order taken ([] when it has none, or they were pruned)."""
        with Session(self.engine) as s:
            found = s.execute(select(Sample.codec, Sample.data).where(Sample.trial_id == trial_id)).first()
        return unpack(*found) if found is not None else []

    def kept_samples(self, trial_id: int) -> list[int]:
        """The samples the trial's summary stands on: all of them but those the measurement discarded
        (summary["discarded"], e.g. taken while the GPU was throttled). Comparisons use these."""
        samples = self.samples(trial_id)
        with Session(self.engine) as s:
            summary = s.scalar(select(TrialRow.summary).where(TrialRow.id == trial_id))
        return kept(samples, summary)

    def kept_samples_of(self, trial_ids: Iterable[int]) -> dict[int, list[int]]:
        """kept_samples of many trials in one read (a trial without samples maps to [])."""
        ids = sorted(set(trial_ids))
        out: dict[int, list[int]] = {i: [] for i in ids}
        with Session(self.engine) as s:
            for start in range(0, len(ids), 1000):  # bounded IN lists
                page = ids[start : start + 1000]
                # the summary's discarded list alone: whole summaries decoded were 0.09 s of a job's page
                q = (
                    select(TrialRow.id, TrialRow.summary["discarded"], Sample.codec, Sample.data)
                    .join(Sample, Sample.trial_id == TrialRow.id)
                    .where(TrialRow.id.in_(page))
                )
                for trial_id, discarded, codec, data in s.execute(q):
                    out[trial_id] = kept(unpack(codec, data), {"discarded": discarded})
        return out

    def record_results(self, results: Iterable[TrialResult]) -> None:
        """Write finished trials (and their raw samples) in one transaction.

        A trial already finished is left as it is: a late duplicate result can never overwrite it.
        Rows go out as one executemany UPDATE and one executemany INSERT, so a flush of many short
        trials costs about as much as one.
        """
        results = list(results)
        if not results:
            return
        wrong = [type(r).__name__ for r in results if not isinstance(r, TrialResult)]
        if wrong:
            raise TypeError(f"record_results takes jobs.store.results.TrialResult items (got {wrong[0]})")
        table = TrialRow.__table__
        with self.engine.begin() as conn:
            ids = [r.trial_id for r in results]
            open_ids = set(
                conn.scalars(select(table.c.id).where(table.c.id.in_(ids), table.c.status.not_in(FINISHED)))
            )
            rows, samples = [], []
            for r in results:
                if r.trial_id not in open_ids:
                    continue
                open_ids.discard(r.trial_id)  # the first result of a trial wins
                env = r.environment
                env_id = self._environment_id(conn, dict(env)) if env is not None else None
                rows.append(result_row(r, env_id) | {"_id": r.trial_id})
                if r.samples_ns:
                    samples.append(sample_row(r.trial_id, r.samples_ns))
            if rows:
                stmt = (
                    update(table)
                    # the status test again, in the UPDATE itself, so a concurrent writer cannot win twice
                    .where(
                        table.c.id == bindparam("_id"),
                        table.c.status == PENDING,
                    )
                    .values({c: bindparam(c) for c in rows[0] if c != "_id"})
                )
                conn.execute(stmt, rows)
            if samples:
                conn.execute(insert(Sample.__table__), samples)

    def mark_attempt(self, trial_id: int, attempt: int, error: str | None = None) -> None:
        """A worker died under this trial: count the attempt and keep it pending for a retry."""
        with Session(self.engine) as s, s.begin():
            s.execute(
                update(TrialRow)
                .where(TrialRow.id == trial_id, TrialRow.status.not_in(FINISHED))
                .values(attempt=attempt, error=error, status=PENDING)
            )

    def _environment_id(self, conn: Connection, env: dict[str, Any]) -> int:
        fp = hashlib.sha256(json.dumps(env, sort_keys=True, default=str).encode()).hexdigest()[:32]
        if fp in self._env_ids:
            return self._env_ids[fp]
        table = Environment.__table__
        found = conn.scalar(select(table.c.id).where(table.c.fingerprint == fp))
        if found is None:
            row = {
                "fingerprint": fp,
                "host": env.get("host", "?"),
                "device_kind": env.get("device_kind", "?"),
                "device_name": env.get("device_name", "?"),
                "data": env,
            }
            # Another sweep may be inserting the same environment right now: its row wins (this insert
            # waits for its transaction, then does nothing) and is read back below.
            conn.execute(insert_or_ignore(conn, table).values(**row))
            found = conn.scalar(select(table.c.id).where(table.c.fingerprint == fp))
        self._env_ids[fp] = found
        return found

    def environments(self, job_id: int) -> list[Environment]:
        with Session(self.engine, expire_on_commit=False) as s:
            # an IN over the ids, not a DISTINCT over the rows: PostgreSQL has no equality for JSON
            used = select(TrialRow.environment_id).where(TrialRow.job_id == job_id)
            q = select(Environment).where(Environment.id.in_(used)).order_by(Environment.id)
            return list(s.scalars(q))

    def get_trial(self, trial_id: int) -> TrialRow | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(TrialRow, trial_id)


def status_counts(s: Session, job_ids: Sequence[int]) -> dict[int, dict[str, int]]:
    """Each job's trials by status, in one grouped statement on (job_id, status, seq) (a job without
    trials is left out)."""
    out: dict[int, dict[str, int]] = {}
    if not job_ids:
        return out
    q = (
        select(TrialRow.job_id, TrialRow.status, func.count())
        .where(TrialRow.job_id.in_(sorted(job_ids)))
        .group_by(TrialRow.job_id, TrialRow.status)
    )
    for job_id, status, n in s.execute(q):
        out.setdefault(job_id, {})[status] = n
    return out
