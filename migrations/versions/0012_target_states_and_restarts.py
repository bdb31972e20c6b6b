"""Target states and restarts (issue 29, DESIGN 3.20 "Target states", "Restarts").

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06 00:00:00+00:00

- `connectors.target_state` ('STARTED' for existing connectors): set by PauseConnector,
  ResumeConnector and StopConnector and kept by PutConnector. A STOPPED connector keeps its
  task_count for resume; the assignment sees an effective task count of 0.
- `resource_statuses.auto_attempts` (0), `auto_restart_at_ms` (NULL: none pending) and
  `auto_exhausted` (false): the automatic restarts of a resource reported FAILED (consecutive
  attempts, when the next one is due, whether they gave up). `restart_count` (migration 0011)
  stays the count of every restart request, manual or automatic.

Older coordinators run on the migrated schema unchanged: they never read the new columns, so
they treat every connector as STARTED and arm no automatic restart (a connector paused or
stopped under a newer coordinator runs again under an older one: downgrade only after resuming
what you paused or stopped). Downgrade drops the columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("connectors") as batch:
        batch.add_column(
            sa.Column("target_state", sa.String(16), server_default="STARTED", nullable=False)
        )
        batch.create_check_constraint(
            op.f("ck_connectors_target_state"), "target_state IN ('STARTED', 'PAUSED', 'STOPPED')"
        )
    with op.batch_alter_table("resource_statuses") as batch:
        batch.add_column(
            sa.Column("auto_attempts", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("auto_restart_at_ms", sa.BigInteger(), nullable=True))
        batch.add_column(
            sa.Column("auto_exhausted", sa.Boolean(), server_default=sa.false(), nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("resource_statuses") as batch:
        batch.drop_column("auto_exhausted")
        batch.drop_column("auto_restart_at_ms")
        batch.drop_column("auto_attempts")
    with op.batch_alter_table("connectors") as batch:
        batch.drop_constraint(op.f("ck_connectors_target_state"), type_="check")
        batch.drop_column("target_state")
