"""The tables of the first release: gateway_api_keys, gateway_meta, gateway_ledger.

On a database made before migrations (the old ``create_tables``: ``metadata.create_all`` and then the
columns added since, at every start) the tables that exist are adopted: a missing table, column or index
is added (a missing column must be nullable, as every column added that way was), and nothing is dropped.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


# The tables as this revision makes them (frozen here: gateway/store/db.py moves on with later revisions).
def _api_keys() -> list[sa.Column]:
    return [
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("rotated_to", sa.String(32), nullable=True),
    ]


def _meta() -> list[sa.Column]:
    return [
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(256), nullable=False),
    ]


def _ledger() -> list[sa.Column]:
    return [
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("ts", sa.DateTime(timezone=True), nullable=False),
        sa.Column("endpoint", sa.String(32), nullable=False),
        sa.Column("upstream_request_id", sa.String(128), nullable=True),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("key_id", sa.String(32), nullable=True),
        sa.Column("public_model", sa.String(128), nullable=True),
        sa.Column("upstream_model", sa.String(128), nullable=True),
        sa.Column("provider", sa.String(64), nullable=True),
        sa.Column("task", sa.String(128), nullable=True),
        sa.Column("session_id", sa.String(128), nullable=True),
        sa.Column("stream", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("http_status", sa.Integer(), nullable=True),
        sa.Column("error_class", sa.String(64), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("tokens_estimated", sa.Boolean(), nullable=False),
        sa.Column("latency_ms", sa.Float(), nullable=False),
        sa.Column("upstream_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("queue_wait_ms", sa.Float(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=True),  # added to existing tables at start before
    ]


# (table, its columns, its primary key, its indexes as (name, column))
TABLES: list[tuple[str, Callable[[], list[sa.Column]], str, list[tuple[str, str]]]] = [
    ("gateway_api_keys", _api_keys, "id", [("ix_gateway_api_keys_project", "project")]),
    ("gateway_meta", _meta, "name", []),
    (
        "gateway_ledger",
        _ledger,
        "request_id",
        [("ix_gateway_ledger_project", "project"), ("ix_gateway_ledger_ts", "ts")],
    ),
]


def upgrade() -> None:
    insp = sa.inspect(op.get_bind())
    present = set(insp.get_table_names())
    for name, columns, pk, indexes in TABLES:
        if name not in present:
            op.create_table(name, *columns(), sa.PrimaryKeyConstraint(pk))
            for ix, col in indexes:
                op.create_index(ix, name, [col])
            continue
        # a table made before migrations: add what it lacks
        have = {c["name"] for c in insp.get_columns(name)}
        missing = [c for c in columns() if c.name not in have]
        for c in missing:
            if not c.nullable:
                raise RuntimeError(
                    f"cannot adopt table {name}: it lacks the column {c.name}, which must have a value; "
                    "this database was not made by the gateway"
                )
        if missing:
            with op.batch_alter_table(name) as batch:
                for c in missing:
                    batch.add_column(c)
        have_ix = {ix["name"] for ix in insp.get_indexes(name)}
        for ix, col in indexes:
            if ix not in have_ix:
                op.create_index(ix, name, [col])


def downgrade() -> None:
    for name, _, _, indexes in reversed(TABLES):
        for ix, _ in indexes:
            op.drop_index(ix, table_name=name)
        op.drop_table(name)
