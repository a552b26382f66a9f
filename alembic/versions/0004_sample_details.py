"""sample details: per-sample reward, entropy and error; a job's problems (inputs left out); NaN results

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Every new column is nullable and left NULL on existing rows: results stored before this revision had
    # no rewards, and whether their inputs had problems is unknown, which 0 would misstate.
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reward", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("entropy", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("error", sa.Text(), nullable=True))
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("problems", sa.Integer(), nullable=True))
    op.create_table(
        "sample_problems",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("where", sa.Text(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("prompt_id", sa.String(length=200), nullable=True),
        sa.Column("index", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["eval_jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sample_problems", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sample_problems_job_id"), ["job_id"], unique=False)
    # A NaN metric (a diverged checkpoint's perplexity) is stored; SQLite can only keep it as NULL.
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.alter_column("value", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    # NaN results (NULL on SQLite) cannot go back under NOT NULL: they are dropped with the revision.
    op.execute("DELETE FROM results WHERE value IS NULL")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.alter_column("value", existing_type=sa.Float(), nullable=False)
    with op.batch_alter_table("sample_problems", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sample_problems_job_id"))
    op.drop_table("sample_problems")
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.drop_column("problems")
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_column("error")
        batch_op.drop_column("entropy")
        batch_op.drop_column("reward")
