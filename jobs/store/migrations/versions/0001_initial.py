"""The tables of the releases before migrations: jobs, environments, trials, samples, baselines,
baseline_trials, anomalies, failures, draft_runs, drafts.

On a store made before migrations (``Base.metadata.create_all`` at every start, which added new tables
but never new columns) the tables that exist are adopted: a missing table, column or index is added (a
missing column must be nullable), and nothing is dropped.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


# The tables as this revision makes them (frozen here: jobs/store/tables/ moves on with later
# revisions).
# Each function returns fresh Column objects (a Column belongs to one table) and table constraints.
def _fk(target: str, *, cascade: bool = True) -> sa.ForeignKey:
    return sa.ForeignKey(target, ondelete="CASCADE") if cascade else sa.ForeignKey(target)


def _id() -> sa.Column:
    return sa.Column("id", sa.Integer(), primary_key=True)


def _jobs() -> list:
    return [
        _id(),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("cluster", sa.JSON(), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
    ]


def _environments() -> list:
    return [
        _id(),
        sa.Column("fingerprint", sa.String(32), nullable=False, unique=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("device_kind", sa.String(8), nullable=False),
        sa.Column("device_name", sa.String(255), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
    ]


def _trials() -> list:
    return [
        _id(),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("key", sa.String(32), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("backend", sa.String(64), nullable=False),
        sa.Column("baseline", sa.Boolean(), nullable=False),
        sa.Column("shape", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("dtype", sa.String(32), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("worker", sa.String(64), nullable=True),
        sa.Column("gpu_id", sa.String(32), nullable=True),
        sa.Column("environment_id", sa.Integer(), _fk("environments.id", cascade=False), nullable=True),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("median_ns", sa.Float(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("stop_reason", sa.String(32), nullable=True),
        sa.Column("timer", sa.String(32), nullable=True),
        sa.Column("correct", sa.Boolean(), nullable=True),
        sa.Column("correctness", sa.JSON(), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("memory", sa.JSON(), nullable=True),
        sa.Column("resources", sa.JSON(), nullable=True),
        sa.UniqueConstraint("job_id", "key", name="uq_trial_job_key"),
    ]


def _samples() -> list:
    return [
        sa.Column("trial_id", sa.Integer(), _fk("trials.id"), primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("value_ns", sa.BigInteger(), nullable=False),
    ]


def _baselines() -> list:
    return [
        _id(),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    ]


def _baseline_trials() -> list:
    return [
        _id(),
        sa.Column("baseline_id", sa.Integer(), _fk("baselines.id"), nullable=False),
        sa.Column("match_key", sa.String(32), nullable=False),
        sa.Column("env_class", sa.String(255), nullable=False),
        sa.Column("trial_id", sa.Integer(), _fk("trials.id"), nullable=False),
        sa.UniqueConstraint("baseline_id", "match_key", name="uq_baseline_match"),
    ]


def _anomalies() -> list:
    return [
        _id(),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("trial_id", sa.Integer(), _fk("trials.id"), nullable=True),
        sa.Column("baseline_trial_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("severity", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    ]


def _failures() -> list:
    return [
        _id(),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("trial_id", sa.Integer(), _fk("trials.id"), nullable=True),
        sa.Column("card", sa.String(200), nullable=False),
        sa.Column("assertion", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("fingerprint", sa.String(32), nullable=False),
        sa.Column("label", sa.String(500), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("tag", sa.String(200), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    ]


def _draft_runs() -> list:
    return [
        _id(),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("task", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("offline", sa.Boolean(), nullable=False),
        sa.Column("cached", sa.Boolean(), nullable=False),
        sa.Column("anomalies", sa.Integer(), nullable=False),
        sa.Column("sent", sa.Integer(), nullable=False),
        sa.Column("raw_bytes", sa.Integer(), nullable=False),
        sa.Column("compressed_bytes", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("batch", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    ]


def _drafts() -> list:
    return [
        _id(),
        sa.Column("run_id", sa.Integer(), _fk("draft_runs.id"), nullable=False),
        sa.Column("job_id", sa.Integer(), _fk("jobs.id"), nullable=False),
        sa.Column("assertion", sa.Text(), nullable=False),
        sa.Column("verify_how", sa.Text(), nullable=False),
        sa.Column("failure_signature", sa.Text(), nullable=False),
        sa.Column("needs_local_profiler", sa.Boolean(), nullable=False),
        sa.Column("fingerprints", sa.JSON(), nullable=False),
        sa.Column("offline", sa.Boolean(), nullable=False),
    ]


# (table, its columns and constraints, its indexed columns), in foreign-key order
TABLES: list[tuple[str, Callable[[], list], list[str]]] = [
    ("jobs", _jobs, ["spec_hash"]),
    ("environments", _environments, []),
    ("trials", _trials, ["job_id", "status"]),
    ("samples", _samples, []),
    ("baselines", _baselines, ["job_id"]),
    ("baseline_trials", _baseline_trials, ["baseline_id", "match_key"]),
    ("anomalies", _anomalies, ["job_id", "kind", "fingerprint"]),
    ("failures", _failures, ["job_id", "fingerprint"]),
    ("draft_runs", _draft_runs, ["job_id"]),
    ("drafts", _drafts, ["run_id", "job_id"]),
]


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    present = set(insp.get_table_names())
    for name, parts, indexed in TABLES:
        if name not in present:
            op.create_table(name, *parts())
            for col in indexed:
                op.create_index(f"ix_{name}_{col}", name, [col])
            continue
        # a table made before migrations: add what it lacks
        have = {c["name"] for c in insp.get_columns(name)}
        missing = [c for c in parts() if isinstance(c, sa.Column) and c.name not in have]
        for c in missing:
            if not c.nullable:
                raise RuntimeError(
                    f"cannot adopt table {name}: it lacks the column {c.name}, which must have a value; "
                    "this store was not made by the farm"
                )
        if missing:
            with op.batch_alter_table(name) as batch:
                for c in missing:
                    batch.add_column(c)
        have_ix = {ix["name"] for ix in insp.get_indexes(name)}
        for col in indexed:
            if f"ix_{name}_{col}" not in have_ix:
                op.create_index(f"ix_{name}_{col}", name, [col])


def downgrade() -> None:
    for name, _, _ in reversed(TABLES):
        op.drop_table(name)  # its indexes go with it
