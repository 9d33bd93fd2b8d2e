"""The review of drafts (`farm drafts review`, `farm drafts promote`): each draft's check in the metric
card's grammar (or why the one it came with does not validate), its review state (new, accepted,
rejected, needs_profiler) with the reason and the time, and the card it was promoted into.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

COLUMNS = ("check_spec", "check_error", "state", "reason", "reviewed_at", "promoted_to")


def upgrade() -> None:
    with op.batch_alter_table("drafts") as batch:
        batch.add_column(sa.Column("check_spec", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("check_error", sa.Text(), nullable=True))
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="new"))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("reviewed_at", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("promoted_to", sa.String(1000), nullable=True))
    op.create_index("ix_drafts_state", "drafts", ["state"])


def downgrade() -> None:
    op.drop_index("ix_drafts_state", table_name="drafts")
    with op.batch_alter_table("drafts") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
