"""Deleting groups and event retention (issue 30, DESIGN 3.20 "DeleteGroup and RemoveMember",
"Event retention bounded by the export").

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07 00:00:00+00:00

- `group_tombstones` (group_id, group_epoch, last_fencing_token, deleted_at, deleted_by): what
  DeleteGroup keeps of a deleted group, so that a group re-created under the same id continues
  its epoch (generation) counter and its fencing tokens (tokens only ever increase, DESIGN 3.18;
  (group, epoch) stays unique in the events). A tombstone counts against neither --max-groups
  nor --max-groups-per-principal.
- `audit_export_progress` (export_name, since_event_id, until_event_id, lowest_unfilled_id, at):
  appended by the audit export after each committed run (its watermark file first); the
  pruner never deletes an event an export still needs.
- `event_pruning` (one row): the highest event id pruned (`pruned_through_event_id`; an export
  run whose range starts at or below it refuses) and the pruning lease (`owner_id`,
  `lease_until`: one coordinator prunes at a time).

Older coordinators run on the migrated schema unchanged (they never delete a group or prune).
Downgrade drops the tables; a group deleted meanwhile and re-created by an older coordinator
would restart its epochs and tokens, so downgrade only with no deleted group to re-create.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "group_tombstones",
        sa.Column("group_id", sa.String(249), nullable=False),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("last_fencing_token", sa.BigInteger(), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("deleted_by", sa.String(1024), nullable=False),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_group_tombstones")),
    )
    op.create_table(
        "audit_export_progress",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("export_name", sa.String(128), nullable=False),
        sa.Column("since_event_id", sa.BigInteger(), nullable=False),
        sa.Column("until_event_id", sa.BigInteger(), nullable=False),
        sa.Column("lowest_unfilled_id", sa.BigInteger(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_export_progress")),
        sqlite_autoincrement=True,
    )
    op.create_index(
        op.f("ix_audit_export_progress_export_name_id"),
        "audit_export_progress",
        ["export_name", "id"],
    )
    op.create_table(
        "event_pruning",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("pruned_through_event_id", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("pruned_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("owner_id", sa.String(), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_event_pruning")),
    )
    pruning = sa.table("event_pruning", sa.column("id", sa.Integer()))
    op.bulk_insert(pruning, [{"id": 1}])


def downgrade() -> None:
    op.drop_table("event_pruning")
    op.drop_index(
        op.f("ix_audit_export_progress_export_name_id"), table_name="audit_export_progress"
    )
    op.drop_table("audit_export_progress")
    op.drop_table("group_tombstones")
