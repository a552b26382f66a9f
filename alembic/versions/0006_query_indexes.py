"""query indexes: a run's checkpoints by step, for the HTTP API's step ranges and newest-step lookups

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_checkpoints_run_step", "checkpoints", ["run_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_checkpoints_run_step", table_name="checkpoints")
