"""`comparisons`: each `farm compare` run, kept: the two jobs (and selectors), its thresholds, the verdict
counts and what differed between the two jobs' environments (issue 45), so an A/B across a torch upgrade
stays on record beside the jobs it compared.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"


def upgrade() -> None:
    op.create_table(
        "comparisons",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_a", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_b", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=True),
        sa.Column("selector_a", sa.String(500), nullable=True),
        sa.Column("selector_b", sa.String(500), nullable=True),
        sa.Column("min_effect", sa.Float(), nullable=False),
        sa.Column("alpha", sa.Float(), nullable=False),
        sa.Column("verdicts", sa.JSON(), nullable=False),
        sa.Column("environment", sa.JSON(), nullable=False),
        sa.Column("ambiguous", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_comparisons_job_a", "comparisons", ["job_a"])
    op.create_index("ix_comparisons_job_b", "comparisons", ["job_b"])


def downgrade() -> None:
    op.drop_table("comparisons")
