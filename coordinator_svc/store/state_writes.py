"""Writing a commit's records to the group state tables and the audit trail: the records reduced to
their net effect per row (`Plan`), then written with a handful of prepared statements (upserts,
deletes and one multi-row event insert), since this runs on every state-changing heartbeat.
Checking the commit's lease is `leases.Leases.check`, in the same transaction (`SqlStore.commit`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Connection

from coordinator_svc.core.model import (
    Connector,
    GroupMeta,
    Member,
    ResourceStatus,
    TargetAssignment,
)
from coordinator_svc.core.records import (
    ClassicRoundRecord,
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventRecord,
    GroupDeletedRecord,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    MembersMovedRecord,
    Record,
    StatusRecord,
    TargetRecord,
    record_group_id,
    visit,
)

from . import rows, schema
from .engine import Database


@dataclass(slots=True)
class Plan:
    """The net effect of a commit's records, per row (later records win, as replay would)."""

    group_id: str
    meta: GroupMeta | None = None
    prepared_changed: bool = False
    configs: Mapping[str, str] | None = None
    target: TargetAssignment | None = None
    target_changed: frozenset[str] | None = None  # None: rewrite every member's row
    connectors: dict[str, Connector | None] = field(default_factory=dict)
    members: dict[str, Member | None] = field(default_factory=dict)
    epoch_only: set[str] = field(default_factory=set)  # members whose row needs only epochs
    #: Members moved to a new epoch with nothing else changed and no other row write in this
    #: plan (DESIGN 3.21): member id -> epoch; written with one statement per epoch.
    moved: dict[str, int] = field(default_factory=dict)
    events: list[EventRecord] = field(default_factory=list)
    #: Resources' statuses (connector, task) -> status (None: deleted), DESIGN 3.20.
    statuses: dict[tuple[str, int], ResourceStatus | None] = field(default_factory=dict)
    #: DeleteGroup (DESIGN 3.20): every state row of the group goes, before anything else of
    #: the plan is written, and its tombstone is written.
    deleted: GroupDeletedRecord | None = None

    @property
    def empty(self) -> bool:
        """Nothing to write: the records were only volatile ones (a classic group's round,
        DESIGN 3.19), so the commit needs no transaction."""
        return (
            self.meta is None
            and self.configs is None
            and self.target is None
            and not self.connectors
            and not self.members
            and not self.moved
            and not self.events
            and not self.statuses
            and self.deleted is None
        )

    @staticmethod
    def of(group_id: str, records: Iterable[Record]) -> Plan:
        plan = Plan(group_id)
        fold = _Fold(plan)
        for record in records:
            record_group = record_group_id(record)
            if record_group != group_id:
                raise ValueError(
                    f"record for group {record_group!r} in a commit under the lease on {group_id!r}"
                )
            visit(record, fold)
        return plan


class _Fold:
    """Records folded into a `Plan` (a `RecordVisitor`): later records win, as replay would."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def meta(self, record: GroupMetaRecord) -> None:
        self.plan.meta = record.meta
        self.plan.prepared_changed = self.plan.prepared_changed or record.prepared_changed

    def target(self, record: TargetRecord) -> None:
        plan, changed = self.plan, record.changed_members
        if plan.target is None:
            plan.target_changed = changed
        elif plan.target_changed is not None and changed is not None:
            plan.target_changed = plan.target_changed | changed
        else:
            plan.target_changed = None
        plan.target = record.target

    def member(self, record: MemberRecord) -> None:
        plan, member = self.plan, record.member
        member_id = member.member_id
        # Narrow only if every change of the member in this commit was.
        narrow = record.epoch_only and (
            member_id not in plan.members or member_id in plan.epoch_only
        )
        plan.members[member_id] = member
        plan.moved.pop(member_id, None)  # the record carries its epoch
        if narrow:
            plan.epoch_only.add(member_id)
        else:
            plan.epoch_only.discard(member_id)

    def members_moved(self, record: MembersMovedRecord) -> None:
        plan, epoch = self.plan, record.epoch
        for member_id in record.member_ids:
            written = plan.members.get(member_id)
            if written is not None:  # its row is written anyway: with the new epoch
                plan.members[member_id] = replace(written, member_epoch=epoch)
            else:
                plan.moved[member_id] = epoch

    def member_removed(self, record: MemberRemovedRecord) -> None:
        self.plan.members[record.member_id] = None
        self.plan.epoch_only.discard(record.member_id)
        self.plan.moved.pop(record.member_id, None)

    def connector(self, record: ConnectorRecord) -> None:
        self.plan.connectors[record.connector.name] = record.connector

    def connector_removed(self, record: ConnectorRemovedRecord) -> None:
        plan, name = self.plan, record.name
        plan.connectors[name] = None
        for key in [k for k in plan.statuses if k[0] == name]:  # its rows go with it
            del plan.statuses[key]

    def configs(self, record: ConfigRecord) -> None:
        self.plan.configs = record.configs

    def statuses(self, record: StatusRecord) -> None:
        self.plan.statuses.update(record.statuses)

    def group_deleted(self, record: GroupDeletedRecord) -> None:
        """Every state row goes: what the plan would have written of them is dropped (its
        events are kept, and written after the deletion)."""
        plan = self.plan
        plan.meta, plan.prepared_changed, plan.configs = None, False, None
        plan.target, plan.target_changed = None, None
        for pending in (plan.connectors, plan.members, plan.moved, plan.statuses):
            pending.clear()
        plan.epoch_only.clear()
        plan.deleted = record

    def classic_round(self, record: ClassicRoundRecord) -> None:
        pass  # the round is not persisted (DESIGN 3.19 "Takeover")

    def event(self, record: EventRecord) -> None:
        self.plan.events.append(record)


MOVE_CHUNK = 500
"""Member ids per move statement on SQLite (an IN list; its parameter limit is 999 in old
builds). PostgreSQL takes any number as one array parameter."""


def _any_of(db: Database, column: sa.ColumnElement[str], name: str) -> sa.ColumnElement[bool]:
    """`column` is one of the ids in parameter `name`: `= ANY(:name)` (one array parameter)
    on PostgreSQL, an expanding IN list on SQLite."""
    if db.sqlite:
        return column.in_(sa.bindparam(name, expanding=True))
    return column == sa.any_(sa.bindparam(name, type_=postgresql.ARRAY(sa.String)))


def _upsert(
    insert: Callable[[sa.Table], Any], table: sa.Table, keep: Sequence[str] = ()
) -> sa.Executable:
    """INSERT ... ON CONFLICT (primary key) DO UPDATE SET every other column, except the columns
    in `keep`: those are neither sent (a new row gets their default) nor overwritten."""
    stmt = insert(table)
    if keep:
        sent: dict[str, Any] = {
            c.name: sa.bindparam(c.name) for c in table.columns if c.name not in keep
        }
        stmt = stmt.values(sent)
    keys = [c for c in table.primary_key.columns]
    return stmt.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=keys,
        set_={
            c.name: stmt.excluded[c.name]
            for c in table.columns
            if not c.primary_key and c.name not in keep
        },
    )


@dataclass(frozen=True, slots=True)
class WriteStatements:
    """The prepared statements `write` runs (rows from `rows`, or parameters `p_*`)."""

    upsert_group: sa.Executable
    upsert_group_keep_prepared: sa.Executable
    upsert_member: sa.Executable
    upsert_connector: sa.Executable
    upsert_target: sa.Executable
    update_member_epochs: sa.Executable
    move_members: sa.Executable
    #: How many ids one `move_members` takes (None: any number, as one array parameter).
    move_members_chunk: int | None
    delete_members: sa.Executable
    delete_connectors: sa.Executable
    delete_target_members: sa.Executable
    delete_some_target_members: sa.Executable
    insert_target_members: sa.Executable
    delete_configs: sa.Executable
    insert_configs: sa.Executable
    insert_events: sa.Executable
    upsert_statuses: sa.Executable
    delete_statuses: sa.Executable
    delete_connector_statuses: sa.Executable
    #: DeleteGroup: each state table's rows of the group (children first), then the tombstone.
    delete_group_rows: tuple[sa.Executable, ...]
    upsert_tombstone: sa.Executable

    @staticmethod
    def build(db: Database) -> WriteStatements:
        m, c = schema.members.c, schema.connectors.c
        tm, gc = schema.target_assignment_members, schema.group_configs
        rs = schema.resource_statuses
        delete_target_members = sa.delete(tm).where(tm.c.group_id == sa.bindparam("p_group"))
        return WriteStatements(
            upsert_group=_upsert(db.insert, schema.groups),
            # Most metadata changes leave the Prepare snapshot (as large as the group) as it
            # was: they neither send nor rewrite it.
            upsert_group_keep_prepared=_upsert(db.insert, schema.groups, keep=("prepared",)),
            upsert_member=_upsert(db.insert, schema.members),
            upsert_connector=_upsert(db.insert, schema.connectors),
            upsert_target=_upsert(db.insert, schema.target_assignments),
            update_member_epochs=(
                sa.update(schema.members)
                .where(
                    m.group_id == sa.bindparam("p_group"), m.member_id == sa.bindparam("p_member")
                )
                .values(
                    member_epoch=sa.bindparam("p_epoch"),
                    previous_epoch=sa.bindparam("p_previous"),
                    state=sa.bindparam("p_state"),
                    stable_since_epoch=sa.bindparam("p_stable_since"),
                    lifecycle_revision=sa.bindparam("p_revision"),
                )
            ),
            move_members=sa.update(schema.members)
            .where(m.group_id == sa.bindparam("p_group"), _any_of(db, m.member_id, "p_ids"))
            .values(member_epoch=sa.bindparam("p_epoch")),
            move_members_chunk=MOVE_CHUNK if db.sqlite else None,
            delete_members=sa.delete(schema.members).where(
                m.group_id == sa.bindparam("p_group"),
                m.member_id.in_(sa.bindparam("p_ids", expanding=True)),
            ),
            delete_connectors=sa.delete(schema.connectors).where(
                c.group_id == sa.bindparam("p_group"),
                c.name.in_(sa.bindparam("p_ids", expanding=True)),
            ),
            delete_target_members=delete_target_members,
            delete_some_target_members=delete_target_members.where(
                tm.c.member_id.in_(sa.bindparam("p_ids", expanding=True))
            ),
            insert_target_members=sa.insert(tm),
            delete_configs=sa.delete(gc).where(gc.c.group_id == sa.bindparam("p_group")),
            insert_configs=sa.insert(gc),
            insert_events=sa.insert(schema.events),
            upsert_statuses=_upsert(db.insert, schema.resource_statuses),
            delete_statuses=sa.delete(rs).where(
                rs.c.group_id == sa.bindparam("p_group"),
                rs.c.connector == sa.bindparam("p_connector"),
                rs.c.task == sa.bindparam("p_task"),
            ),
            delete_connector_statuses=sa.delete(rs).where(
                rs.c.group_id == sa.bindparam("p_group"),
                rs.c.connector.in_(sa.bindparam("p_ids", expanding=True)),
            ),
            delete_group_rows=tuple(
                sa.delete(table).where(table.c.group_id == sa.bindparam("p_group"))
                for table in reversed(schema.STATE_TABLES)
            ),
            upsert_tombstone=_upsert(db.insert, schema.group_tombstones),
        )


def _move_members(
    conn: Connection, sql: WriteStatements, group_id: str, moved: Mapping[str, int]
) -> None:
    """Members moved with nothing else changed: one statement per epoch (one per chunk of ids
    on SQLite), however many they are (DESIGN 3.21)."""
    by_epoch: dict[int, list[str]] = {}
    for member_id, epoch in moved.items():
        by_epoch.setdefault(epoch, []).append(member_id)
    for epoch, member_ids in sorted(by_epoch.items()):
        member_ids.sort()
        step = sql.move_members_chunk or len(member_ids)
        for i in range(0, len(member_ids), step):
            params = rows.members_moved_params(group_id, member_ids[i : i + step], epoch)
            conn.execute(sql.move_members, params)


def write(conn: Connection, sql: WriteStatements, plan: Plan) -> None:
    """Write `plan` in `conn`'s transaction (whose lease the caller has checked)."""
    group_id = plan.group_id
    if plan.deleted is not None:
        for delete in sql.delete_group_rows:
            conn.execute(delete, {"p_group": group_id})
        conn.execute(sql.upsert_tombstone, rows.tombstone_row(plan.deleted))
    if plan.meta is not None:
        row = rows.group_row(plan.meta, with_prepared=plan.prepared_changed)
        if plan.prepared_changed:
            conn.execute(sql.upsert_group, row)
        else:
            conn.execute(sql.upsert_group_keep_prepared, row)
    removed_members = [m for m, v in plan.members.items() if v is None]
    if removed_members:
        conn.execute(sql.delete_members, {"p_group": group_id, "p_ids": removed_members})
    removed_connectors = [c for c, v in plan.connectors.items() if v is None]
    if removed_connectors:
        conn.execute(sql.delete_connectors, {"p_group": group_id, "p_ids": removed_connectors})
        ids = {"p_group": group_id, "p_ids": removed_connectors}
        conn.execute(sql.delete_connector_statuses, ids)
    put_connectors = [
        rows.connector_row(group_id, v) for v in plan.connectors.values() if v is not None
    ]
    if put_connectors:
        conn.execute(sql.upsert_connector, put_connectors)
    if plan.configs is not None:
        conn.execute(sql.delete_configs, {"p_group": group_id})
        config_rows = rows.config_rows(group_id, plan.configs)
        if config_rows:
            conn.execute(sql.insert_configs, config_rows)
    if plan.target is not None:
        conn.execute(sql.upsert_target, rows.target_row(group_id, plan.target))
        changed = plan.target_changed
        if changed is None:
            conn.execute(sql.delete_target_members, {"p_group": group_id})
        elif changed:
            ids = {"p_group": group_id, "p_ids": sorted(changed)}
            conn.execute(sql.delete_some_target_members, ids)
        target_members = rows.target_member_rows(group_id, plan.target, changed)
        if target_members:
            conn.execute(sql.insert_target_members, target_members)
    put_members = [
        rows.member_row(group_id, v)
        for v in plan.members.values()
        if v is not None and v.member_id not in plan.epoch_only
    ]
    if put_members:
        conn.execute(sql.upsert_member, put_members)
    epochs = [
        rows.member_epoch_row(group_id, v)
        for v in plan.members.values()
        if v is not None and v.member_id in plan.epoch_only
    ]
    if epochs:
        conn.execute(sql.update_member_epochs, epochs)
    _move_members(conn, sql, group_id, plan.moved)
    _write_statuses(conn, sql, group_id, plan.statuses)
    if plan.events:
        # executemany: psycopg 3 sends the rows in one pipeline.
        conn.execute(sql.insert_events, [rows.event_row(e) for e in plan.events])


def _write_statuses(
    conn: Connection,
    sql: WriteStatements,
    group_id: str,
    statuses: Mapping[tuple[str, int], ResourceStatus | None],
) -> None:
    """Resources' statuses: the changed rows upserted, the forgotten ones deleted."""
    put = [
        rows.status_row(group_id, connector, task, status)
        for (connector, task), status in statuses.items()
        if status is not None
    ]
    if put:
        conn.execute(sql.upsert_statuses, put)
    gone = [
        {"p_group": group_id, "p_connector": connector, "p_task": task}
        for (connector, task), status in statuses.items()
        if status is None
    ]
    if gone:
        conn.execute(sql.delete_statuses, gone)
