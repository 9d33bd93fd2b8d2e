"""The history of named baselines: every `farm baseline set`, which job it set the name to, from which,
and whether it was forced (`farm baseline list --history`). Existing baselines get one row each, their
current setting (the moves before this revision were not kept). A store from before migrations that
has the table already keeps it.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    if "baseline_history" in sa.inspect(op.get_bind()).get_table_names():
        return  # a store made before migrations by a release that had the table: adopted as it is
    op.create_table(
        "baseline_history",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("previous_job_id", sa.Integer(), nullable=True),
        sa.Column("family", sa.String(64), nullable=False),
        sa.Column("spec_name", sa.String(200), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=True),
        sa.Column("points", sa.Integer(), nullable=False),
        sa.Column("forced", sa.Boolean(), nullable=False),
        sa.Column("set_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_baseline_history_name", "baseline_history", ["name"])
    op.execute(
        "INSERT INTO baseline_history (name, job_id, previous_job_id, family, spec_name, git_commit, points, "
        "forced, set_at) "
        "SELECT b.name, b.job_id, NULL, b.family, j.name, b.git_commit, "
        "(SELECT count(*) FROM baseline_trials t WHERE t.baseline_id = b.id), false, b.created_at "
        "FROM baselines b JOIN jobs j ON j.id = b.job_id ORDER BY b.id"
    )


def downgrade() -> None:
    op.drop_table("baseline_history")
