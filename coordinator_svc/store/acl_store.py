"""The ACL table and the authorization events: reading the ACLs in force (and a cheap stamp that
changes whenever they do), adding and removing entries for `coordinator-svc acl`, and writing
the aggregated AUTHORIZATION_DENIED events into the audit trail."""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class Denials:
    """Calls of one principal denied one operation on one group (or the cluster) in an
    interval."""

    principal: str
    operation: str
    resource: str
    count: int
    first_ms: int
    last_ms: int
    rpcs: tuple[str, ...]


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


class AclStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    def stamp(self) -> tuple[int, int]:
        """(number of entries, largest id): changes with every add or remove (ids are never
        reused)."""

        def read(conn: sa.Connection) -> tuple[int, int]:
            row = conn.execute(
                sa.select(sa.func.count(), sa.func.coalesce(sa.func.max(schema.acls.c.id), 0))
            ).one()
            return int(row[0]), int(row[1])

        return self._db.retrying(False, read)

    def load(self) -> tuple[tuple[int, int], list[AclEntry]]:
        """The stamp and the entries, from one snapshot."""

        def read(conn: sa.Connection) -> tuple[tuple[int, int], list[AclEntry]]:
            rows = conn.execute(sa.select(schema.acls).order_by(schema.acls.c.id)).all()
            entries = [_entry(r) for r in rows]
            return (len(rows), max((r.id for r in rows), default=0)), entries

        return self._db.retrying(False, read)

    def add(self, entry: AclEntry) -> bool:
        """Add `entry`; False if the same entry is already there."""

        def write(conn: sa.Connection) -> bool:
            exists = conn.execute(sa.select(schema.acls.c.id).where(_same_entry(entry))).first()
            if exists is not None:
                return False
            conn.execute(
                sa.insert(schema.acls).values(
                    principal=entry.principal,
                    operation=entry.operation.value,
                    resource_type=entry.resource_type.value,
                    pattern_type=entry.pattern_type.value,
                    pattern=entry.pattern,
                    permission=entry.permission.value,
                    created_at=datetime.now(UTC),
                )
            )
            return True

        with self._db.transaction(write=True) as conn:
            return write(conn)

    def remove(self, entry: AclEntry) -> int:
        """Remove `entry`; how many rows went (0 or 1)."""
        with self._db.transaction(write=True) as conn:
            result = conn.execute(sa.delete(schema.acls).where(_same_entry(entry)))
            return int(result.rowcount or 0)

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
                "group_id": d.resource[: schema.GROUP_ID_LENGTH],
                "group_epoch": -1,
                "event_type": EventType.AUTHORIZATION_DENIED.value,
                "member_id": None,
                "payload": {
                    "principal": d.principal,
                    "operation": d.operation,
                    "count": d.count,
                    "first_ms": d.first_ms,
                    "last_ms": d.last_ms,
                    "rpcs": list(d.rpcs),
                },
            }
            for d in denials
        ]
        with self._db.transaction(write=True) as conn:
            conn.execute(sa.insert(schema.events), rows)
