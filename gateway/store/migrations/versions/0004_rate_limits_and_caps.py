"""Ledger columns for the token account (issue #33): per request the upstream 429 answers it met
(``rate_limited``: retried, or the last one it ended on), the time waited between its upstream attempts
(``retry_wait_ms``: backoff and Retry-After, not upstream time) and the output cap it asked for
(``max_tokens``), so that a project can see what its calls cost in retries and what their outputs could be
constrained to (``POST /v1/usage/requests``, ``farm drafts account``).

All nullable, no default: NULL on the rows written before this revision.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = (
    ("rate_limited", sa.Integer()),
    ("retry_wait_ms", sa.Float()),
    ("max_tokens", sa.Integer()),
)


def upgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
