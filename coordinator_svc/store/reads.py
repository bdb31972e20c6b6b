"""Read-only queries: a group's committed state (loaded back through `replay`), the listings of
groups (ids, ListGroups' summaries, the groups a process adopts) and the audit trail.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from coordinator_svc.core import replay
from coordinator_svc.core.classic_model import KNOWN_GROUP_TYPES
from coordinator_svc.core.model import GroupState, Tombstone
from coordinator_svc.core.records import Record

from . import rows, schema
from .engine import Database
from .errors import SecretMissing

# An empty assignment as each database prints the JSON of `ResourceSet().to_json()`.
_EMPTY_JSON_TEXT = {
    False: '{"tasks": [], "connectors": []}',
    True: '{"connectors": [], "tasks": []}',
}


@dataclass(frozen=True, slots=True)
class GroupSummary:
    """What ListGroups shows of a group, as the database has it: for a classic group (DESIGN
    3.19) also its type, classic state and the current generation's protocol."""

    group_id: str
    group_epoch: int
    assignment_epoch: int
    member_count: int
    unsettled_members: int  # members (not left) away from the target epoch or share
    group_type: str = "connect"
    classic_state: str | None = None  # None for connect groups
    protocol_name: str | None = None  # the classic generation's; None when none


def _plain(row: sa.RowMapping) -> dict[str, Any]:
    return dict(row)


@dataclass(frozen=True, slots=True)
class ReadStatements:
    """The prepared listing statements of one store (parameters `p_*`, plus
    `Database.time_params` on SQLite)."""

    needing_owner: sa.Select[Any]
    summaries: sa.Select[Any]

    @staticmethod
    def build(db: Database) -> ReadStatements:
        now = db.now()
        gl = schema.group_leases.c
        g, t, m = schema.groups.c, schema.target_assignments.c, schema.members.c
        tmc = schema.target_assignment_members.c
        lease_free = ~sa.exists().where(gl.group_id == g.group_id, gl.lease_until > now)
        has_members = sa.exists().where(m.group_id == g.group_id)
        has_schedule = sa.exists().where(
            t.group_id == g.group_id, t.scheduled_rebalance_at_ms.is_not(None)
        )
        json_length = sa.func.json_array_length if db.sqlite else sa.func.jsonb_array_length
        # Only groups of a type this code knows: a newer release's group is left to a process
        # that can load it (DESIGN 3.19 "Takeover").
        known_type = g.group_type.in_(sorted(KNOWN_GROUP_TYPES))
        needing_owner = (
            sa.select(g.group_id)
            .where(lease_free, known_type, has_members | has_schedule | (json_length(g.holds) > 0))
            .order_by(g.group_id)
            .limit(sa.bindparam("p_limit"))
        )
        page = (
            sa.select(g.group_id, g.group_epoch, g.group_type, g.classic_state, g.protocol_name)
            .where(g.group_id > sa.bindparam("p_after"))
            .order_by(g.group_id)
            .limit(sa.bindparam("p_limit"))
            .subquery("page")
        )
        epoch = sa.func.coalesce(t.assignment_epoch, page.c.group_epoch)
        unsettled = (
            sa.select(sa.func.count())
            .select_from(
                schema.members.outerjoin(
                    schema.target_assignment_members,
                    (tmc.group_id == m.group_id) & (tmc.member_id == m.member_id),
                )
            )
            .where(
                m.group_id == page.c.group_id,
                m.state != "LEFT",
                (m.member_epoch != epoch)
                | (m.state != "STABLE")
                | (
                    sa.func.coalesce(
                        sa.cast(tmc.resources, sa.Text), sa.literal(_EMPTY_JSON_TEXT[db.sqlite])
                    )
                    != sa.cast(m.assigned, sa.Text)
                ),
            )
            .scalar_subquery()
        )
        members = sa.select(sa.func.count()).where(m.group_id == page.c.group_id).scalar_subquery()
        summaries = (
            sa.select(
                page.c.group_id,
                page.c.group_epoch,
                page.c.group_type,
                page.c.classic_state,
                page.c.protocol_name,
                epoch.label("assignment_epoch"),
                members.label("members"),
                unsettled.label("unsettled"),
            )
            .select_from(page.outerjoin(schema.target_assignments, t.group_id == page.c.group_id))
            .order_by(page.c.group_id)
        )
        return ReadStatements(needing_owner=needing_owner, summaries=summaries)


#: Ids one statement of `existing_group_ids` asks about (bound parameters per statement; one
#: statement for every DescribeGroups within the default --max-describe-groups).
EXISTS_BATCH = 10_000


class Reads:
    """The read-only queries of one store; `SqlStore` documents each."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.sql = ReadStatements.build(db)

    def count_groups(self) -> int:
        def read(conn: Connection) -> int:
            return int(
                conn.execute(sa.select(sa.func.count()).select_from(schema.groups)).scalar_one()
            )

        return self._db.retrying(False, read)

    def count_groups_created_by(self, principal: str) -> int:
        g = schema.groups.c
        stmt = (
            sa.select(sa.func.count()).select_from(schema.groups).where(g.created_by == principal)
        )

        def read(conn: Connection) -> int:
            return int(conn.execute(stmt).scalar_one())

        return self._db.retrying(False, read)

    def existing_group_ids(self, group_ids: Sequence[str]) -> set[str]:
        g = schema.groups.c

        def read(conn: Connection) -> set[str]:
            found: set[str] = set()
            for start in range(0, len(group_ids), EXISTS_BATCH):
                batch = list(group_ids[start : start + EXISTS_BATCH])
                stmt = sa.select(g.group_id).where(g.group_id.in_(batch))
                found.update(str(group_id) for group_id in conn.execute(stmt).scalars())
            return found

        return self._db.retrying(False, read)

    def setting(self, name: str) -> str | None:
        """A row of `coordinator_settings` (migration 0008); None when it or the table is not
        there."""
        settings = schema.coordinator_settings
        stmt = sa.select(settings.c.value).where(settings.c.name == name)

        def read(conn: Connection) -> str | None:
            if not sa.inspect(conn).has_table(settings.name):
                return None
            value = conn.execute(stmt).scalar_one_or_none()
            return None if value is None else str(value)

        return self._db.retrying(False, read)

    def config_digest_key(self) -> bytes:
        """The database's config digest key (`coordinator_secrets`, migration 0005);
        SecretMissing when the table or its row is not there."""
        secrets = schema.coordinator_secrets
        stmt = sa.select(secrets.c.value).where(secrets.c.name == schema.CONFIG_DIGEST_KEY)

        def read(conn: Connection) -> bytes | None:
            if not sa.inspect(conn).has_table(secrets.name):
                return None
            value = conn.execute(stmt).scalar_one_or_none()
            return None if value is None else bytes(value)

        key = self._db.retrying(False, read)
        if not key:
            raise SecretMissing(
                f"the database has no {schema.CONFIG_DIGEST_KEY!r} in table "
                f"{secrets.name!r}: its schema is older than revision 0005 (run "
                "`coordinator-svc migrate`) or the row was deleted (restore it from a backup: a "
                "new key would make every stored config digest disagree with new ones)"
            )
        return key

    def group_ids(self) -> list[str]:
        g = schema.groups.c
        stmt = sa.select(g.group_id).order_by(g.group_id)

        def read(conn: Connection) -> list[str]:
            return [str(group_id) for group_id in conn.execute(stmt).scalars()]

        return self._db.retrying(False, read)

    def group_summaries(self, after: str, limit: int) -> list[GroupSummary]:
        def read(conn: Connection) -> list[GroupSummary]:
            result = conn.execute(self.sql.summaries, {"p_after": after, "p_limit": limit})
            return [
                GroupSummary(
                    row.group_id,
                    int(row.group_epoch),
                    int(row.assignment_epoch),
                    int(row.members),
                    int(row.unsettled),
                    str(row.group_type),
                    None if row.classic_state is None else str(row.classic_state),
                    None if row.protocol_name is None else str(row.protocol_name),
                )
                for row in result
            ]

        return self._db.retrying(False, read)

    def groups_needing_owner(self, limit: int) -> list[str]:
        def read(conn: Connection) -> list[str]:
            params = {"p_limit": limit, **self._db.time_params()}
            return [str(g) for g in conn.execute(self.sql.needing_owner, params).scalars()]

        return self._db.retrying(False, read)

    def load_group(self, group_id: str) -> GroupState | None:
        def read(conn: Connection) -> list[Record] | None:
            def select(table: sa.Table, *order: sa.ColumnElement[Any]) -> list[dict[str, Any]]:
                stmt = sa.select(table).where(table.c.group_id == group_id).order_by(*order)
                return [_plain(row) for row in conn.execute(stmt).mappings()]

            meta = select(schema.groups)
            if not meta:
                return None
            target = select(schema.target_assignments)
            target_members = select(
                schema.target_assignment_members,
                schema.target_assignment_members.c.member_id,
            )
            configs = select(schema.group_configs, schema.group_configs.c.name)
            connectors = select(schema.connectors, schema.connectors.c.name)
            members = select(schema.members, schema.members.c.member_id)
            statuses = select(schema.resource_statuses)
            return rows.group_records(
                meta[0],
                target[0] if target else None,
                target_members,
                configs,
                connectors,
                members,
                statuses,
            )

        records = self._db.retrying(False, read)
        return None if records is None else replay.new_state(records)

    def load_tombstone(self, group_id: str) -> Tombstone | None:
        """What DeleteGroup kept of the group, if it was deleted (DESIGN 3.20)."""
        stmt = sa.select(schema.group_tombstones).where(
            schema.group_tombstones.c.group_id == group_id
        )

        def read(conn: Connection) -> Tombstone | None:
            row = conn.execute(stmt).first()
            return None if row is None else rows.tombstone_from_row(row)

        return self._db.retrying(False, read)

    def list_events(
        self, group_id: str | None, after_id: int, limit: int | None
    ) -> list[dict[str, Any]]:
        e = schema.events.c
        stmt = sa.select(schema.events).where(e.id > after_id).order_by(e.id)
        if group_id is not None:
            stmt = stmt.where(e.group_id == group_id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self._db.transaction(write=False) as conn:
            return [_plain(row) for row in conn.execute(stmt).mappings()]
