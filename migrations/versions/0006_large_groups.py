"""Large groups (issue 24, DESIGN 3.21).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-28 00:00:00+00:00

- `members.stable_since_epoch`: the member epoch at which a member was last sent its current
  assignment. An install moves members whose share does not change to the new epoch in one
  statement without touching it, and a heartbeat from such a member at any epoch from it up to
  its member epoch is answered without a write. Existing rows take their member epoch (the
  narrowest value that is true).
- `groups.compute_requested_at_ms`: when a target computation was last requested, from which
  the group configuration `assignment.interval.ms` paces the next request (NULL: never).

Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the test suite proves
they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("members") as batch:
        batch.add_column(
            sa.Column("stable_since_epoch", sa.Integer(), server_default="0", nullable=False)
        )
    op.execute("UPDATE members SET stable_since_epoch = member_epoch")
    with op.batch_alter_table("groups") as batch:
        batch.add_column(sa.Column("compute_requested_at_ms", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("compute_requested_at_ms")
    with op.batch_alter_table("members") as batch:
        batch.drop_column("stable_since_epoch")
