"""A cluster shared fairly (issue 47): each queued job's project and the GPU it needs, when it last got a
worker (its wait, for aging); each owner's decayed usage (worker-seconds, remembered across pool restarts);
the policy a live pool serves by (weights, quotas, its GPU types), read by `farm jobs list` and
`farm pool status`; the GPU type a trial ran on; and every preemption (trial, pool, time it had run).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    with op.batch_alter_table("job_queue") as batch:
        batch.add_column(sa.Column("project", sa.String(128), nullable=True))
        batch.add_column(sa.Column("gpu_type", sa.String(64), nullable=True))
        batch.add_column(sa.Column("min_gpu_memory_gb", sa.Float(), nullable=True))
        batch.add_column(sa.Column("last_taken_at", sa.DateTime(), nullable=True))
    with op.batch_alter_table("farm_pools") as batch:
        batch.add_column(sa.Column("policy", sa.JSON(), nullable=True))
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(64), nullable=True))
    op.create_table(
        "owner_usage",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("usage_s", sa.Float(), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "trial_preemptions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("trial_id", sa.Integer(), sa.ForeignKey("trials.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("ran_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_trial_preemptions_trial_id", "trial_preemptions", ["trial_id"])
    op.create_index("ix_trial_preemptions_job_id", "trial_preemptions", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_trial_preemptions_job_id", table_name="trial_preemptions")
    op.drop_index("ix_trial_preemptions_trial_id", table_name="trial_preemptions")
    op.drop_table("trial_preemptions")
    op.drop_table("owner_usage")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("gpu_type")
    with op.batch_alter_table("farm_pools") as batch:
        batch.drop_column("policy")
    with op.batch_alter_table("job_queue") as batch:
        batch.drop_column("last_taken_at")
        batch.drop_column("min_gpu_memory_gb")
        batch.drop_column("gpu_type")
        batch.drop_column("project")
