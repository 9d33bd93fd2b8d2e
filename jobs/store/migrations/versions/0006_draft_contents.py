"""What each draft's anomalies said when they were sent (`drafts.contents`: fingerprint -> a digest of the
compressed item the model read), so that a rejected draft keeps only the same content from the model: an
anomaly at the same point that measures something new is sent again.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("drafts") as batch:
        batch.add_column(sa.Column("contents", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("drafts") as batch:
        batch.drop_column("contents")
