"""Principals and ACLs: the principal each member is bound to, and the access control list.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24 00:00:00+00:00

Members from before this revision get principal "" (unbound): the next caller that acts as such
a member adopts it. Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the
test suite proves they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRINCIPAL = sa.String(1024)
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("members") as batch:
        batch.add_column(sa.Column("principal", PRINCIPAL, server_default="", nullable=False))
    op.create_table(
        "acls",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("principal", PRINCIPAL, nullable=False),
        sa.Column("operation", sa.String(32), nullable=False),
        sa.Column("resource_type", sa.String(16), nullable=False),
        sa.Column("pattern_type", sa.String(16), nullable=False),
        sa.Column("pattern", sa.String(249), nullable=False),
        sa.Column("permission", sa.String(8), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_acls")),
        sqlite_autoincrement=True,
    )


def downgrade() -> None:
    op.drop_table("acls")
    with op.batch_alter_table("members") as batch:
        batch.drop_column("principal")
