"""tracker messages in the alert outbox (issue 22)

A tracker's message (one evaluation's results for MLflow, W&B or TensorBoard) is queued in ``alert_outbox``
in the result's transaction and sent by the relay like a webhook's, its endpoint ``tracker:<name>``; it
belongs to no alert, so ``alert_id`` may be empty. Existing rows keep theirs.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("alert_outbox", schema=None) as batch_op:
        batch_op.alter_column("alert_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM alert_outbox WHERE alert_id IS NULL")
    with op.batch_alter_table("alert_outbox", schema=None) as batch_op:
        batch_op.alter_column("alert_id", existing_type=sa.Integer(), nullable=False)
