"""One point's series found by index: `trials.shape_key` (jobs.store.tables.trials.shape_key of the
trial's shape), backfilled for every existing trial, and the index `ix_trials_series` (family, backend,
shape_key) that `farm history` reads one series through; `baseline_trials.trial_id` indexed ("is this
trial a baseline's", and the cascade when a trial goes).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from jobs.store.tables.trials import shape_key

revision = "0007"
down_revision = "0006"

PAGE = 5000


def _backfill(conn: sa.Connection) -> None:
    """Every trial's shape_key, a page of trials at a time (flat memory on a large store)."""
    trials = sa.table("trials", sa.column("id", sa.Integer), sa.column("shape", sa.JSON))
    set_key = sa.text("UPDATE trials SET shape_key = :key WHERE id = :id")
    after = 0
    while True:
        page = conn.execute(
            sa.select(trials.c.id, trials.c.shape)
            .where(trials.c.id > after)
            .order_by(trials.c.id)
            .limit(PAGE)
        ).all()
        if not page:
            return
        conn.execute(set_key, [{"id": i, "key": shape_key(shape or {})} for i, shape in page])
        after = page[-1][0]


def upgrade() -> None:
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("shape_key", sa.String(32), nullable=True))
    _backfill(op.get_bind())
    op.create_index("ix_trials_series", "trials", ["family", "backend", "shape_key"])
    op.create_index("ix_baseline_trials_trial_id", "baseline_trials", ["trial_id"])


def downgrade() -> None:
    op.drop_index("ix_baseline_trials_trial_id", table_name="baseline_trials")
    op.drop_index("ix_trials_series", table_name="trials")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("shape_key")
