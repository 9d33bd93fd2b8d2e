"""placeholder: being written (issue 46: samples as one array per trial)

Revision ID: 0010
Revises: 0009
"""

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
