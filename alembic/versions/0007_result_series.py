"""result series: each (run, task, stage) with a succeeded job, for "latest of every run"

Written by ``complete_job`` in the transaction that stores a job's results; filled here from the jobs
that already succeeded.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "result_series",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "task", "stage"),
    )
    op.execute(
        "INSERT INTO result_series (run_id, task, stage) "
        "SELECT DISTINCT c.run_id, j.task, j.stage FROM eval_jobs j "
        "JOIN checkpoints c ON c.id = j.checkpoint_id WHERE j.state = 'succeeded'"
    )


def downgrade() -> None:
    op.drop_table("result_series")
