"""Ledger column ``shared_pending`` (issue #28): True on the rows of requests whose usage Redis may lack
(admitted on a process's own share of the limits, settled or written while Redis was unreachable). When
Redis comes back empty, the process that rebuilds the day's counters from the ledger lists these rows' ids in
Redis, so every process adds only the outage usage that the rebuild did not read (gateway.limits.redis).

And ``dropped_fields`` (issue #29): the request fields that translation left out, comma-separated (fields
the gateway does not know, server tools without an equivalent: gateway.translate.policy).

Both nullable, no default: NULL on every other row (and on the rows written before this revision).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        batch.add_column(sa.Column("shared_pending", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("dropped_fields", sa.String(256), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        batch.drop_column("dropped_fields")
        batch.drop_column("shared_pending")
