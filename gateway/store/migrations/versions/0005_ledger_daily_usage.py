"""The ledger's reads at a year of a team's data (issue #46).

``gateway_usage_daily``: the ledger summed per UTC day, project, task, key, public model and agent session
('' where a row has none), kept by the ledger writer in the transaction that writes the rows
(gateway.store.ledger_daily), filled here from the rows already written. `farm gateway usage` reads it
(by task, key, model, project or session, one task's, one session's, the top sessions): a row per day
and group instead of every request. Indexed by its key (day first) and by task and by session.

The index on the ledger's ``project`` alone goes: no read needs it, and it drew both planners away from
the right one. Measured on 219,176 rows (benchmarks/scale_ledger.py): PostgreSQL answered the rows of 100
request ids of one project with a BitmapAnd of it and the primary key (every row of the project read from
the index), SQLite with it alone (a quarter of the table), and SQLite today's usage (``project IS NOT
NULL``) by it, the whole table, instead of by ``ts``. Today's usage and the budget rebuild read by ``ts``,
request ids by the primary key (tests/gateway/store/test_ledger_plans.py checks each plan on PostgreSQL).

Filling the table reads the ledger once (benchmarks/results/scale-ledger-*.md: "migration 0005").

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

GROUP = ("project", "task", "key_id", "public_model", "session_id")
STATUSES = ("ok", "error", "rejected", "cancelled")


def upgrade() -> None:
    op.create_table(
        "gateway_usage_daily",
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("task", sa.String(128), nullable=False),
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("public_model", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_usd", sa.Float(), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("rate_limited", sa.Integer(), nullable=False),
        sa.Column("retry_wait_ms", sa.Float(), nullable=False),
        *(sa.Column(s, sa.Integer(), nullable=False) for s in STATUSES),
        sa.PrimaryKeyConstraint("day", *GROUP),
    )
    op.create_index("ix_gateway_usage_daily_task_day", "gateway_usage_daily", ["task", "day"])
    op.create_index("ix_gateway_usage_daily_session_id_day", "gateway_usage_daily", ["session_id", "day"])
    pg = op.get_bind().dialect.name == "postgresql"
    day = "(ts AT TIME ZONE 'UTC')::date" if pg else "date(ts)"  # SQLite keeps naive UTC
    group = ", ".join(f"COALESCE({c}, '')" for c in GROUP)
    statuses = ", ".join(f"SUM(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)" for s in STATUSES)
    op.execute(
        f"INSERT INTO gateway_usage_daily (day, {', '.join(GROUP)}, requests, input_tokens, output_tokens, "
        f"cost_usd, retries, rate_limited, retry_wait_ms, {', '.join(STATUSES)}) "
        f"SELECT {day}, {group}, COUNT(*), SUM(input_tokens), SUM(output_tokens), SUM(cost_usd), "
        f"SUM(retries), SUM(COALESCE(rate_limited, 0)), SUM(COALESCE(retry_wait_ms, 0)), {statuses} "
        f"FROM gateway_ledger GROUP BY {day}, {group}"
    )
    op.drop_index("ix_gateway_ledger_project", table_name="gateway_ledger")


def downgrade() -> None:
    op.create_index("ix_gateway_ledger_project", "gateway_ledger", ["project"])
    op.drop_table("gateway_usage_daily")
