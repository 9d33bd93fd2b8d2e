"""Kernel source shipped with a submitted job (`farm submit`): kernels/ as the submitter's tree had it,
packed once per distinct content (cluster.shipping.pack_kernels), and which packed source each queued job
runs on (the pool's workers load it: cluster.worker).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.create_table(
        "kernel_sources",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("archive", sa.LargeBinary(), nullable=False),
        sa.Column("files", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    with op.batch_alter_table("job_queue") as batch:
        batch.add_column(sa.Column("source_digest", sa.String(64), nullable=True))  # a kernel_sources.digest


def downgrade() -> None:
    with op.batch_alter_table("job_queue") as batch:
        batch.drop_column("source_digest")
    op.drop_table("kernel_sources")
