"""worker groups: per-attempt job history, tp consistency on jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("tp_disagreements", sa.Integer(), nullable=True))
    op.create_table(
        "job_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("engine", sa.String(length=16), nullable=False),
        sa.Column("tp", sa.Integer(), nullable=False),
        sa.Column("dp", sa.Integer(), nullable=False),
        sa.Column("batch_size", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("error_kind", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["eval_jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_attempts_job_id"), ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_attempts_job_id"))
    op.drop_table("job_attempts")
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.drop_column("tp_disagreements")
