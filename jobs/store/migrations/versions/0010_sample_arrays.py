"""A trial's raw samples as one array (issue 46): the `samples` table of one row per sample (trial id,
seq, value) becomes one row per trial (trial id, n, codec, data: jobs.store.sample_codec), every value
kept in the order it was taken. A nightly team schedule wrote about a million sample rows a day; it now
writes 10,000 arrays of about half their raw 8 bytes a value.

The arrays are written a page of trials at a time (flat memory on a large store) into a new table, which
then takes the old one's name; downgrade expands them back into rows.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from jobs.store.sample_codec import pack, unpack

revision = "0010"
down_revision = "0009"

PAGE = 1000  # trials per read

_rows = sa.table(
    "samples",
    sa.column("trial_id", sa.Integer),
    sa.column("seq", sa.Integer),
    sa.column("value_ns", sa.BigInteger),
)


def _arrays_table(name: str) -> sa.Table:
    return sa.table(
        name,
        sa.column("trial_id", sa.Integer),
        sa.column("n", sa.Integer),
        sa.column("codec", sa.String),
        sa.column("data", sa.LargeBinary),
    )


def _create(name: str, *columns: sa.Column) -> None:
    op.create_table(
        name,
        sa.Column("trial_id", sa.Integer(), sa.ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True),
        *columns,
    )


def _take_name(old: str, new: str) -> None:
    """Table `old` becomes `new`; on PostgreSQL its key and foreign key take the names `new` gives them."""
    op.rename_table(old, new)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT {old}_pkey TO {new}_pkey")
        op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT {old}_trial_id_fkey TO {new}_trial_id_fkey")


def _trial_pages(conn: sa.Connection, table: sa.TableClause):
    """(first, last) trial id of each page of PAGE trials that have samples, in id order."""
    after = 0
    while True:
        ids = conn.scalars(
            sa.select(table.c.trial_id)
            .where(table.c.trial_id > after)
            .group_by(table.c.trial_id)
            .order_by(table.c.trial_id)
            .limit(PAGE)
        ).all()
        if not ids:
            return
        yield ids[0], ids[-1]
        after = ids[-1]


def upgrade() -> None:
    conn = op.get_bind()
    _create(
        "sample_arrays",
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("codec", sa.String(8), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )
    arrays = _arrays_table("sample_arrays")
    for first, last in _trial_pages(conn, _rows):
        values: dict[int, list[int]] = {}
        q = (
            sa.select(_rows.c.trial_id, _rows.c.value_ns)
            .where(_rows.c.trial_id.between(first, last))
            .order_by(_rows.c.trial_id, _rows.c.seq)
        )
        for trial_id, value in conn.execute(q):
            values.setdefault(trial_id, []).append(value)
        out = []
        for trial_id, samples in values.items():
            codec, data = pack(samples)
            out.append({"trial_id": trial_id, "n": len(samples), "codec": codec, "data": data})
        conn.execute(sa.insert(arrays), out)
    op.drop_table("samples")
    _take_name("sample_arrays", "samples")


def downgrade() -> None:
    conn = op.get_bind()
    _create(
        "sample_rows",
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("value_ns", sa.BigInteger(), nullable=False),
    )
    arrays = _arrays_table("samples")
    rows = sa.table("sample_rows", *(sa.column(c.name) for c in _rows.c))
    for first, last in _trial_pages(conn, arrays):
        q = sa.select(arrays.c.trial_id, arrays.c.codec, arrays.c.data)
        out = [
            {"trial_id": trial_id, "seq": i, "value_ns": v}
            for trial_id, codec, data in conn.execute(q.where(arrays.c.trial_id.between(first, last)))
            for i, v in enumerate(unpack(codec, data))
        ]
        if out:
            conn.execute(sa.insert(rows), out)
    op.drop_table("samples")
    _take_name("sample_rows", "samples")
