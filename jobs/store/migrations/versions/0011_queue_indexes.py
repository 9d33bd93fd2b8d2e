"""The queue's reads by index (issue 46): `ix_trials_job_status_seq` (job_id, status, seq) serves a job's
first pending trial in grid order (what a pool claims), its pending count and its status counts (`farm
jobs list`); `ix_jobs_status` the waiting jobs (queued, running) among a year's.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    op.create_index("ix_trials_job_status_seq", "trials", ["job_id", "status", "seq"])
    op.create_index("ix_jobs_status", "jobs", ["status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status", table_name="jobs")
    op.drop_index("ix_trials_job_status_seq", table_name="trials")
