"""a code task's sample (issue 34): its verdict, tests passed of the total, tests by verdict, the first
failing test and what the program wrote

Every column is empty for the samples of other task kinds, and for those stored before.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("verdict", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("tests_passed", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("tests_total", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("verdicts", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("failed_test", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("failed_output", sa.Text(), nullable=True))


def downgrade() -> None:
    # DROP COLUMN, never a copy of the table (see 0011: a copy of a table others reference loses rows).
    with op.batch_alter_table("samples", schema=None, recreate="never") as batch_op:
        for column in ("failed_output", "failed_test", "verdicts", "tests_total", "tests_passed", "verdict"):
            batch_op.drop_column(column)
