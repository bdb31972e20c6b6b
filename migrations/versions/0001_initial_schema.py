"""Initial schema: groups, leases, members, catalogue, target assignment, configs, audit events.

Revision ID: 0001
Revises:
Create Date: 2026-11-22 00:00:00+00:00

Hand-written to match coordinator_svc/store/schema.py (constraint names follow its naming
convention); `alembic check` in the test suite proves they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

GROUP_ID = sa.String(249)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
TIMESTAMP = sa.DateTime(timezone=True)


def _group_id(table: str, fk_table: str | None = "groups") -> sa.Column[str]:
    if fk_table is None:
        return sa.Column("group_id", GROUP_ID, nullable=False)
    return sa.Column(
        "group_id",
        GROUP_ID,
        sa.ForeignKey(
            f"{fk_table}.group_id",
            name=op.f(f"fk_{table}_group_id_{fk_table}"),
            ondelete="CASCADE",
        ),
        nullable=False,
    )


def upgrade() -> None:
    op.create_table(
        "groups",
        sa.Column("group_id", GROUP_ID, nullable=False),
        sa.Column("group_type", sa.String(16), nullable=False),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("created_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("assignor_member_id", sa.String(), nullable=True),
        sa.Column("compute_requested_epoch", sa.Integer(), nullable=True),
        sa.Column("excluded_assignors", JSON, nullable=False),
        sa.Column("compute_not_before_ms", sa.BigInteger(), nullable=True),
        sa.Column("last_assignment_error", sa.Integer(), nullable=False),
        sa.Column("last_assignment_error_message", sa.Text(), nullable=False),
        sa.Column("prepared", JSON, nullable=True),
        sa.Column("holds", JSON, nullable=False),
        sa.Column("session_floor_ms", sa.Integer(), server_default="0", nullable=False),
        sa.Column("session_floor_until_ms", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_groups")),
        sa.CheckConstraint("group_type = 'connect'", name=op.f("ck_groups_group_type")),
    )
    op.create_table(
        "group_leases",
        sa.Column("group_id", GROUP_ID, nullable=False),
        sa.Column("owner_id", sa.String(), nullable=False),
        sa.Column("advertised_address", sa.String(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("lease_until", TIMESTAMP, nullable=False),
        sa.Column("acquired_at", TIMESTAMP, nullable=False),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_group_leases")),
    )
    op.create_table(
        "members",
        _group_id("members"),
        sa.Column("member_id", sa.String(), nullable=False),
        sa.Column("instance_id", sa.String(), nullable=True),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("previous_epoch", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("rebalance_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("assignors", JSON, nullable=False),
        sa.Column("assigned", JSON, nullable=False),
        sa.Column("pending_revocation", JSON, nullable=False),
        sa.PrimaryKeyConstraint("group_id", "member_id", name=op.f("pk_members")),
        sa.CheckConstraint(
            "state IN ('STABLE', 'UNREVOKED', 'UNRELEASED', 'LEFT')",
            name=op.f("ck_members_state"),
        ),
    )
    op.create_index(
        op.f("ix_members_group_id_instance_id"),
        "members",
        ["group_id", "instance_id"],
        unique=True,
    )
    op.create_table(
        "connectors",
        _group_id("connectors"),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("task_count", sa.Integer(), nullable=False),
        sa.Column("config", JSON, nullable=False),
        sa.PrimaryKeyConstraint("group_id", "name", name=op.f("pk_connectors")),
    )
    op.create_table(
        "target_assignments",
        _group_id("target_assignments"),
        sa.Column("assignment_epoch", sa.Integer(), nullable=False),
        sa.Column("assignor_state", sa.LargeBinary(), nullable=False),
        sa.Column("scheduled_rebalance_at_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("group_id", name=op.f("pk_target_assignments")),
    )
    op.create_table(
        "target_assignment_members",
        _group_id("target_assignment_members", "target_assignments"),
        sa.Column("member_id", sa.String(), nullable=False),
        sa.Column("resources", JSON, nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("metadata", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "member_id", name=op.f("pk_target_assignment_members")),
    )
    op.create_table(
        "group_configs",
        _group_id("group_configs"),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("value", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("group_id", "name", name=op.f("pk_group_configs")),
    )
    op.create_table(
        "events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("occurred_at", TIMESTAMP, nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        _group_id("events", None),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("event_type", sa.String(64), nullable=False),
        sa.Column("member_id", sa.String(), nullable=True),
        sa.Column("payload", JSON, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_events")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_events_group_id_id"), "events", ["group_id", "id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_events_group_id_id"), table_name="events")
    op.drop_table("events")
    op.drop_table("group_configs")
    op.drop_table("target_assignment_members")
    op.drop_table("target_assignments")
    op.drop_table("connectors")
    op.drop_index(op.f("ix_members_group_id_instance_id"), table_name="members")
    op.drop_table("members")
    op.drop_table("group_leases")
    op.drop_table("groups")
