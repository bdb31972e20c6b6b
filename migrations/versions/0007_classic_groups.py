"""Classic groups (issue 25, DESIGN 3.19).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 00:00:00+00:00

Additive: the release before never writes the new columns, and their defaults (NULL, 'connect')
describe its groups and members exactly.

- `groups.group_type` takes 'classic' besides 'connect'; `groups.classic_state` (NULL or one of
  the four classic states), `groups.protocol_name` and `groups.leader_id` (a classic group's
  current generation; its generation is `group_epoch`).
- `members.group_protocol` ('connect' or 'classic', default 'connect'), and a classic member's
  `classic_protocols`, `session_timeout_ms`, `last_joined_generation` and `classic_assignment`
  (its share of the last accepted assignments).

No table for the join round (pending ids, who rejoined, parked calls): it is not persisted (a
new owner starts a new join phase). Downgrade refuses while a classic group exists: the older
schema cannot say what it is, and an older coordinator would load it as a connect group.

Hand-written to match coordinator_svc/store/schema.py; `alembic check` in the test suite proves
they agree.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The constraints as schema.py writes them (copied: a migration never imports the models, which
# move on while it must stay as it was).
GROUP_TYPE_CHECK = "group_type IN ('connect', 'classic')"
CLASSIC_STATE_CHECK = (
    "classic_state IS NULL OR classic_state IN "
    "('EMPTY', 'PREPARING_REBALANCE', 'COMPLETING_REBALANCE', 'STABLE')"
)
GROUP_PROTOCOL_CHECK = "group_protocol IN ('connect', 'classic')"
CONNECT_ONLY_CHECK = "group_type = 'connect'"
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("groups") as batch:
        batch.drop_constraint(op.f("ck_groups_group_type"), type_="check")
        batch.create_check_constraint(op.f("ck_groups_group_type"), GROUP_TYPE_CHECK)
        batch.add_column(sa.Column("classic_state", sa.String(24), nullable=True))
        batch.add_column(sa.Column("protocol_name", sa.String(32), nullable=True))
        batch.add_column(sa.Column("leader_id", sa.String(), nullable=True))
        batch.create_check_constraint(op.f("ck_groups_classic_state"), CLASSIC_STATE_CHECK)
    with op.batch_alter_table("members") as batch:
        batch.add_column(
            sa.Column("group_protocol", sa.String(16), server_default="connect", nullable=False)
        )
        batch.add_column(sa.Column("classic_protocols", JSON, nullable=True))
        batch.add_column(sa.Column("session_timeout_ms", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("last_joined_generation", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("classic_assignment", JSON, nullable=True))
        batch.create_check_constraint(op.f("ck_members_group_protocol"), GROUP_PROTOCOL_CHECK)


def downgrade() -> None:
    classic = (
        op.get_bind()
        .execute(sa.text("SELECT group_id FROM groups WHERE group_type <> 'connect' LIMIT 1"))
        .scalar()
    )
    if classic is not None:
        raise RuntimeError(
            f"cannot downgrade below 0007 while classic groups exist (e.g. {classic!r}): the "
            "older schema cannot hold them and an older coordinator would load them as connect "
            "groups. Empty and convert or delete them first."
        )
    with op.batch_alter_table("members") as batch:
        batch.drop_constraint(op.f("ck_members_group_protocol"), type_="check")
        batch.drop_column("classic_assignment")
        batch.drop_column("last_joined_generation")
        batch.drop_column("session_timeout_ms")
        batch.drop_column("classic_protocols")
        batch.drop_column("group_protocol")
    with op.batch_alter_table("groups") as batch:
        batch.drop_constraint(op.f("ck_groups_classic_state"), type_="check")
        batch.drop_column("leader_id")
        batch.drop_column("protocol_name")
        batch.drop_column("classic_state")
        batch.drop_constraint(op.f("ck_groups_group_type"), type_="check")
        batch.create_check_constraint(op.f("ck_groups_group_type"), CONNECT_ONLY_CHECK)
