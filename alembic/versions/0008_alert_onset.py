"""alert onset, and no results over zero samples

An alert keeps the step it first fired at, the last step it fired at, and where it
resolved, instead of one ``step`` overwritten by every repeat (the onset, where a person rolls back to,
was lost)

Old rows: a firing alert's ``step`` was its latest finding, the earliest step still known, so it fills
``first_step`` and ``last_step``; a resolved alert's ``step`` was the step it recovered at, so it fills
``resolved_step`` (its onset was overwritten: left NULL rather than a step that is not the onset).

A metric computed over no samples (``response_length_correct`` when no answer was correct) was stored as
0.0 with n = 0: a fake cliff in every chart and export. Such a metric is now absent; the rows stored so
far are deleted (n = 0 never counted anything; downgrading does not bring them back).

A sample may be ungraded: ``samples.correct`` is NULL for an lm-eval perplexity sample, which has a
score and no right answer (it was stored as wrong, and ``evald samples --wrong-only`` listed them all).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa

from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("first_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("last_step", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("resolved_step", sa.Integer(), nullable=True))
    op.execute("UPDATE alerts SET first_step = step, last_step = step WHERE state = 'firing'")
    op.execute("UPDATE alerts SET resolved_step = step WHERE state = 'resolved'")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_column("step")
    op.execute("DELETE FROM results WHERE n = 0")
    # An lm-eval perplexity sample has no right answer: NULL (not graded), not false (wrong).
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.alter_column("correct", existing_type=sa.Boolean(), nullable=True)
    # The perplexity samples stored so far, as the lm-eval harness wrote them: an empty response (0 tokens)
    # told as its log-likelihood, nothing extracted.
    op.execute(
        "UPDATE samples SET correct = NULL WHERE tokens = 0 AND extracted IS NULL "
        "AND response LIKE 'log-likelihood % nats'"
    )


def downgrade() -> None:
    op.execute("UPDATE samples SET correct = false WHERE correct IS NULL")
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.alter_column("correct", existing_type=sa.Boolean(), nullable=False)
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("step", sa.Integer(), nullable=True))
    op.execute("UPDATE alerts SET step = COALESCE(resolved_step, last_step)")
    with op.batch_alter_table("alerts", schema=None) as batch_op:
        batch_op.drop_column("resolved_step")
        batch_op.drop_column("last_step")
        batch_op.drop_column("first_step")
