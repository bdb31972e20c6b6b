"""The ACL table and its audit trail (DESIGN 3.17): reading the ACLs in force and the revision
that a trigger raises on every change of the table (migration 0005, so an in-place UPDATE is
noticed as surely as an add), adding and removing entries for AddAcl / RemoveAcl and
`coordinator-svc acl` (each with an ACL_ADDED / ACL_REMOVED event naming the caller, in the same
transaction), recording a change made directly in the database once as ACL_CHANGED, and writing
the aggregated AUTHORIZATION_DENIED events.

Every write here locks the one `acl_audit` row first (SELECT ... FOR UPDATE on PostgreSQL; on
SQLite the writer holds the database's write lock), accounts for any change it finds beyond
`audited_revision`, and leaves `audited_revision` / `audited_entries` at what it committed, so
that no change is reported twice and none is missed, however many coordinators look."""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from coordinator_svc.core.acls import (
    AclEntry,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from coordinator_svc.core.records import EventType

from . import schema
from .engine import Database

#: The principal of an ACL change found in the table, made by neither AddAcl/RemoveAcl nor
#: `coordinator-svc acl`.
DATABASE_PRINCIPAL = "database"
#: The group id of cluster-level events (no group can have it: group ids are non-empty).
CLUSTER_EVENT_GROUP = ""
#: The group epoch of events that belong to no group.
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class AclCaller:
    """Who changes the ACLs: a principal and where the change came from (a gRPC peer address,
    or the host that ran `coordinator-svc acl --database-url`), and through what."""

    principal: str
    address: str
    via: str


def local_caller() -> AclCaller:
    """The caller of `coordinator-svc acl --database-url ...`: `local:<os user>` on the host that
    ran it (whoever may write the database administers the ACLs; the database user is in the
    URL, the OS user is what the coordinator can name)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no login name and no passwd entry (some containers)
        user = f"uid-{os.getuid()}"
    return AclCaller(f"local:{user}", socket.gethostname(), "cli")


@dataclass(frozen=True, slots=True)
class Denials:
    """Calls of one principal denied one operation on one resource type in an interval.
    `group_id`: the one group all of them named, else "" (cluster denials: ""). `groups`: a
    bounded sample of the groups named; `distinct_groups`: how many distinct groups, exact
    unless `distinct_groups_capped` (then at least that many). An overflow row (`principal`
    None) counts the denials of `principals` principals beyond the per-interval bound."""

    principal: str | None
    operation: str
    resource_type: str
    group_id: str
    count: int
    first_ms: int
    last_ms: int
    rpcs: tuple[str, ...]
    groups: tuple[str, ...] = ()
    distinct_groups: int = 0
    distinct_groups_capped: bool = False
    principals: int = 1


@dataclass(frozen=True, slots=True)
class AclRevision:
    """`revision`: raised by the trigger on every change of `acls`; `audited_revision`: how far
    the audit trail has accounted for."""

    revision: int
    audited_revision: int

    @property
    def unaudited(self) -> bool:
        return self.revision != self.audited_revision


def _entry(row: Any) -> AclEntry:
    return AclEntry(
        principal=row.principal,
        operation=Operation(row.operation),
        resource_type=ResourceType(row.resource_type),
        pattern=row.pattern,
        pattern_type=PatternType(row.pattern_type),
        permission=Permission(row.permission),
    )


def _same_entry(entry: AclEntry) -> sa.ColumnElement[bool]:
    a = schema.acls.c
    return sa.and_(
        a.principal == entry.principal,
        a.operation == entry.operation.value,
        a.resource_type == entry.resource_type.value,
        a.pattern_type == entry.pattern_type.value,
        a.pattern == entry.pattern,
        a.permission == entry.permission.value,
    )


_AUDITED_COLUMNS = (
    "id",
    "principal",
    "operation",
    "resource_type",
    "pattern_type",
    "pattern",
    "permission",
)


def _row_dict(row: Any) -> dict[str, Any]:
    """A row of `acls` as `acl_audit.audited_entries` keeps it (id included: an UPDATE that
    changes an entry shows as that id's old row removed and its new row added)."""
    out = {column: getattr(row, column) for column in _AUDITED_COLUMNS}
    out["id"] = int(out["id"])
    return out


def _entry_dict(entry: AclEntry, row_id: int) -> dict[str, Any]:
    return {
        "id": row_id,
        "principal": entry.principal,
        "operation": entry.operation.value,
        "resource_type": entry.resource_type.value,
        "pattern_type": entry.pattern_type.value,
        "pattern": entry.pattern,
        "permission": entry.permission.value,
    }


def _key(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), str(v)) for k, v in row.items()))


def diff_entries(
    audited: Sequence[dict[str, Any]], current: Sequence[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows added, rows removed) from `audited` to `current`, each in id order."""
    before = {_key(r): r for r in audited}
    after = {_key(r): r for r in current}
    added = [after[k] for k in after.keys() - before.keys()]
    removed = [before[k] for k in before.keys() - after.keys()]

    def order(row: dict[str, Any]) -> tuple[int, str]:
        return int(row.get("id", 0)), repr(_key(row))

    return sorted(added, key=order), sorted(removed, key=order)


def _event(event_type: EventType, payload: dict[str, Any], at_ms: int) -> dict[str, Any]:
    return {
        "occurred_at": datetime.now(UTC),
        "at_ms": at_ms,
        "group_id": CLUSTER_EVENT_GROUP,
        "group_epoch": NO_EPOCH,
        "event_type": event_type.value,
        "member_id": None,
        "payload": payload,
    }


def _now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)


class AclStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    # --- reading ------------------------------------------------------------------------------

    def revision(self) -> AclRevision:
        """The trigger's revision of the ACL table and how far it was audited (one row read)."""

        def read(conn: sa.Connection) -> AclRevision:
            a = schema.acl_audit.c
            row = conn.execute(
                sa.select(a.revision, a.audited_revision).where(a.id == schema.ACL_AUDIT_ROW_ID)
            ).one()
            return AclRevision(int(row.revision), int(row.audited_revision))

        return self._db.retrying(False, read)

    def load(self) -> tuple[int, list[AclEntry]]:
        """The revision and the entries, from one snapshot, oldest first."""

        def read(conn: sa.Connection) -> tuple[int, list[AclEntry]]:
            a = schema.acl_audit.c
            revision = conn.execute(
                sa.select(a.revision).where(a.id == schema.ACL_AUDIT_ROW_ID)
            ).scalar_one()
            rows = conn.execute(sa.select(schema.acls).order_by(schema.acls.c.id)).all()
            return int(revision), [_entry(r) for r in rows]

        return self._db.retrying(False, read)

    def page(self, principal: str | None, after_id: int, limit: int) -> list[tuple[int, AclEntry]]:
        """At most `limit` entries with ids above `after_id` (of `principal` if given), in id
        order, each with its id (ListAcls' page token)."""

        def read(conn: sa.Connection) -> list[tuple[int, AclEntry]]:
            a = schema.acls.c
            query = sa.select(schema.acls).where(a.id > after_id)
            if principal:
                query = query.where(a.principal == principal)
            rows = conn.execute(query.order_by(a.id).limit(limit)).all()
            return [(int(r.id), _entry(r)) for r in rows]

        return self._db.retrying(False, read)

    # --- changing, with the audit trail -------------------------------------------------------

    def add(self, entry: AclEntry, by: AclCaller | None = None) -> bool:
        """Add `entry`, recorded as ACL_ADDED by `by` (default: `local_caller()`); False (and no
        event) if the same entry is already there."""
        caller = by or local_caller()
        with self._db.transaction(write=True) as conn:
            self._lock_and_catch_up(conn)
            exists = conn.execute(sa.select(schema.acls.c.id).where(_same_entry(entry))).first()
            if exists is None:
                row_id = conn.execute(
                    sa.insert(schema.acls)
                    .values(
                        principal=entry.principal,
                        operation=entry.operation.value,
                        resource_type=entry.resource_type.value,
                        pattern_type=entry.pattern_type.value,
                        pattern=entry.pattern,
                        permission=entry.permission.value,
                        created_at=datetime.now(UTC),
                    )
                    .returning(schema.acls.c.id)
                ).scalar_one()
                conn.execute(
                    sa.insert(schema.events),
                    [_event(EventType.ACL_ADDED, _change(caller, entry, int(row_id)), _now_ms())],
                )
            self._mark_audited(conn)
            return exists is None

    def remove(self, entry: AclEntry, by: AclCaller | None = None) -> int:
        """Remove `entry`, each row that went recorded as ACL_REMOVED by `by` (default:
        `local_caller()`); how many rows went (0 or 1, unless the table was edited by hand)."""
        caller = by or local_caller()
        with self._db.transaction(write=True) as conn:
            self._lock_and_catch_up(conn)
            ids = (
                conn.execute(
                    sa.delete(schema.acls).where(_same_entry(entry)).returning(schema.acls.c.id)
                )
                .scalars()
                .all()
            )
            if ids:
                now = _now_ms()
                conn.execute(
                    sa.insert(schema.events),
                    [
                        _event(EventType.ACL_REMOVED, _change(caller, entry, int(i)), now)
                        for i in sorted(ids)
                    ],
                )
            self._mark_audited(conn)
            return len(ids)

    def audit_direct_changes(self) -> bool:
        """Record the ACL rows changed directly in the database since they were last audited,
        as one ACL_CHANGED event (principal `database`), unless another coordinator did so
        first (the row lock and a re-check make N coordinators record it once); whether this
        call wrote one."""
        with self._db.transaction(write=True) as conn:
            wrote = self._lock_and_catch_up(conn)
            self._mark_audited(conn)
            return wrote

    def _lock_and_catch_up(self, conn: sa.Connection) -> bool:
        """Lock the audit row; if the table changed beyond what was audited, write ACL_CHANGED
        with the rows added and removed (nothing if a statement changed no row). Whether an
        event was written."""
        a = schema.acl_audit.c
        audit = conn.execute(
            sa.select(a.revision, a.audited_revision, a.audited_entries)
            .where(a.id == schema.ACL_AUDIT_ROW_ID)
            .with_for_update()
        ).one()
        if int(audit.revision) == int(audit.audited_revision):
            return False
        added, removed = diff_entries(audit.audited_entries or [], self._rows(conn))
        if not added and not removed:
            return False
        payload = {
            "principal": DATABASE_PRINCIPAL,
            "address": "",
            "added": added,
            "removed": removed,
            "revision": int(audit.revision),
        }
        conn.execute(sa.insert(schema.events), [_event(EventType.ACL_CHANGED, payload, _now_ms())])
        return True

    def _mark_audited(self, conn: sa.Connection) -> None:
        """Everything in the table now is accounted for (called last in the transaction, after
        the trigger raised the revision for this transaction's own change)."""
        a = schema.acl_audit.c
        conn.execute(
            sa.update(schema.acl_audit)
            .where(a.id == schema.ACL_AUDIT_ROW_ID)
            .values(audited_revision=a.revision, audited_entries=self._rows(conn))
        )

    @staticmethod
    def _rows(conn: sa.Connection) -> list[dict[str, Any]]:
        rows = conn.execute(sa.select(schema.acls).order_by(schema.acls.c.id)).all()
        return [_row_dict(r) for r in rows]

    # --- denials ------------------------------------------------------------------------------

    def record_denials(self, denials: Sequence[Denials]) -> None:
        """One AUTHORIZATION_DENIED event per entry (no lease: the events table has no foreign
        key, and a denied call never owns its group)."""
        if not denials:
            return
        now = datetime.now(UTC)
        rows = [
            {
                "occurred_at": now,
                "at_ms": d.last_ms,
                "group_id": d.group_id[: schema.GROUP_ID_LENGTH],
                "group_epoch": NO_EPOCH,
                "event_type": EventType.AUTHORIZATION_DENIED.value,
                "member_id": None,
                "payload": _denial_payload(d),
            }
            for d in denials
        ]
        with self._db.transaction(write=True) as conn:
            conn.execute(sa.insert(schema.events), rows)


def _change(caller: AclCaller, entry: AclEntry, row_id: int) -> dict[str, Any]:
    return {
        "principal": caller.principal,
        "address": caller.address,
        "via": caller.via,
        "entry": _entry_dict(entry, row_id),
    }


def _denial_payload(d: Denials) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "principal": d.principal,
        "operation": d.operation,
        "resource_type": d.resource_type,
        "count": d.count,
        "first_ms": d.first_ms,
        "last_ms": d.last_ms,
        "rpcs": list(d.rpcs),
        "groups": list(d.groups),
        "distinct_groups": d.distinct_groups,
        "distinct_groups_capped": d.distinct_groups_capped,
    }
    if d.principal is None:
        payload["overflow"] = True
        payload["principals"] = d.principals
    return payload
