"""Event retention in SQL (migration 0013, DESIGN 3.20 "Event retention bounded by the export"):
the audit exports' registrations (`audit_export_progress`, a row appended by the export after each
committed run), the pruning row (`event_pruning`: the highest event id pruned, and the lease that
lets one coordinator prune at a time), and the deletion of one batch of old events.

The pruning lease is the one row's `owner_id` / `lease_until`, taken by an UPDATE that succeeds
only if the lease is free, lapsed or already ours, against the database's clock (as the group
leases are, `leases`); it works the same on PostgreSQL and SQLite. Every batch renews it first,
in the batch's own transaction, so a batch runs only under a live lease and two batches never
run at once (the renewal locks the row until the batch commits: PostgreSQL's row lock; SQLite's
write lock). The batch then deletes at most `limit` events, the lowest ids at or below the
ceiling that are older than the cutoff, and raises the floor (`pruned_through_event_id`, which
only rises) to the highest id it deleted, in the same transaction: a crash leaves both or
neither. Each batch is a short transaction of its own; it locks no row a group's commit needs
(event rows are only ever inserted by commits, never updated).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import schema
from .engine import Database

_P = schema.audit_export_progress.c
_R = schema.event_pruning.c
_E = schema.events.c
_ROW = schema.EVENT_PRUNING_ROW_ID


@dataclass(frozen=True, slots=True)
class Registration:
    """A registered audit export: its latest progress row and how many runs it recorded.

    Attributes:
        export_name: the export's name (`coordinator-audit-export --export-name`).
        since_event_id: its latest run exported the events after this id...
        until_event_id: ...up to and including this one.
        lowest_unfilled_id: the lowest id that run must still be able to read again (an id
            missing from its snapshot, or re-checked), or `until_event_id` + 1.
        at: when that run was recorded (the export's clock, UTC).
        runs: how many runs it has recorded.
    """

    export_name: str
    since_event_id: int
    until_event_id: int
    lowest_unfilled_id: int
    at: datetime
    runs: int


@dataclass(frozen=True, slots=True)
class PruningState:
    """The `event_pruning` row.

    Attributes:
        pruned_through_event_id: the highest event id pruned (0: none): events at or below it
            may be gone, so an export run whose range starts below it refuses.
        pruned_at: when the last batch deleted something.
        owner_id: the coordinator holding (or last holding) the pruning lease.
        lease_until: when its lease ends (database clock).
    """

    pruned_through_event_id: int
    pruned_at: datetime | None
    owner_id: str | None
    lease_until: datetime | None


@dataclass(frozen=True, slots=True)
class PrunedBatch:
    """What one batch did.

    Attributes:
        deleted: events deleted.
        highest_deleted: the highest id deleted (0: none).
        pruned_through_event_id: the floor after the batch.
    """

    deleted: int
    highest_deleted: int
    pruned_through_event_id: int


class RetentionStore:
    """The registrations, the pruning row and the batches, for one coordinator (`owner_id`: its
    identity in the pruning lease, unique per process lifetime as in the group leases)."""

    def __init__(self, db: Database, owner_id: str) -> None:
        self._db = db
        self.owner_id = owner_id

    # --- registrations ------------------------------------------------------------------------

    def registrations(self) -> list[Registration]:
        """Every registered export's latest row, by name (one statement)."""

        def read(conn: Connection) -> list[Registration]:
            latest = (
                sa.select(
                    _P.export_name,
                    sa.func.max(_P.id).label("latest_id"),
                    sa.func.count().label("runs"),
                )
                .group_by(_P.export_name)
                .subquery()
            )
            rows = conn.execute(
                sa.select(
                    _P.export_name,
                    _P.since_event_id,
                    _P.until_event_id,
                    _P.lowest_unfilled_id,
                    _P.at,
                    latest.c.runs,
                )
                .join(latest, _P.id == latest.c.latest_id)
                .order_by(_P.export_name)
            )
            return [
                Registration(
                    str(r.export_name),
                    int(r.since_event_id),
                    int(r.until_event_id),
                    int(r.lowest_unfilled_id),
                    r.at,
                    int(r.runs),
                )
                for r in rows
            ]

        return self._db.retrying(False, read)

    def remove(self, export_name: str) -> int:
        """Forget an export: delete its progress rows (how many). The pruner no longer keeps
        anything for it; its next run refuses if the events it needs were pruned meanwhile."""

        def delete(conn: Connection) -> int:
            done = conn.execute(
                sa.delete(schema.audit_export_progress).where(_P.export_name == export_name)
            )
            return int(done.rowcount)

        return self._db.retrying(True, delete)

    # --- the pruning row ----------------------------------------------------------------------

    def pruning(self) -> PruningState:
        """The pruning row as stored (a missing row reads as nothing pruned, no lease)."""

        def read(conn: Connection) -> PruningState:
            row = conn.execute(
                sa.select(
                    _R.pruned_through_event_id, _R.pruned_at, _R.owner_id, _R.lease_until
                ).where(_R.id == _ROW)
            ).one_or_none()
            if row is None:
                return PruningState(0, None, None, None)
            return PruningState(
                int(row.pruned_through_event_id), row.pruned_at, row.owner_id, row.lease_until
            )

        return self._db.retrying(False, read)

    def oldest_event_at(self) -> datetime | None:
        """When the event with the lowest id happened (None: no event). The lowest id stands
        for the oldest: ids follow commit order, timestamps the coordinators' clocks."""

        def read(conn: Connection) -> datetime | None:
            at: datetime | None = conn.execute(
                sa.select(_E.occurred_at).order_by(_E.id).limit(1)
            ).scalar_one_or_none()
            return at

        return self._db.retrying(False, read)

    def take_lease(self) -> bool:
        """Take the pruning lease if it is free, lapsed or ours (extending it); False if another
        coordinator holds it."""

        def take(conn: Connection) -> bool:
            now = self._db.now()
            done = conn.execute(
                sa.update(schema.event_pruning)
                .where(
                    _R.id == _ROW,
                    sa.or_(
                        _R.owner_id.is_(None),
                        _R.owner_id == self.owner_id,
                        _R.lease_until.is_(None),
                        _R.lease_until <= now,
                    ),
                )
                .values(owner_id=self.owner_id, lease_until=self._db.until()),
                self._db.time_params(),
            )
            return int(done.rowcount) == 1

        return self._db.retrying(True, take)

    def release_lease(self) -> None:
        """Give the pruning lease up (graceful stop); nothing if it is not ours."""

        def release(conn: Connection) -> None:
            conn.execute(
                sa.update(schema.event_pruning)
                .where(_R.id == _ROW, _R.owner_id == self.owner_id)
                .values(owner_id=None, lease_until=None)
            )

        self._db.retrying(True, release)

    # --- pruning ------------------------------------------------------------------------------

    def prune_batch(self, ceiling: int, older_than: datetime, limit: int) -> PrunedBatch | None:
        """Under a live pruning lease of ours (renewed here first), delete at most `limit`
        events: of the `limit` lowest ids at or below `ceiling`, those that occurred before
        `older_than`; raise the floor to the highest id deleted. None (nothing done) if the
        lease is not ours or has lapsed. Fewer than `limit` deleted means that nothing more is
        prunable now (the rest at or below the ceiling is younger, or there is none)."""
        if limit <= 0:
            raise ValueError("limit must be positive")
        if older_than.tzinfo is None:
            raise ValueError("older_than must be timezone-aware")

        def batch(conn: Connection) -> PrunedBatch | None:
            now = self._db.now()
            renewed = conn.execute(
                sa.update(schema.event_pruning)
                .where(_R.id == _ROW, _R.owner_id == self.owner_id, _R.lease_until > now)
                .values(lease_until=self._db.until()),
                self._db.time_params(),
            )
            if int(renewed.rowcount) != 1:
                return None
            lowest = sa.select(_E.id).where(_E.id <= ceiling).order_by(_E.id).limit(limit)
            delete = (
                sa.delete(schema.events)
                .where(_E.id.in_(lowest), _E.occurred_at < older_than)
                .returning(_E.id)
            )
            if self._db.sqlite:  # no DELETE in a WITH: the ids come back
                ids = [int(i) for i in conn.execute(delete).scalars()]
                deleted, highest = len(ids), max(ids, default=0)
            else:  # counted by the database
                gone = delete.cte("gone")
                row = conn.execute(
                    sa.select(sa.func.count(), sa.func.coalesce(sa.func.max(gone.c.id), 0))
                ).one()
                deleted, highest = int(row[0]), int(row[1])
            floor = _raise_floor(conn, highest) if deleted else _floor(conn)
            return PrunedBatch(deleted, highest, floor)

        return self._db.retrying(True, batch)


def _floor(conn: Connection) -> int:
    value = conn.execute(
        sa.select(_R.pruned_through_event_id).where(_R.id == _ROW)
    ).scalar_one_or_none()
    return int(value or 0)


def _raise_floor(conn: Connection, highest: int) -> int:
    """Raise `pruned_through_event_id` to `highest` if it is below (it never goes down); the
    floor after."""
    values: dict[str, Any] = {
        "pruned_through_event_id": sa.case(
            (_R.pruned_through_event_id < highest, highest), else_=_R.pruned_through_event_id
        ),
        "pruned_at": datetime.now(UTC),
    }
    floor = conn.execute(
        sa.update(schema.event_pruning)
        .where(_R.id == _ROW)
        .values(**values)
        .returning(_R.pruned_through_event_id)
    ).scalar_one()
    return int(floor)
