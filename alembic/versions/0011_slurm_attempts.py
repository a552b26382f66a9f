"""the executor's record of each attempt (issue 21): Slurm job id, nodes, queue wait, run time, exit state

``job_attempts`` gains the scheduler's view of each worker run (all empty for a local run). ``eval_jobs``
gains ``executor_handle``, the handle of the running claim's submission (written right after ``sbatch``
answers, before the daemon moves on, so that a restarted daemon re-attaches instead of submitting again)
and ``executor_state``, where the scheduler has it now (``PENDING (Resources)``, for ``evald status``).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slurm_job_id", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("nodes", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("queue_wait_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("run_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("exit_state", sa.String(length=32), nullable=True))
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("executor_handle", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("executor_state", sa.Text(), nullable=True))


def downgrade() -> None:
    # ALTER TABLE ... DROP COLUMN (SQLite 3.35 and later), never a copy of the table: on SQLite a copy
    # drops eval_jobs, and with foreign keys on that deletes every job's results, samples and history.
    with op.batch_alter_table("eval_jobs", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("executor_state")
        batch_op.drop_column("executor_handle")
    with op.batch_alter_table("job_attempts", schema=None, recreate="never") as batch_op:
        batch_op.drop_column("exit_state")
        batch_op.drop_column("run_s")
        batch_op.drop_column("queue_wait_s")
        batch_op.drop_column("nodes")
        batch_op.drop_column("slurm_job_id")
