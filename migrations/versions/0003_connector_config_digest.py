"""Connector configs as secrets: each connector's config digest, kept beside the config so that
the audit export can write the digest instead of the values.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 00:00:00+00:00

Existing rows get their digest computed here (the same function the coordinator uses).
Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the test suite proves
they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from connect_protocol.configs import config_digest

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("connectors") as batch:
        batch.add_column(
            sa.Column("config_digest", sa.String(80), server_default="", nullable=False)
        )
    connectors = sa.table(
        "connectors",
        sa.column("group_id", sa.String()),
        sa.column("name", sa.String()),
        sa.column("config", sa.JSON()),
        sa.column("config_digest", sa.String()),
    )
    conn = op.get_bind()
    rows = conn.execute(sa.select(connectors.c.group_id, connectors.c.name, connectors.c.config))
    for group_id, name, config in rows.all():
        conn.execute(
            connectors.update()
            .where(connectors.c.group_id == group_id, connectors.c.name == name)
            .values(
                config_digest=config_digest({str(k): str(v) for k, v in (config or {}).items()})
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("connectors") as batch:
        batch.drop_column("config_digest")
