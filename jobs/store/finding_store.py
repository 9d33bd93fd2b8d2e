"""The store's findings: the anomalies of a job's latest analysis and the failed assertions of its
latest acceptance run (the failure bank). Each write replaces what the job had; `record_verdict` writes
both in one transaction, as `farm accept` ends. Each `farm compare` is added (`record_comparison`), never
replaced: the A/Bs of a job are its record of what was compared under which environments."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from sqlalchemy import delete, insert, select
from sqlalchemy.engine import Engine, Row
from sqlalchemy.orm import Session

from jobs.store.records import AnomalyRecord, FailureRecord, columns
from jobs.store.tables import Anomaly, Comparison, Environment, Failure, TrialRow


def _replace(
    s: Session, table: type[Anomaly] | type[Failure], job_id: int, records: Sequence[object]
) -> None:
    s.execute(delete(table).where(table.job_id == job_id))
    if records:
        s.execute(insert(table), [columns(r, job_id=job_id) for r in records])


class FindingStore:
    """The anomalies and failure-bank part of jobs.store.Store."""

    engine: Engine

    def replace_anomalies(self, job_id: int, records: Sequence[AnomalyRecord]) -> None:
        """The anomalies of one analysis of the job: a new analysis replaces the previous one."""
        with Session(self.engine) as s, s.begin():
            _replace(s, Anomaly, job_id, records)

    def replace_failures(self, job_id: int, records: Sequence[FailureRecord]) -> None:
        """The failed assertions of one acceptance run of the job (a rerun replaces them)."""
        with Session(self.engine) as s, s.begin():
            _replace(s, Failure, job_id, records)

    def record_verdict(
        self, job_id: int, anomalies: Sequence[AnomalyRecord], failures: Sequence[FailureRecord]
    ) -> None:
        """What one acceptance run of the job found, anomalies and failed assertions, replacing the
        previous run's in one transaction."""
        with Session(self.engine) as s, s.begin():
            _replace(s, Anomaly, job_id, anomalies)
            _replace(s, Failure, job_id, failures)

    def anomalies(self, job_id: int | None = None, fingerprint: str | None = None) -> list[Anomaly]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(Anomaly).order_by(Anomaly.id)
            if job_id is not None:
                q = q.where(Anomaly.job_id == job_id)
            if fingerprint is not None:
                q = q.where(Anomaly.fingerprint == fingerprint)
            return list(s.scalars(q))

    def failures(self, fingerprint: str | None = None, *, job_id: int | None = None) -> list[Failure]:
        return [f for f, _env in self.failures_in_environments(fingerprint, job_id=job_id)]

    def failures_in_environments(
        self, fingerprint: str | None = None, *, job_id: int | None = None
    ) -> list[tuple[Failure, Environment | None]]:
        """The failure bank's entries (of one fingerprint, of one job), each with the environment its trial
        ran in (None: not recorded)."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = (
                select(Failure, Environment)
                .outerjoin(TrialRow, TrialRow.id == Failure.trial_id)
                .outerjoin(Environment, Environment.id == TrialRow.environment_id)
                .order_by(Failure.id)
            )
            if fingerprint is not None:
                q = q.where(Failure.fingerprint == fingerprint)
            if job_id is not None:
                q = q.where(Failure.job_id == job_id)
            return [(f, env) for f, env in s.execute(q)]

    def bank_rows(self, chunk: int = 500) -> Iterator[Row]:
        """The failure bank's entries in the order they were written, each only what `farm failures list`
        groups and shows (fingerprint, assertion, label, job_id, git_commit, tag, message) and its trial's
        environment_id, streamed `chunk` rows at a time: the bank's evidence, cards and environments are
        not read per entry (its memory is the groups' lists, not the bank's rows)."""
        q = (
            select(
                Failure.fingerprint, Failure.assertion, Failure.label, Failure.job_id, Failure.git_commit,
                Failure.tag, Failure.message, TrialRow.environment_id,
            )
            .outerjoin(TrialRow, TrialRow.id == Failure.trial_id)
            .order_by(Failure.id)
        )  # fmt: skip
        with self.engine.connect() as conn:
            yield from conn.execution_options(yield_per=chunk).execute(q)

    def bank_environments(self) -> dict[int | None, Environment | None]:
        """The environments the failure bank's trials ran in, by id, each once (the key None: a failure
        whose trial or trial's environment is not recorded)."""
        with Session(self.engine, expire_on_commit=False) as s:
            ids = set(
                s.scalars(
                    select(TrialRow.environment_id)
                    .select_from(Failure)
                    .outerjoin(TrialRow, TrialRow.id == Failure.trial_id)
                    .distinct()
                )
            )
            known = [i for i in ids if i is not None]
            envs = (
                {e.id: e for e in s.scalars(select(Environment).where(Environment.id.in_(known)))}
                if known
                else {}
            )
        return {i: envs.get(i) for i in ids}

    def record_comparison(self, **fields: object) -> int:
        """Keep one `farm compare` run (the Comparison table's fields); its id."""
        with Session(self.engine) as s, s.begin():
            row = Comparison(**fields)
            s.add(row)
            s.flush()
            return row.id

    def comparisons(self, job_id: int) -> list[Comparison]:
        """The comparisons a job took part in, as A or B, oldest first."""
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(Comparison).where((Comparison.job_a == job_id) | (Comparison.job_b == job_id))
            return list(s.scalars(q.order_by(Comparison.id)))
