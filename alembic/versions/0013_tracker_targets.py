"""tracker deliveries keyed by target (issue 32)

``alert_outbox.target``: where a tracker's message goes (a key of the tracker's server and experiment, W&B
project, TensorBoard folder), so a tracker pointed somewhere else sends its runs' history there instead of
counting it as already delivered. Rows stored before (webhooks', and trackers' queued under the old scheme)
keep it empty; a tracker takes its own on its first start.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("alert_outbox", schema=None, recreate="never") as batch_op:
        batch_op.add_column(sa.Column("target", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_alert_outbox_endpoint_target", ["endpoint", "target"], unique=False)


def downgrade() -> None:
    # DROP COLUMN, never a copy of the table (see 0011: a copy of a table others reference loses rows).
    # A tracker's rows of every target stay, under their own event ids: each is still sent at most once.
    with op.batch_alter_table("alert_outbox", schema=None, recreate="never") as batch_op:
        batch_op.drop_index("ix_alert_outbox_endpoint_target")
        batch_op.drop_column("target")
