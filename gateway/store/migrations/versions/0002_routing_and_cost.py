"""Ledger columns for routing and cost (issue #16): which deployment answered, which public model was asked
for when a fallback answered, the wire-format translation used, the request's cost in US dollars, and the
cached parts of its input tokens (cache reads and cache writes).

All nullable: rows written before this revision have none of them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

COLUMNS = (
    ("deployment", sa.String(128)),  # the deployment's name (gateway config: models.<m>.deployments)
    ("fallback_from", sa.String(128)),  # the public model the client asked for, when a fallback answered
    ("translation", sa.String(32)),  # e.g. "messages->chat": the client's format and the upstream's
    ("cost_usd", sa.Float()),
    ("cached_input_tokens", sa.Integer()),  # part of input_tokens: cache reads
    ("cache_write_tokens", sa.Integer()),  # part of input_tokens: Anthropic's cache writes
)


def upgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        for name, type_ in COLUMNS:
            batch.add_column(sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("gateway_ledger") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
