"""The results store: jobs, trials, raw timing samples and environments, through SQLAlchemy 2.0.

A SQLite file by default; any SQLAlchemy URL works (PostgreSQL for a team). A job's trials are all
inserted as `pending` rows when the job is created, one row per trial key (unique per job), and each
result updates its row as it arrives. So a trial can never be stored twice, and resuming a job means
running the rows that are not finished.
"""

from __future__ import annotations

import errno
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import NoSuchModuleError, SQLAlchemyError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from jobs.errors import NoSuchStore, StoreError
from jobs.store.finite_json import finite_json
from jobs.store.results import TrialResult
from jobs.store.schema import StoreSchemaError as StoreSchemaError  # Store() on an out-of-date store
from jobs.store.schema import display_url, ensure_schema
from kernels.base import FINISHED, NOT_FAILED, Summary, TrialStatus  # noqa: F401 - NOT_FAILED is re-exported

DEFAULT_DB = ".farm/farm.db"

# Trial states are kernels.base.TrialStatus. A finished trial is never run again by `farm sweep resume`;
# NOT_FAILED are the finished states that are no failure (passed, or deliberately not run).
PENDING = TrialStatus.PENDING


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    pass


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    family: Mapped[str] = mapped_column(String(64))
    spec: Mapped[str] = mapped_column(Text)  # the spec as validated, YAML
    spec_hash: Mapped[str] = mapped_column(String(32), index=True)
    status: Mapped[str] = mapped_column(String(16), default="created")  # created running completed ...
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
    __table_args__ = (UniqueConstraint("job_id", "key", name="uq_trial_job_key"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    key: Mapped[str] = mapped_column(String(32))
    seq: Mapped[int] = mapped_column(Integer)  # position in the expanded grid
    family: Mapped[str] = mapped_column(String(64))
    backend: Mapped[str] = mapped_column(String(64))
    baseline: Mapped[bool] = mapped_column(Boolean, default=False)
    shape: Mapped[dict] = mapped_column(JSON)
    config: Mapped[dict] = mapped_column(JSON)
    dtype: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default=PENDING, index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str | None] = mapped_column(String(255))
    worker: Mapped[str | None] = mapped_column(String(64))
    gpu_id: Mapped[str | None] = mapped_column(String(32))
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
    __tablename__ = "samples"
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    value_ns: Mapped[int] = mapped_column(BigInteger)


# ---- baselines, anomalies and the failure bank (jobs.judge: baselines, anomalies, acceptance) -------


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
    trial_id: Mapped[int] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"))


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


# ---- drafts from the agent acceptance layer (jobs.drafts.client, via the gateway's summaries endpoint)


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


# The queue's tables (farm submit, the pool) are defined beside the queue and belong to this schema too.
import jobs.queue.model  # noqa: E402, F401 - registers job_queue, trial_claims and farm_pools on Base


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA busy_timeout=10000")  # first: the statements below may wait for a lock
    if cur.execute("PRAGMA query_only").fetchone()[0]:  # opened read-only (mode=ro): nothing to set
        cur.close()
        return
    # WAL + NORMAL: a commit costs no fsync of the main file, and readers never block the writer.
    try:
        cur.execute("PRAGMA journal_mode=WAL")  # kept by the file: set by its first connection
    except Exception as e:  # a new file another process is creating (first starts at once): SQLite does
        if "locked" not in str(e):  # not wait here; that process, or a later connection, switches it
            raise
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def make_engine(
    url: str | None = None, *, check_schema: bool = True, create: bool = True, source: str | None = None
) -> Engine:
    """`url` is an SQLAlchemy URL or a plain file path; None means the default SQLite file.

    The store's schema is checked (jobs.store.schema.ensure_schema): a new, empty store is created
    at the newest revision; an out-of-date one raises StoreSchemaError naming `farm db upgrade`.
    `check_schema=False` is for that command, which migrates it. `create=False` is for the commands that
    only read: an SQLite store whose file does not exist raises NoSuchStore (exit 2) instead of being
    created (`source` says where the name came from: "the default", "FARM_DB"). A PostgreSQL database
    is made by its server, never by the farm: `create` does not change how one is opened."""
    given = url = url or DEFAULT_DB  # errors name the store as given, never the URL made of a path
    if not create and (missing := _missing_sqlite_file(url)) is not None:
        raise NoSuchStore(given, source) from missing
    if "://" not in url:
        try:
            Path(url).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise store_error(err, given) from err
        url = f"sqlite:///{url}"
    try:
        engine = create_engine(_read_only_if_unwritable(url), json_serializer=finite_json)
    except (SQLAlchemyError, ImportError, ValueError) as err:
        raise store_error(err, given) from err
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    if check_schema:
        try:
            ensure_schema(engine, Base.metadata, url=given)
        except (SQLAlchemyError, OSError) as err:
            engine.dispose()
            raise store_error(err, given) from err
        except BaseException:
            engine.dispose()
            raise
    return engine


def _missing_sqlite_file(url: str) -> FileNotFoundError | None:
    """Why the SQLite store `url` (a file path or an sqlite URL) does not exist, or None when it exists or
    is not an SQLite file (a server database, an in-memory one, a URL that fails later, with its own
    message)."""
    path: str | None = url
    if "://" in url:
        try:
            parsed = make_url(url)
        except Exception:  # noqa: BLE001 - store_error names it when the engine is made
            return None
        path = parsed.database if parsed.drivername.startswith("sqlite") else None
        if path and path.startswith("file:"):  # an SQLite URI filename: file:PATH?mode=...
            path, _, query = path[len("file:") :].partition("?")
            if "mode=memory" in query or "mode=memory" in str(parsed.query):
                return None
            path = unquote(path)
    if not path or path == ":memory:" or Path(path).exists():
        return None
    return FileNotFoundError(errno.ENOENT, "no such file", path)


def _read_only_if_unwritable(url: str) -> str:
    """An SQLite file this process cannot write (a results file on a read-only share) is opened read-only,
    so the commands that only read it work; one in a folder it cannot write either, with no WAL file
    beside it, is opened as immutable (SQLite could not make the WAL index it needs to read)."""
    parsed = make_url(url)
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:" or parsed.query:
        return url
    file = Path(path)
    if not file.is_file() or (os.access(file, os.W_OK) and os.access(file.parent, os.W_OK)):
        return url
    query = "mode=ro"
    if not os.access(file.parent, os.W_OK) and not Path(f"{path}-wal").exists():
        query += "&immutable=1"
    return f"sqlite:///file:{quote(str(file.resolve()))}?{query}&uri=true"


def store_error(err: BaseException, url: str) -> StoreError:
    """What the database or its driver raised, as one line naming the store, the problem and the fix."""
    where = display_url(url)
    text = str(getattr(err, "orig", None) or err).strip().splitlines()
    first = text[0] if text else err.__class__.__name__
    low = first.lower()
    if isinstance(err, NoSuchModuleError) or "can't load plugin" in low:
        scheme = url.split("://", 1)[0]
        return StoreError(
            f"unknown database URL scheme {scheme!r} in {where}: use a file path, sqlite:///PATH or "
            "postgresql+psycopg://USER@HOST/DB (--db or FARM_DB)"
        )
    if isinstance(err, ImportError):
        return StoreError(
            f"no database driver for {where} ({first}): for PostgreSQL use postgresql+psycopg://... "
            "(`pip install 'psycopg[binary]'`, which `make` installs)"
        )
    if "file is not a database" in low or "malformed" in low:
        return StoreError(
            f"the farm store {where} is not a readable SQLite database ({first}): it is damaged or not a "
            "store; restore it from a copy or point --db (FARM_DB) at another file"
        )
    if "readonly" in low or "read-only" in low or "read only" in low:
        return StoreError(
            f"the farm store {where} is read-only ({first}): only reading commands (jobs list, report, "
            "compare, baseline list) work on it; copy it somewhere writable, or point --db at another store"
        )
    if "unable to open database file" in low or isinstance(err, OSError):
        return StoreError(
            f"cannot open the farm store {where} ({first}): check that its folder exists and is "
            "writable, or point --db (FARM_DB) at another store"
        )
    return StoreError(f"the farm store {where} failed: {first} (rerun with `farm --debug` for details)")


class BaselineMoved(RuntimeError):
    """A named baseline moved between reading it and moving it (another `farm baseline set`)."""


def _insert_or_ignore(conn: Connection, table: Any):
    """INSERT ... ON CONFLICT DO NOTHING, on the databases the store runs on."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table).on_conflict_do_nothing()
    return insert(table)


class Store:
    """All reads and writes of the farm's results. One per process; cheap to construct."""

    CREATE_BATCH = 2000  # trial rows per INSERT when a job is created

    def __init__(self, url: str | None = None, *, create: bool = True, source: str | None = None):
        """`create=False`: open an existing store only (make_engine); the commands that only read."""
        self.url = url or DEFAULT_DB
        self.engine = make_engine(url, create=create, source=source)
        self._env_ids: dict[str, int] = {}

    def close(self) -> None:
        self.engine.dispose()

    # ---- jobs -----------------------------------------------------------------------------------
    def create_job(
        self,
        *,
        name: str,
        family: str,
        spec_yaml: str,
        spec_hash: str,
        trials: Iterable[Any],
        git_commit: str | None,
    ) -> int:
        """Create the job and one pending row per trial, in one transaction."""
        with Session(self.engine) as s, s.begin():
            job = Job(name=name, family=family, spec=spec_yaml, spec_hash=spec_hash, git_commit=git_commit)
            s.add(job)
            s.flush()
            rows = (
                dict(
                    job_id=job.id,
                    key=t.key,
                    seq=i,
                    family=t.family,
                    backend=t.backend,
                    baseline=t.baseline,
                    shape=t.shape,
                    config=t.config,
                    dtype=t.dtype,
                    status=PENDING,
                    attempt=0,
                )
                for i, t in enumerate(trials)
            )
            # in batches: a large grid (an iterable of trials) streams into the store in flat memory
            while batch := list(itertools.islice(rows, self.CREATE_BATCH)):
                s.execute(insert(TrialRow), batch)
            return job.id

    def get_job(self, job_id: int) -> Job | None:
        with Session(self.engine, expire_on_commit=False) as s:
            return s.get(Job, job_id)

    def list_jobs(self, limit: int = 50) -> list[tuple[Job, dict[str, int]]]:
        with Session(self.engine, expire_on_commit=False) as s:
            jobs = list(s.scalars(select(Job).order_by(Job.id.desc()).limit(limit)))
            counts = self._status_counts(s, [j.id for j in jobs])
            return [(j, counts.get(j.id, {})) for j in jobs]

    def status_counts(self, job_id: int) -> dict[str, int]:
        with Session(self.engine) as s:
            return self._status_counts(s, [job_id]).get(job_id, {})

    @staticmethod
    def _status_counts(s: Session, job_ids: list[int]) -> dict[int, dict[str, int]]:
        out: dict[int, dict[str, int]] = {}
        if not job_ids:
            return out
        q = (
            select(TrialRow.job_id, TrialRow.status, func.count())
            .where(TrialRow.job_id.in_(job_ids))
            .group_by(TrialRow.job_id, TrialRow.status)
        )
        for job_id, status, n in s.execute(q):
            out.setdefault(job_id, {})[status] = n
        return out

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
        with Session(self.engine) as s:
            q = select(Sample.value_ns).where(Sample.trial_id == trial_id).order_by(Sample.seq)
            return list(s.scalars(q))

    def kept_samples(self, trial_id: int) -> list[int]:
        """The samples the trial's summary stands on: all of them but those the measurement discarded
        (summary["discarded"], e.g. taken while the GPU was throttled). Comparisons use these."""
        samples = self.samples(trial_id)
        with Session(self.engine) as s:
            summary = s.scalar(select(TrialRow.summary).where(TrialRow.id == trial_id))
        dropped = set(Summary.from_stored(summary).discarded)
        return [v for i, v in enumerate(samples) if i not in dropped] if dropped else samples

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
                row = r.columns()
                row["_id"] = r.trial_id
                row["finished_at"] = row["finished_at"] or now()
                env = r.environment
                row["environment_id"] = self._environment_id(conn, dict(env)) if env is not None else None
                rows.append(row)
                samples += [
                    {"trial_id": r.trial_id, "seq": i, "value_ns": int(v)} for i, v in enumerate(r.samples_ns)
                ]
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
            conn.execute(_insert_or_ignore(conn, table).values(**row))
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

    # ---- baselines ------------------------------------------------------------------------------
    def set_baseline(
        self,
        name: str,
        job: Job,
        points: Sequence[tuple[str, str, int]],
        *,
        expect_job_id: int | None = None,
        forced: bool = False,
    ) -> tuple[Baseline, int | None]:
        """Point the baseline `name` at `job` with `points` (match_key, env_class, trial_id), and keep the
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
                    [
                        {"baseline_id": row.id, "match_key": k, "env_class": e, "trial_id": t}
                        for k, e, t in points
                    ],
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

    # ---- anomalies and the failure bank ---------------------------------------------------------
    def replace_anomalies(self, job_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """The anomalies of one analysis of the job: a new analysis replaces the previous one."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(Anomaly).where(Anomaly.job_id == job_id))
            if rows:
                s.execute(insert(Anomaly), [{"job_id": job_id, **r} for r in rows])

    def anomalies(self, job_id: int | None = None, fingerprint: str | None = None) -> list[Anomaly]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(Anomaly).order_by(Anomaly.id)
            if job_id is not None:
                q = q.where(Anomaly.job_id == job_id)
            if fingerprint is not None:
                q = q.where(Anomaly.fingerprint == fingerprint)
            return list(s.scalars(q))

    def replace_failures(self, job_id: int, rows: Sequence[dict[str, Any]]) -> None:
        """The failed assertions of one acceptance run of the job (a rerun replaces them)."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(Failure).where(Failure.job_id == job_id))
            if rows:
                s.execute(insert(Failure), [{"job_id": job_id, **r} for r in rows])

    def failures(self, fingerprint: str | None = None) -> list[Failure]:
        with Session(self.engine, expire_on_commit=False) as s:
            q = select(Failure).order_by(Failure.id)
            if fingerprint is not None:
                q = q.where(Failure.fingerprint == fingerprint)
            return list(s.scalars(q))

    # ---- drafts ---------------------------------------------------------------------------------
    def replace_drafts(self, job_id: int, run: dict[str, Any], drafts: Sequence[dict[str, Any]]) -> int:
        """Store one drafting of the job: it replaces the job's drafts nobody reviewed yet and keeps the
        reviewed ones (a rejection must outlive the next drafting: jobs.drafts.review). Returns the run id."""
        with Session(self.engine) as s, s.begin():
            s.execute(delete(DraftRow).where(DraftRow.job_id == job_id, DraftRow.state == DRAFT_NEW))
            kept = select(DraftRow.run_id).where(DraftRow.job_id == job_id)
            s.execute(delete(DraftRun).where(DraftRun.job_id == job_id, DraftRun.id.not_in(kept)))
            row = DraftRun(job_id=job_id, **run)
            s.add(row)
            s.flush()
            if drafts:
                s.execute(insert(DraftRow), [{"run_id": row.id, "job_id": job_id, **d} for d in drafts])
            return row.id

    def drafts(self, job_id: int) -> tuple[DraftRun | None, list[DraftRow]]:
        with Session(self.engine, expire_on_commit=False) as s:
            run = s.scalar(select(DraftRun).where(DraftRun.job_id == job_id).order_by(DraftRun.id.desc()))
            rows = list(s.scalars(select(DraftRow).where(DraftRow.job_id == job_id).order_by(DraftRow.id)))
            return run, rows
