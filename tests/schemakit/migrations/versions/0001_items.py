"""The test kit's first table, kit_items; one made before migrations (same name) is adopted as it is.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    if "kit_items" in sa.inspect(op.get_bind()).get_table_names():
        return  # made before migrations: adopted
    op.create_table(
        "kit_items",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
    )
