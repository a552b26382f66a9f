"""scheduling: checkpoint plans, run frequency state, deferral, events

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A checkpoint made ready before this revision was queued for every task, which is what "due" means.
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "plan",
                sa.Enum("due", "skipped", "waiting", name="checkpoint_plan", native_enum=False, length=16),
                nullable=True,
            )
        )
        batch_op.add_column(sa.Column("plan_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("planned_at", sa.DateTime(timezone=True), nullable=True))
    op.execute(
        "UPDATE checkpoints SET plan = 'due', plan_reason = 'queued before scheduling', "
        "planned_at = ready_at WHERE state = 'ready'"
    )

    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("wait_reason", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("deferred_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("stuck_at", sa.DateTime(timezone=True), nullable=True))

    op.create_table(
        "run_schedules",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("anchor_step", sa.Integer(), nullable=False),
        sa.Column("anchor_epoch", sa.Integer(), nullable=False),
        sa.Column("anchor_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("evaluated", sa.Integer(), nullable=False),
        sa.Column("every_steps", sa.Integer(), nullable=True),
        sa.Column("every_reason", sa.Text(), nullable=True),
        sa.Column("last_claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id"),
    )
    # Every checkpoint evaluated so far counted: the counters start from the newest of them, not from 0.
    op.execute(
        "INSERT INTO run_schedules (run_id, anchor_step, anchor_epoch, anchor_at, evaluated, updated_at) "
        "SELECT r.id, COALESCE(MAX(c.step), 0), COALESCE(MAX(c.epoch), 0), "
        "COALESCE(MAX(c.ready_at), r.created_at), COUNT(c.id), COALESCE(MAX(c.ready_at), r.created_at) "
        "FROM runs r LEFT JOIN checkpoints c ON c.run_id = r.id AND c.plan = 'due' "
        "GROUP BY r.id, r.created_at"
    )
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["eval_jobs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_created_at"), ["created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_created_at"))
    op.drop_table("events")
    op.drop_table("run_schedules")
    with op.batch_alter_table("eval_jobs", schema=None) as batch_op:
        batch_op.drop_column("stuck_at")
        batch_op.drop_column("deferred_at")
        batch_op.drop_column("wait_reason")
    with op.batch_alter_table("checkpoints", schema=None) as batch_op:
        batch_op.drop_column("planned_at")
        batch_op.drop_column("plan_reason")
        batch_op.drop_column("plan")
