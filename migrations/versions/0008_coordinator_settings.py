"""Coordinator settings: the stored form of large resource sets (issue 24).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 00:00:00+00:00

- `coordinator_settings` (name, value): settings every coordinator of the database reads at
  start. `stored_set_form` is `ranges` (sets of more than 256 tasks in the members and target
  tables and in events stored as runs of task numbers, `coordinator_svc/store/stored_sets.py`)
  or `plain` (every task an object, as every earlier release writes and reads).

A release before this one reads a ranged set as one without tasks, so a database that already
holds groups starts at `plain`: coordinators of the older release may still be running during the
rolling update that follows this migration. Once every coordinator runs this release, an
operator switches to `ranges` (`coordinator-svc settings set stored_set_form ranges`) and
restarts them. A database without groups (a new installation) starts at `ranges`.

Downgrade refuses while the setting is `ranges` (older coordinators could not read what was
written): set it to `plain`, restart the coordinators and let every large group be rewritten, or
restore a backup.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "coordinator_settings",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("value", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_coordinator_settings")),
    )
    conn = op.get_bind()
    has_groups = conn.execute(sa.text("SELECT 1 FROM groups LIMIT 1")).first() is not None
    settings = sa.table(
        "coordinator_settings", sa.column("name", sa.String()), sa.column("value", sa.String())
    )
    op.bulk_insert(
        settings, [{"name": "stored_set_form", "value": "plain" if has_groups else "ranges"}]
    )


def downgrade() -> None:
    conn = op.get_bind()
    form = conn.execute(
        sa.text("SELECT value FROM coordinator_settings WHERE name = 'stored_set_form'")
    ).scalar_one_or_none()
    if form == "ranges" and conn.execute(sa.text("SELECT 1 FROM groups LIMIT 1")).first():
        raise RuntimeError(
            "stored_set_form is 'ranges': the schema before revision 0008 belongs to coordinators "
            "that read large ranged sets as empty. Set it to 'plain' (coordinator-svc settings "
            "set stored_set_form plain), restart the coordinators so that every group is "
            "written again, then downgrade; or restore a backup."
        )
    op.drop_table("coordinator_settings")
