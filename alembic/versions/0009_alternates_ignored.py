"""checkpoint alternates and ignored folders (issue 23)

One training step saved in two shapes (OpenRLHF's ``_actor/global_stepN`` and ``global_stepN_hf``) is one
checkpoint: the shape not evaluated is recorded in ``checkpoint_alternates`` against the one that is. A
folder that could be a checkpoint and is not taken (named as being written, no layout recognised) is in
``ignored_folders`` with its reason, for ``evald status``. Both start empty.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "checkpoint_alternates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("checkpoint_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("layout", sa.String(length=32), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["checkpoint_id"], ["checkpoints.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "path", name="uq_checkpoint_alternates_run_path"),
    )
    with op.batch_alter_table("checkpoint_alternates", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_checkpoint_alternates_checkpoint_id"), ["checkpoint_id"], unique=False
        )
    op.create_table(
        "ignored_folders",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("name", sa.String(length=500), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "path", name="uq_ignored_folders_run_path"),
    )


def downgrade() -> None:
    op.drop_table("ignored_folders")
    with op.batch_alter_table("checkpoint_alternates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_checkpoint_alternates_checkpoint_id"))
    op.drop_table("checkpoint_alternates")
