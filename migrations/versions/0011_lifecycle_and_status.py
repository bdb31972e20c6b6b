"""Connector lifecycle: members' lifecycle revisions and resources' statuses (issue 28, DESIGN
3.20).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 00:00:00+00:00

- `members.lifecycle_revision` (0 for existing members): raised in the transaction of any change
  to what a member must know about what it holds (a grant, a held connector's config), and
  carried in every heartbeat, classic Heartbeat and SyncGroup answer.
- `resource_statuses` (group_id, connector, task (-1: the connector), state, member_id,
  fencing_token, restart_count, trace, trace_digest, reported_at_ms): what each resource's
  holder last reported through ConnectGroupReportStatus; `trace_digest` is the trace's keyed
  digest (as config digests are, migration 0005; "" for no trace), what the audit export and
  the STATUS_CHANGED events carry instead of the text. Rows are deleted with their connector
  or group.

Older coordinators run on the migrated schema unchanged (they never read either). Downgrade
drops both: statuses are reports, re-sent by the agents of a coordinator that has them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("members") as batch:
        batch.add_column(
            sa.Column("lifecycle_revision", sa.BigInteger(), server_default="0", nullable=False)
        )
    op.create_table(
        "resource_statuses",
        sa.Column("group_id", sa.String(249), nullable=False),
        sa.Column("connector", sa.String(), nullable=False),
        sa.Column("task", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("member_id", sa.String(), nullable=False),
        sa.Column("fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("restart_count", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("trace", sa.Text(), server_default="", nullable=False),
        sa.Column("trace_digest", sa.String(80), server_default="", nullable=False),
        sa.Column("reported_at_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(
            "state IN ('RUNNING', 'PAUSED', 'FAILED', 'STOPPED', 'RESTARTING')",
            name=op.f("ck_resource_statuses_state"),
        ),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["groups.group_id"],
            name=op.f("fk_resource_statuses_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", "connector", "task", name=op.f("pk_resource_statuses")),
    )


def downgrade() -> None:
    op.drop_table("resource_statuses")
    with op.batch_alter_table("members") as batch:
        batch.drop_column("lifecycle_revision")
