"""Fencing tokens and paced waves (DESIGN 3.18): the group's last granted token, each member's
tokens and last grant time, and what a target's scheduled rebalance stands for.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 00:00:00+00:00

Members that already run resources get tokens here: per group, each such member one grant (the
group's counter counts them), so every assignment sent after the upgrade carries a token for
every resource. Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the
test suite proves they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from connect_protocol.resources import ResourceSet
from connect_protocol.tokens import FencingTokens

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.add_column(
            sa.Column("last_fencing_token", sa.BigInteger(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("members") as batch:
        batch.add_column(sa.Column("fencing_tokens", JSON, server_default="{}", nullable=False))
        batch.add_column(
            sa.Column("last_grant_at_ms", sa.BigInteger(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("target_assignments") as batch:
        batch.add_column(sa.Column("lost_work_rebalance_at_ms", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("next_wave_at_ms", sa.BigInteger(), nullable=True))
    _grant_existing()


def _grant_existing() -> None:
    members = sa.table(
        "members",
        sa.column("group_id", sa.String()),
        sa.column("member_id", sa.String()),
        sa.column("assigned", JSON),
        sa.column("fencing_tokens", JSON),
    )
    groups = sa.table(
        "groups",
        sa.column("group_id", sa.String()),
        sa.column("last_fencing_token", sa.BigInteger()),
    )
    conn = op.get_bind()
    rows = conn.execute(
        sa.select(members.c.group_id, members.c.member_id, members.c.assigned).order_by(
            members.c.group_id, members.c.member_id
        )
    ).all()
    counters: dict[str, int] = {}
    for group_id, member_id, assigned in rows:
        resources = ResourceSet.from_json(assigned or {})
        if not resources:
            continue
        token = counters[group_id] = counters.get(group_id, 0) + 1
        conn.execute(
            members.update()
            .where(members.c.group_id == group_id, members.c.member_id == member_id)
            .values(fencing_tokens=FencingTokens.granted(resources, token).to_json())
        )
    for group_id, token in counters.items():
        conn.execute(
            groups.update().where(groups.c.group_id == group_id).values(last_fencing_token=token)
        )


def downgrade() -> None:
    with op.batch_alter_table("target_assignments") as batch:
        batch.drop_column("next_wave_at_ms")
        batch.drop_column("lost_work_rebalance_at_ms")
    with op.batch_alter_table("members") as batch:
        batch.drop_column("last_grant_at_ms")
        batch.drop_column("fencing_tokens")
    with op.batch_alter_table("groups") as batch:
        batch.drop_column("last_fencing_token")
