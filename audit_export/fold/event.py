"""One coordinator event as the fold reads it: the columns of `events.parsed` that the findings
use, as plain Python values (resource sets are tuples of resource names). Named tuples: the
export shuffles them to their group's task, and a tuple pickles small and fast."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import events as ev


class Move(NamedTuple):
    resource: str
    source: str | None
    destination: str | None


class Event(NamedTuple):
    """Attributes mirror `events.parsed`: `id`, `at_ms`, `group_epoch`, `event_type`,
    `member_id` and the payload keys (`p_*` there) the findings read."""

    id: int
    at_ms: int
    group_epoch: int
    event_type: str
    member_id: str | None = None
    group_id: str = ""
    reason: str | None = None
    connector: str | None = None
    assignment_epoch: int | None = None
    moves: tuple[Move, ...] | None = None
    scheduled_rebalance_delay_ms: int | None = None
    until_ms: int | None = None
    member_epoch: int | None = None
    state: str | None = None
    assigned: tuple[str, ...] = ()
    revoke: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    target_epoch: int | None = None
    static: bool | None = None
    static_left: bool | None = None
    released: tuple[str, ...] = ()
    held: tuple[str, ...] = ()
    held_until_ms: int | None = None
    previous_member_id: str | None = None
    task_count: int | None = None
    moved_members: tuple[str, ...] = ()
    # classic groups (CLASSIC_REBALANCE_STARTED, CLASSIC_JOIN_COMPLETED, ASSIGNMENT_REFUSED,
    # ASSIGNMENT_DELIVERED's `added`)
    generation: int | None = None
    leader: str | None = None
    protocol: str | None = None
    members: tuple[str, ...] = ()
    withheld: tuple[str, ...] = ()
    added: tuple[str, ...] = ()

    @staticmethod
    def from_parsed(row: Mapping[str, Any]) -> Event:
        """An event from a row of `events.parsed` (a Spark Row's `asDict()`)."""
        moves = row.get("p_moves")
        return Event(
            id=int(row["id"]),
            at_ms=int(row["at_ms"]),
            group_epoch=int(row["group_epoch"]),
            event_type=str(row["event_type"]),
            member_id=row.get("member_id"),
            group_id=str(row.get("group_id") or ""),
            reason=row.get("p_reason"),
            connector=row.get("p_connector"),
            assignment_epoch=row.get("p_assignment_epoch"),
            moves=None
            if moves is None
            else tuple(Move(m["resource"], m["from"], m["to"]) for m in moves),
            scheduled_rebalance_delay_ms=row.get("p_scheduled_rebalance_delay_ms"),
            until_ms=row.get("p_at_ms"),
            member_epoch=row.get("p_member_epoch"),
            state=row.get("p_state"),
            assigned=tuple(row.get("p_assigned") or ()),
            revoke=tuple(row.get("p_revoke") or ()),
            pending=tuple(row.get("p_pending") or ()),
            target_epoch=row.get("p_target_epoch"),
            static=row.get("p_static"),
            static_left=row.get("p_static_left"),
            released=tuple(row.get("p_released") or ()),
            held=tuple(row.get("p_held") or ()),
            held_until_ms=row.get("p_held_until_ms"),
            previous_member_id=row.get("p_previous_member_id"),
            task_count=row.get("p_task_count"),
            moved_members=tuple(row.get("p_moved_members") or ()),
            generation=row.get("p_generation"),
            leader=row.get("p_leader"),
            protocol=row.get("p_protocol"),
            members=tuple(row.get("p_members") or ()),
            withheld=tuple(row.get("p_withheld") or ()),
            added=tuple(row.get("p_added") or ()),
        )

    @property
    def is_dynamic_leave(self) -> bool:
        return self.event_type == ev.MEMBER_LEFT and not bool(self.static)

    @property
    def is_static_leave(self) -> bool:
        return self.event_type == ev.MEMBER_LEFT and bool(self.static)

    @property
    def removes_member(self) -> bool:
        """Fenced, expired, timed out, or a dynamic member leaving: its assignment is gone."""
        return self.event_type in ev.REMOVAL_TYPES or self.is_dynamic_leave
