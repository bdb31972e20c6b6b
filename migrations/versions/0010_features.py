"""Cluster features: `group.version` (issue 27, DESIGN 3.19 "Feature flag").

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 00:00:00+00:00

- `features` (name, level, updated_at, updated_by): the finalized level of each cluster feature,
  which every coordinator of the database re-reads within --acl-refresh-ms and UpdateFeatures
  (`coordinator-svc features update`) sets, each change with a FEATURE_UPDATED event. One row:
  `group.version` = 1 (the connect protocol is served), for new and migrated databases alike,
  so nothing changes for a running installation. `updated_by` names who set the level last
  (`migration` for this row).

Older coordinators run on the migrated schema unchanged (they never read the table, and serve
the connect protocol as level 1 does). Downgrade drops the table, and with it a level 0 an
operator set: the coordinators of the release before serve the connect protocol to everyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "features",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("level", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(1024), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_features")),
    )
    features = sa.table(
        "features",
        sa.column("name", sa.String()),
        sa.column("level", sa.Integer()),
        sa.column("updated_at", sa.DateTime(timezone=True)),
        sa.column("updated_by", sa.String()),
    )
    op.bulk_insert(
        features,
        [
            {
                "name": "group.version",
                "level": 1,
                "updated_at": datetime.now(UTC),
                "updated_by": "migration",
            }
        ],
    )


def downgrade() -> None:
    op.drop_table("features")
