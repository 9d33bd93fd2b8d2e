"""The queue (`farm submit`, `farm pool serve`): jobs waiting for the pool with their priority and owner,
the pending trials a pool has taken, what happened to each queued job (`farm jobs logs`), and the pools
alive.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "job_queue",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("owner", sa.String(128), nullable=False),
        sa.Column("submitted_at", sa.DateTime(), nullable=False),
        sa.Column("source", sa.String(128), nullable=True),
        sa.Column("notify", sa.String(2048), nullable=True),
    )
    op.create_index("ix_job_queue_priority", "job_queue", ["priority"])
    op.create_table(
        "trial_claims",
        sa.Column("trial_id", sa.Integer(), sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("claimed_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_trial_claims_job_id", "trial_claims", ["job_id"])
    op.create_index("ix_trial_claims_pool", "trial_claims", ["pool"])
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("line", sa.Text(), nullable=False),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"])
    op.create_table(
        "farm_pools",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("workers", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("seen_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("farm_pools")
    op.drop_table("job_events")
    op.drop_table("trial_claims")
    op.drop_table("job_queue")
