"""The findings of one group as a fold over its events in id order: `GroupFold(state).apply(e)`
for each new event, then `finish()` for this run's rows and the state the next run starts from.

Folding the events in two parts, carrying the state between them, gives the same rows as folding
them all at once (the property the incremental export rests on; tests check it at every split).
The meaning of every finding is the package `audit_export.findings`' (its docstring); this is
the same computation, event by event, with these conventions where the order of two things is
not given by event ids:

- Within one event, a static takeover's new member becomes live before its predecessor stops.
- Times (`at_ms`) are taken in event order: the coordinator's clock goes forward within a group
  (a group's events come from one lease holder at a time).
- A rebalance that a later bump superseded, whose members all converged and whose lost resources
  all restarted, is final: nothing changes it any more (a late install or revocation request for
  its epoch is ignored; the coordinator never sends one) and it leaves the state.

A classic group's rows (one per generation, plan-issue25 3.11) follow the same meaning: a
generation's row is opened by its first CLASSIC_REBALANCE_STARTED (or its completion), a row
that is final is opened afresh by a later one of the same generation (as a run that no longer
carries it would), and its members converge by their own rule, not by connect's levels.

Each row carries `open`: True if a later event, or only time, can still change it. A run writes
every row it created or changed, and every open row again.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import events as ev
from .event import Event
from .state import (
    ConnectorMoves,
    Gap,
    GroupState,
    Lost,
    LostStats,
    MemberState,
    Overlap,
    Rebalance,
    Span,
    Window,
)

TASK_NAME = re.compile(r"^(.*)-(\d+)$")

CONNECT = "connect"
CLASSIC = "classic"
"""A rebalance row's `group_type`: opened by GROUP_EPOCH_BUMPED, or by a classic rebalance."""

DOUBLE_OWNERSHIP = "DOUBLE_OWNERSHIP"
UNASSIGNED_TOO_LONG = "UNASSIGNED_TOO_LONG"

_JOINS = (ev.MEMBER_JOINED, ev.MEMBER_REJOINED, ev.STATIC_MEMBER_REPLACED)
_MEMBERSHIP = (*_JOINS, ev.MEMBER_LEFT, *ev.REMOVAL_TYPES)
_LOSSES = (ev.MEMBER_LEFT, ev.MEMBER_SESSION_EXPIRED, *ev.REMOVAL_TYPES)


@dataclass
class Outputs:
    """Rows per findings table (dicts by column name), plus `removed_members`: the members whose
    last membership event removed them (the job checks them against the snapshot)."""

    ownership: list[dict[str, Any]] = field(default_factory=list)
    rebalances: list[dict[str, Any]] = field(default_factory=list)
    lost_resources: list[dict[str, Any]] = field(default_factory=list)
    connector_moves: list[dict[str, Any]] = field(default_factory=list)
    violations: list[dict[str, Any]] = field(default_factory=list)
    removed_members: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _MemberRow:
    member_id: str
    set_assigned: list[str] | None
    set_pending: list[str] | None
    set_active: bool | None


@dataclass
class _MembershipRow:
    member_id: str
    event_type: str
    live: bool
    listed: bool
    held: tuple[str, ...]


def _owned(m: MemberState) -> list[str]:
    if not m.active:
        return []
    seen = dict.fromkeys(m.assigned)
    seen.update(dict.fromkeys(m.pending))
    return list(seen)


def split_name(resource: str) -> tuple[str, bool]:
    """(connector, is a task) from a resource's name alone: `A-3` is task 3 of `A`."""
    match = TASK_NAME.match(resource)
    if match and match.group(1) != "":
        return match.group(1), True
    return resource, False


class GroupFold:
    """Folds one group's events (in id order) into its findings."""

    def __init__(self, state: GroupState, *, as_of_ms: int, grace_ms: int) -> None:
        self.s = state
        self.as_of_ms = as_of_ms
        self.grace_ms = grace_ms
        self.out = Outputs()
        self._touched_connectors: set[str] = set()
        self._lost_resources = {lost.resource for lost in state.lost_open}
        self._prune_at = 64

    # -- the event ------------------------------------------------------------------------

    def apply(self, e: Event) -> None:
        s = self.s
        if s.last_event_id is not None and e.id <= s.last_event_id:
            raise OutOfOrder(s.group_id, e.id, s.last_event_id)
        first = s.last_event_id is None
        s.last_event_id = e.id
        s.last_at_ms = e.at_ms
        here: Span = (e.id, e.at_ms, e.group_epoch)

        membership = self._membership_rows(e)
        member_rows = self._member_rows(e)
        # Who ran what this delivery adds, before it (a classic generation's moves).
        prior = (
            {r: s.last_owner.get(r) for r in e.added}
            if e.event_type == ev.ASSIGNMENT_DELIVERED
            else {}
        )

        # Liveness (live counts, empty spans, convergence of members who stop being live).
        for change in membership:
            self._apply_membership(change, e, here)
        if first or e.event_type == ev.GROUP_EPOCH_BUMPED:
            self._live_count_row(e)

        # Assignments: what each member runs before and after this event.
        starts: list[tuple[str, str]] = []
        stops: list[tuple[str, str]] = []
        for row in member_rows:
            m = s.members.setdefault(row.member_id, MemberState())
            before = _owned(m)
            if row.set_assigned is not None:
                m.assigned = row.set_assigned
            if row.set_pending is not None:
                m.pending = row.set_pending
            if row.set_active is not None:
                m.active = row.set_active
            after = _owned(m)
            after_set, before_set = set(after), set(before)
            starts += [(row.member_id, r) for r in after if r not in before_set]
            stops += [(row.member_id, r) for r in before if r not in after_set]

        # Catalogue changes.
        added, gone = self._catalogue(e, here)

        # Gaps, in the order the whole-history computation takes bounds at one event id:
        # run starts, catalogue additions, catalogue removals, run stops.
        run_count = {r: len(s.runs.get(r, {})) for _, r in starts + stops}
        gap_changes: list[tuple[str, int, int]] = (
            [(r, 0, 1) for _, r in starts]
            + [(r, 1, 0) for r in added]
            + [(r, -1, 0) for r in gone]
            + [(r, 0, -1) for _, r in stops]
        )
        for r, d_exists, d_runs in gap_changes:
            was = s.exists.get(r, 0) > 0 and run_count.get(r, len(s.runs.get(r, {}))) == 0
            if d_exists:
                s.exists[r] = s.exists.get(r, 0) + d_exists
                if s.exists[r] <= 0:
                    s.exists.pop(r, None)
            if d_runs:
                run_count[r] = run_count.get(r, len(s.runs.get(r, {}))) + d_runs
            now = s.exists.get(r, 0) > 0 and run_count.get(r, len(s.runs.get(r, {}))) == 0
            if now and not was:
                s.gaps[r] = Gap(here)
            elif was and not now:
                self._close_gap(r, e)

        # Running intervals: stops first (an interval ending at an event does not overlap one
        # starting at it), then starts.
        for member_id, r in stops:
            self._stop_run(r, member_id, here)
        restarted: set[str] = set()
        for member_id, r in starts:
            self._start_run(r, member_id, here)
            restarted.add(r)
        if restarted & self._lost_resources:
            self._restart_lost(restarted, e, here)

        # Losses, levels and rebalances.
        if e.event_type in _LOSSES:
            self._losses(e)
        if e.event_type == ev.ASSIGNMENT_DELIVERED and e.member_id is not None:
            self._delivered(e)
            self._classic_delivered(e, prior)
        elif e.event_type == ev.CLASSIC_REBALANCE_STARTED:
            self._classic_started(e)
        elif e.event_type == ev.CLASSIC_JOIN_COMPLETED:
            self._classic_completed(e)
        elif e.event_type == ev.ASSIGNMENT_REFUSED:
            self._classic_refused(e)
        elif e.event_type == ev.GROUP_EPOCH_BUMPED:
            self._bump(e)
        elif e.event_type == ev.TARGET_INSTALLED:
            self._installed(e)
            if e.assignment_epoch is not None:
                for member_id in e.moved_members:  # moved at the install itself (3.21)
                    self._reached(member_id, e.assignment_epoch, e.at_ms)
        elif e.event_type == ev.REVOCATION_REQUESTED and e.target_epoch is not None:
            rb = s.rebalances.get(e.target_epoch)
            if rb is not None and not self._rebalance_final(rb):
                rb.revoked = sorted(set(rb.revoked) | set(e.revoke))
        elif e.event_type == ev.SCHEDULED_REBALANCE_SET and e.until_ms is not None:
            self._window(e.at_ms, e.until_ms, None)
        holds = e.event_type in ev.HOLDING_TYPES
        if holds and e.held_until_ms is not None:
            for r in e.held:
                self._window(e.at_ms, e.held_until_ms, r)
        if e.event_type == ev.GROUP_DELETED:
            self._deleted(e)
        if len(s.windows) > self._prune_at:
            self._prune_windows()
            self._prune_at = max(64, 2 * len(s.windows))

    # -- rows an event makes ----------------------------------------------------------------

    def _member_rows(self, e: Event) -> list[_MemberRow]:
        if e.member_id is None:
            return []
        t = e.event_type
        removed = e.removes_member
        set_assigned: list[str] | None = None
        if t == ev.ASSIGNMENT_DELIVERED:
            set_assigned = list(e.assigned)
        elif t == ev.MEMBER_JOINED or removed:
            set_assigned = []
        elif t == ev.STATIC_MEMBER_REPLACED:
            previous = self.s.members.get(e.previous_member_id or "")
            set_assigned = list(previous.assigned) if previous is not None else []
        set_pending: list[str] | None = None
        if t == ev.REVOCATION_REQUESTED:
            set_pending = list(e.revoke)
        elif t == ev.REVOCATION_PARTIALLY_ACKNOWLEDGED:
            set_pending = list(e.pending)
        elif (
            t
            in (
                ev.REVOCATION_ACKNOWLEDGED,
                ev.MEMBER_JOINED,
                ev.MEMBER_LEFT,
                ev.STATIC_MEMBER_REPLACED,
            )
            or removed
        ):
            set_pending = []
        set_active: bool | None = None
        if t in (ev.ASSIGNMENT_DELIVERED, *_JOINS):
            set_active = True
        elif t == ev.MEMBER_LEFT or removed:
            set_active = False
        rows = []
        if set_assigned is not None or set_pending is not None or set_active is not None:
            rows.append(_MemberRow(e.member_id, set_assigned, set_pending, set_active))
        if t == ev.STATIC_MEMBER_REPLACED and e.previous_member_id is not None:
            rows.append(_MemberRow(e.previous_member_id, [], [], False))
        return rows

    def _membership_rows(self, e: Event) -> list[_MembershipRow]:
        if e.member_id is None or e.event_type not in _MEMBERSHIP:
            return []
        rows = [
            _MembershipRow(
                e.member_id,
                e.event_type,
                e.event_type in _JOINS,
                not e.removes_member,
                e.held if e.is_static_leave else (),
            )
        ]
        if e.event_type == ev.STATIC_MEMBER_REPLACED and e.previous_member_id is not None:
            rows.append(
                _MembershipRow(
                    e.previous_member_id, "STATIC_MEMBER_REPLACED_PREDECESSOR", False, False, ()
                )
            )
        return rows

    # -- membership ---------------------------------------------------------------------------

    def _apply_membership(self, row: _MembershipRow, e: Event, here: Span) -> None:
        s = self.s
        m = s.members.setdefault(row.member_id, MemberState())
        for wid in m.static_windows:
            self._close_window(wid, e.at_ms)
        m.static_windows = [self._window(e.at_ms, None, r) for r in row.held]
        was_live = m.live
        m.live = row.live
        m.listed = row.listed
        m.last_row = (e.id, e.at_ms, e.group_epoch, row.event_type)
        if row.event_type in (ev.MEMBER_JOINED, ev.STATIC_MEMBER_REPLACED):
            level = e.group_epoch - 1
            m.floor = level if m.floor is None else max(m.floor, level)
        if was_live and not row.live:
            for rb in s.rebalances.values():
                if row.member_id in rb.waiting_members:
                    rb.waiting_members.discard(row.member_id)
                    rb.last_done_ms = _max(rb.last_done_ms, e.at_ms)
        s.live_count += int(row.live) - int(was_live)
        self._live_count_row(e)

    def _live_count_row(self, e: Event) -> None:
        s = self.s
        empty = s.live_count <= 0
        if s.empty is not None and empty == s.empty:
            return
        s.empty = empty
        if empty:
            s.empty_window = self._window(e.at_ms, None, None)
        elif s.empty_window is not None:
            self._close_window(s.empty_window, e.at_ms)
            s.empty_window = None

    # -- excuse windows and gaps ------------------------------------------------------------

    def _window(self, start_ms: int, end_ms: int | None, resource: str | None) -> int:
        s = self.s
        wid = s.next_window_id
        s.next_window_id += 1
        s.windows.append(Window(wid, start_ms, end_ms, resource))
        return wid

    def _close_window(self, wid: int, end_ms: int) -> None:
        for w in self.s.windows:
            if w.wid == wid:
                w.end_ms = end_ms
                return

    def _excused_until(self, r: str, start_ms: int, end_ms: int) -> int | None:
        """The latest end of a window that overlaps (start_ms, end_ms) for `r`; an open window
        counts as ending at `as_of_ms`."""
        best: int | None = None
        for w in self.s.windows:
            if w.resource is not None and w.resource != r:
                continue
            w_end = self.as_of_ms if w.end_ms is None else w.end_ms
            if w.start_ms < end_ms and w_end > start_ms:
                best = _max(best, w_end)
        return best

    def _charged(self, r: str, gap: Gap, end_ms: int) -> int:
        excused = self._excused_until(r, gap.start[1], end_ms)
        return end_ms - max(gap.start[1], excused if excused is not None else 0)

    def _close_gap(self, r: str, e: Event) -> None:
        gap = self.s.gaps.pop(r)
        charged = self._charged(r, gap, e.at_ms)
        if charged > self.grace_ms:
            self.out.violations.append(self._unassigned_row(r, gap, charged, e.id))

    def _unassigned_row(self, r: str, gap: Gap, charged: int, end_id: int | None) -> dict[str, Any]:
        tail = ", still unassigned" if end_id is None else f" to event {end_id}"
        return {
            "kind": UNASSIGNED_TOO_LONG,
            "source": "events",
            "group_id": self.s.group_id,
            "group_epoch": gap.start[2],
            "resource": r,
            "members": [],
            "event_id": gap.start[0],
            "at_ms": gap.start[1],
            "duration_ms": charged,
            "detail": (
                f"{r} ran on no member for {charged} ms beyond any delay or hold "
                f"(grace {self.grace_ms} ms), from event {gap.start[0]}{tail}"
            ),
            "open": end_id is None,
        }

    def _prune_windows(self) -> None:
        """Drop the closed windows no open or later gap can overlap."""
        s = self.s
        horizon = min([g.start[1] for g in s.gaps.values()] + [s.last_at_ms or 0])
        s.windows = [w for w in s.windows if w.end_ms is None or w.end_ms > horizon]

    # -- catalogue -------------------------------------------------------------------------

    def _catalogue(self, e: Event, here: Span) -> tuple[list[str], list[str]]:
        s = self.s
        if e.event_type == ev.GROUP_DELETED:  # the whole catalogue goes with the group
            gone = [r for resources in s.catalogue.values() for r in resources]
            s.catalogue.clear()
            return [], gone
        if e.event_type not in (ev.CONNECTOR_PUT, ev.CONNECTOR_DELETED) or e.connector is None:
            return [], []
        c = e.connector
        if e.event_type == ev.CONNECTOR_PUT:
            exists = [c] + [f"{c}-{i}" for i in range(max(0, e.task_count or 0))]
        else:
            exists = []
        before = s.catalogue.get(c, [])
        before_set, exists_set = set(before), set(exists)
        added = [r for r in exists if r not in before_set]
        gone = [r for r in before if r not in exists_set]
        if exists:
            s.catalogue[c] = exists
        else:
            s.catalogue.pop(c, None)
        for r in added:
            if r not in s.resources:
                s.resources[r] = (c, None if r == c else int(r[len(c) + 1 :]))
        return added, gone

    def _connector_of(self, r: str) -> tuple[str, bool]:
        known = self.s.resources.get(r)
        if known is not None:
            return known[0], known[1] is not None
        return split_name(r)

    # -- running intervals, double ownership, moves --------------------------------------------

    def _start_run(self, r: str, member_id: str, here: Span) -> None:
        s = self.s
        open_runs = s.runs.setdefault(r, {})
        for other, other_start in open_runs.items():
            if other == member_id:
                continue
            if member_id < other:
                s.overlaps.append(Overlap(r, member_id, here, other, other_start))
            else:
                s.overlaps.append(Overlap(r, other, other_start, member_id, here))
        open_runs[member_id] = here
        previous = s.last_owner.get(r)
        moved = previous is not None and previous != member_id
        s.last_owner[r] = member_id
        connector, is_task = self._connector_of(r)
        counts = s.connectors.setdefault(connector, ConnectorMoves())
        self._touched_connectors.add(connector)
        if is_task:
            counts.tasks_run.add(r)
            if moved:
                counts.task_moves += 1
                counts.tasks_moved.add(r)
        elif moved:
            counts.connector_moves += 1

    def _stop_run(self, r: str, member_id: str, here: Span) -> None:
        s = self.s
        open_runs = s.runs.get(r, {})
        start = open_runs.pop(member_id, None)
        if not open_runs:
            s.runs.pop(r, None)
        if start is None:
            return
        self.out.ownership.append(self._interval_row(r, member_id, start, here))
        keep = []
        for o in s.overlaps:
            if o.resource == r and member_id in (o.a_member, o.b_member):
                self.out.violations.append(self._overlap_row(o, here[1]))
            else:
                keep.append(o)
        s.overlaps = keep

    def _interval_row(
        self, r: str, member_id: str, start: Span, end: Span | None
    ) -> dict[str, Any]:
        return {
            "group_id": self.s.group_id,
            "resource": r,
            "member_id": member_id,
            "start_id": start[0],
            "start_ms": start[1],
            "start_epoch": start[2],
            "end_id": None if end is None else end[0],
            "end_ms": None if end is None else end[1],
            "end_epoch": None if end is None else end[2],
            "open": end is None,
        }

    def _overlap_row(self, o: Overlap, end_ms: int | None) -> dict[str, Any]:
        later = o.a_start if o.a_start[0] > o.b_start[0] else o.b_start
        event_id = max(o.a_start[0], o.b_start[0])
        at_ms = max(o.a_start[1], o.b_start[1])
        until = self.as_of_ms if end_ms is None else end_ms
        return {
            "kind": DOUBLE_OWNERSHIP,
            "source": "events",
            "group_id": self.s.group_id,
            "group_epoch": later[2],
            "resource": o.resource,
            "members": [o.a_member, o.b_member],
            "event_id": event_id,
            "at_ms": at_ms,
            "duration_ms": until - at_ms,
            "detail": (
                f"{o.resource} ran on {o.a_member} and {o.b_member} at once, from event {event_id}"
            ),
            "open": end_ms is None,
        }

    # -- lost resources ------------------------------------------------------------------------

    def _losses(self, e: Event) -> None:
        t = e.event_type
        lost: Iterable[str]
        if t == ev.MEMBER_LEFT:
            lost = e.held if e.static else e.released
        elif t == ev.MEMBER_SESSION_EXPIRED:
            lost = () if e.static_left else e.released
        elif t in ev.HOLDING_TYPES:
            lost = e.held
        else:
            lost = ()
        epoch = e.group_epoch + 1
        for r in dict.fromkeys(lost):
            self.s.lost_open.append(Lost(r, epoch, e.member_id, t, e.id, e.at_ms))
            self._lost_resources.add(r)
            stats = self.s.lost_stats.setdefault(epoch, LostStats())
            stats.count += 1
            stats.waiting += 1

    def _restart_lost(self, restarted: set[str], e: Event, here: Span) -> None:
        s = self.s
        keep = []
        for lost in s.lost_open:
            if lost.resource not in restarted or lost.loss_event_id >= e.id:
                keep.append(lost)
                continue
            member = min(m for m, start in s.runs[lost.resource].items() if start[0] == e.id)
            waited = e.at_ms - lost.lost_at_ms
            self.out.lost_resources.append(self._lost_row(lost, member, e.id, e.at_ms))
            stats = s.lost_stats.setdefault(lost.epoch, LostStats())
            stats.waiting -= 1
            stats.max_waited_ms = _max(stats.max_waited_ms, waited)
        s.lost_open = keep
        self._lost_resources = {lost.resource for lost in keep}

    def _lost_row(
        self,
        lost: Lost,
        member: str | None,
        restart_id: int | None,
        restart_ms: int | None,
        ended_ms: int | None = None,
    ) -> dict[str, Any]:
        """`ended_ms`: the group was deleted then, the resource never restarted (a closed row:
        `waiting_so_far_ms` is its whole wait)."""
        waited_until = self.as_of_ms if ended_ms is None else ended_ms
        return {
            "group_id": self.s.group_id,
            "group_epoch": lost.epoch,
            "resource": lost.resource,
            "lost_from_member_id": lost.lost_from_member_id,
            "loss_event_type": lost.loss_event_type,
            "loss_event_id": lost.loss_event_id,
            "lost_at_ms": lost.lost_at_ms,
            "restarted_on_member_id": member,
            "restart_event_id": restart_id,
            "restarted_at_ms": restart_ms,
            "waited_ms": None if restart_ms is None else restart_ms - lost.lost_at_ms,
            "waiting_so_far_ms": waited_until - lost.lost_at_ms if restart_ms is None else None,
            "open": restart_id is None and ended_ms is None,
        }

    # -- deletion ---------------------------------------------------------------------------------

    def _deleted(self, e: Event) -> None:
        """GROUP_DELETED (DESIGN 3.20): nothing of the group can change any more, so every row
        still open ends here. (Its catalogue went as a removal of every resource, in `apply`,
        which closed the gaps; a deleted group has no member and no hold, so no run or overlap
        is open.) Lost resources never restarted are closed unrestarted; the latest rebalance
        is superseded by the deletion; the excuse windows close (the group's emptiness goes
        on: a group created again under the id is empty until a member joins). A group created
        again under
        the id continues its epochs (DESIGN 3.20), so its rows never share an epoch with
        these."""
        s = self.s
        for lost in s.lost_open:
            self.out.lost_resources.append(self._lost_row(lost, None, None, None, e.at_ms))
            stats = s.lost_stats.setdefault(lost.epoch, LostStats())
            stats.waiting -= 1
        s.lost_open = []
        self._lost_resources = set()
        for rb in s.rebalances.values():
            if rb.next_bump_event_id is None:
                rb.next_bump_event_id = e.id
            rb.waiting_members = set()
        for w in s.windows:  # but the group's emptiness, which goes on until a member joins
            if w.end_ms is None and w.wid != s.empty_window:
                w.end_ms = e.at_ms
        for m in s.members.values():
            m.static_windows = []

    # -- rebalances ------------------------------------------------------------------------------

    def _bump(self, e: Event) -> None:
        s = self.s
        earlier = [epoch for epoch in s.rebalances if epoch < e.group_epoch]
        if earlier:
            previous = s.rebalances[max(earlier)]
            if previous.next_bump_event_id is None:
                previous.next_bump_event_id = e.id
        s.rebalances[e.group_epoch] = Rebalance(
            epoch=e.group_epoch,
            reason=e.reason,
            trigger_member_id=e.member_id,
            trigger_connector=e.connector,
            bump_event_id=e.id,
            bumped_at_ms=e.at_ms,
            live_members=s.live_count,
        )

    def _installed(self, e: Event) -> None:
        s = self.s
        for mv in e.moves or ():
            if mv.source is not None and mv.destination is not None:
                connector, is_task = self._connector_of(mv.resource)
                counts = s.connectors.setdefault(connector, ConnectorMoves())
                self._touched_connectors.add(connector)
                if is_task:
                    counts.target_task_moves += 1
        if e.assignment_epoch is None:
            return
        rb = s.rebalances.get(e.assignment_epoch)
        if (
            rb is None
            or rb.group_type != CONNECT
            or rb.install is not None
            or self._rebalance_final(rb)
        ):
            return
        moves: list[dict[str, Any]] = [
            {"resource": m.resource, "from": m.source, "to": m.destination} for m in e.moves or ()
        ]
        rb.install = {
            "install_event_id": e.id,
            "installed_at_ms": e.at_ms,
            "assignor_member_id": e.member_id,
            "moves": moves,
            "scheduled_rebalance_delay_ms": e.scheduled_rebalance_delay_ms,
            "removed": sorted(
                {
                    m["resource"]
                    for m in moves
                    if m["to"] is None and s.exists.get(m["resource"], 0) <= 0
                }
            ),
        }
        rb.waiting_members = {m_id for m_id, m in s.members.items() if m.live}
        rb.members_to_converge = len(rb.waiting_members)

    def _delivered(self, e: Event) -> None:
        assert e.member_id is not None
        if e.member_epoch is None:
            self.s.members.setdefault(e.member_id, MemberState())
            return
        level = e.member_epoch if e.state == "STABLE" else e.member_epoch - 1
        self._reached(e.member_id, level, e.at_ms)

    def _reached(self, member_id: str, level: int, at_ms: int) -> None:
        """The member has reached the targets of every epoch up to `level` (a delivery, or an
        install that moved it): it is done with each rebalance above its floor up to there."""
        s = self.s
        m = s.members.setdefault(member_id, MemberState())
        if m.floor is not None and level > m.floor:
            for epoch in range(m.floor + 1, level + 1):
                rb = s.rebalances.get(epoch)
                if rb is None or rb.group_type != CONNECT:
                    continue  # a classic row converges by its own rule (_classic_delivered)
                if member_id in rb.waiting_members:
                    rb.waiting_members.discard(member_id)
                    rb.last_done_ms = _max(rb.last_done_ms, at_ms)
        m.floor = level if m.floor is None else max(m.floor, level)

    # -- classic generations (plan-issue25 3.11) ------------------------------------------------

    def _previous_superseded_by(self, epoch: int, event_id: int) -> None:
        """The row before `epoch` (the latest one still carried) is superseded at `event_id`."""
        s = self.s
        earlier = [x for x in s.rebalances if x < epoch]
        if earlier:
            previous = s.rebalances[max(earlier)]
            if previous.next_bump_event_id is None:
                previous.next_bump_event_id = event_id

    def _classic_open(self, e: Event, epoch: int, reason: str | None) -> Rebalance:
        """The row of classic generation `epoch`, opened at `e` unless it exists."""
        s = self.s
        rb = s.rebalances.get(epoch)
        # A final row is as good as gone (the run's end drops it): opened again, as a later run
        # that no longer carries it would.
        if rb is None or self._rebalance_final(rb):
            self._previous_superseded_by(epoch, e.id)
            rb = s.rebalances[epoch] = Rebalance(
                epoch=epoch,
                reason=reason,
                trigger_member_id=e.member_id if reason is not None else None,
                trigger_connector=e.connector if reason is not None else None,
                bump_event_id=e.id,
                bumped_at_ms=e.at_ms,
                live_members=s.live_count,
                group_type=CLASSIC,
            )
        return rb

    def _classic_started(self, e: Event) -> None:
        """A rebalance started at generation g: the row of g + 1 (a later start before the join
        completes folds into it: the first one's reason and time stand)."""
        self._classic_open(e, _generation(e) + 1, e.reason)

    def _classic_completed(self, e: Event) -> None:
        """The join phase of a generation completed: its leader, protocol and the members that
        must sync (a completion with no start, e.g. after a takeover, opens the row itself,
        without a reason)."""
        rb = self._classic_open(e, _generation(e), None)
        if rb.group_type != CLASSIC or rb.install is not None or self._rebalance_final(rb):
            return
        rb.install = {
            "install_event_id": e.id,
            "installed_at_ms": e.at_ms,
            "assignor_member_id": e.leader,
            "moves": [],
            "scheduled_rebalance_delay_ms": None,
            "removed": [],
        }
        rb.leader_id = e.leader
        rb.protocol = e.protocol
        rb.withheld = sorted(set(e.withheld))
        rb.waiting_members = set(e.members)
        rb.members_to_converge = len(rb.waiting_members)

    def _classic_refused(self, e: Event) -> None:
        """The leader's assignments for the generation were refused: nobody will sync to it."""
        rb = self.s.rebalances.get(_generation(e))
        if rb is None or rb.group_type != CLASSIC or rb.install is None:
            return
        if rb.refused_reason is None and not self._rebalance_final(rb):
            rb.refused_reason = e.reason or ""
            rb.waiting_members = set()

    def _classic_delivered(self, e: Event, prior: dict[str, str | None]) -> None:
        """A SyncGroup answer of generation `member_epoch`: what it added moved from the
        resource's last owner (or was newly assigned), in that generation's row; and the member
        has synced to that generation and every earlier one it was waited for in."""
        member_id = e.member_id
        if member_id is None or e.member_epoch is None:
            return
        s = self.s
        rb = s.rebalances.get(e.member_epoch)
        if (
            rb is not None
            and rb.group_type == CLASSIC
            and rb.install is not None
            and rb.refused_reason is None
            and not self._rebalance_final(rb)
        ):
            moves = rb.install["moves"]
            for r in dict.fromkeys(e.added):
                source = prior.get(r)
                move = {"resource": r, "from": source, "to": member_id}
                if source != member_id and move not in moves:
                    moves.append(move)
            moves.sort(key=_move_order)
        for epoch, other in s.rebalances.items():
            if (
                other.group_type == CLASSIC
                and epoch <= e.member_epoch
                and member_id in other.waiting_members
            ):
                other.waiting_members.discard(member_id)
                other.last_done_ms = _max(other.last_done_ms, e.at_ms)

    def _rebalance_row(self, rb: Rebalance) -> dict[str, Any]:
        install = rb.install or {}
        moves = install.get("moves") or []
        removed = set(install.get("removed") or [])
        moved = sorted(
            m["resource"] for m in moves if m["from"] is not None and m["to"] is not None
        )
        newly = sorted(m["resource"] for m in moves if m["from"] is None)
        left = sorted(
            m["resource"] for m in moves if m["to"] is None and m["resource"] not in removed
        )
        stats = self.s.lost_stats.get(rb.epoch)
        installed = rb.install is not None
        classic = rb.group_type == CLASSIC
        refused = rb.refused_reason is not None
        converged = installed and not rb.waiting_members and not refused
        if classic:
            no_members = converged and rb.members_to_converge == 0
        else:
            no_members = not installed and rb.live_members == 0
        converged_at: int | None = None
        if classic and no_members:
            converged_at = install["installed_at_ms"]
        elif converged:
            converged_at = _max(rb.last_done_ms, install["installed_at_ms"])
        elif no_members:
            converged_at = rb.bumped_at_ms
        if refused:
            status = "refused"
        elif classic and no_members:
            status = "no_members"
        elif converged:
            status = "converged"
        elif no_members:
            status = "no_members"
        elif installed:
            status = "in_progress"
        elif rb.next_bump_event_id is not None:
            status = "superseded"
        else:
            status = "awaiting_join" if classic else "awaiting_target"
        return {
            "group_id": self.s.group_id,
            "group_epoch": rb.epoch,
            "group_type": rb.group_type,
            "reason": rb.reason,
            "trigger_member_id": rb.trigger_member_id,
            "trigger_connector": rb.trigger_connector,
            "bump_event_id": rb.bump_event_id,
            "bumped_at_ms": rb.bumped_at_ms,
            "install_event_id": install.get("install_event_id"),
            "installed_at_ms": install.get("installed_at_ms"),
            "assignor_member_id": install.get("assignor_member_id"),
            "leader_id": rb.leader_id,
            "protocol": rb.protocol,
            "withheld": sorted(rb.withheld),
            "refused_reason": rb.refused_reason,
            "scheduled_rebalance_delay_ms": install.get("scheduled_rebalance_delay_ms") or 0,
            "moves": moves if installed else None,
            "moved": moved,
            "newly_assigned": newly,
            "left_unassigned": left,
            "removed": sorted(removed),
            "revoked": sorted(rb.revoked),
            "moved_count": len(moved),
            "newly_assigned_count": len(newly),
            "revoked_count": len(rb.revoked),
            "members_to_converge": rb.members_to_converge if installed else 0,
            "converged_at_ms": converged_at,
            "duration_ms": None if converged_at is None else converged_at - rb.bumped_at_ms,
            "status": status,
            "lost_resources": stats.count if stats else 0,
            "max_lost_wait_ms": stats.max_waited_ms if stats else None,
            "lost_still_waiting": stats.waiting if stats else 0,
            "open": not self._rebalance_final(rb),
        }

    def _rebalance_final(self, rb: Rebalance) -> bool:
        stats = self.s.lost_stats.get(rb.epoch)
        return (
            rb.next_bump_event_id is not None
            and not rb.waiting_members
            and (stats is None or stats.waiting == 0)
        )

    # -- the run's end ------------------------------------------------------------------------

    def finish(self) -> tuple[Outputs, GroupState]:
        """This run's rows (created or changed, and everything still open) and the state to
        carry; the fold must not be used afterwards."""
        s, out = self.s, self.out
        for r, owners in sorted(s.runs.items()):
            for member_id, start in sorted(owners.items()):
                out.ownership.append(self._interval_row(r, member_id, start, None))
        for o in s.overlaps:
            out.violations.append(self._overlap_row(o, None))
        for r, gap in sorted(s.gaps.items()):
            charged = self._charged(r, gap, self.as_of_ms)
            if charged > self.grace_ms:
                out.violations.append(self._unassigned_row(r, gap, charged, None))
        for lost in s.lost_open:
            out.lost_resources.append(self._lost_row(lost, None, None, None))
        for epoch in sorted(s.rebalances):
            out.rebalances.append(self._rebalance_row(s.rebalances[epoch]))
        for connector in sorted(self._touched_connectors):
            c = s.connectors[connector]
            out.connector_moves.append(
                {
                    "group_id": s.group_id,
                    "connector": connector,
                    "tasks_run": len(c.tasks_run),
                    "task_moves": c.task_moves,
                    "tasks_moved": len(c.tasks_moved),
                    "connector_moves": c.connector_moves,
                    "target_task_moves": c.target_task_moves,
                    "open": False,  # the latest row per connector is current: not re-sent
                }
            )
        for member_id, m in sorted(s.members.items()):
            if not m.listed and m.last_row is not None:
                row_id, at_ms, epoch, event_type = m.last_row
                out.removed_members.append(
                    {
                        "group_id": s.group_id,
                        "member_id": member_id,
                        "id": row_id,
                        "at_ms": at_ms,
                        "group_epoch": epoch,
                        "event_type": event_type,
                    }
                )
        # What can no longer change leaves the state.
        final = [epoch for epoch, rb in s.rebalances.items() if self._rebalance_final(rb)]
        for epoch in final:
            del s.rebalances[epoch]
        bumped = max(s.rebalances, default=None)
        s.lost_stats = {
            epoch: stats
            for epoch, stats in s.lost_stats.items()
            if stats.waiting > 0 or epoch in s.rebalances or bumped is None or epoch > bumped
        }
        self._prune_windows()
        return out, s


class OutOfOrder(RuntimeError):
    """An event older than what the group's state already holds: the state cannot take it."""

    def __init__(self, group_id: str, event_id: int, last_event_id: int) -> None:
        super().__init__(
            f"group {group_id!r}: event {event_id} is not after the carried state's last "
            f"event {last_event_id}"
        )
        self.group_id = group_id


def _max(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _generation(e: Event) -> int:
    """A classic event's generation: its payload's, else the group epoch it was written at
    (the same number: a classic group's generation is its group epoch)."""
    return e.generation if e.generation is not None else e.group_epoch


def _move_order(move: dict[str, Any]) -> tuple[Any, ...]:
    """A classic row's moves in Spark's `sort_array` order of (resource, from, to): nulls
    first."""
    return (
        move["resource"],
        move["from"] is not None,
        move["from"] or "",
        move["to"] is not None,
        move["to"] or "",
    )


def fold_group(
    state: GroupState, events: Iterable[Event], *, as_of_ms: int, grace_ms: int
) -> tuple[Outputs, GroupState]:
    """Fold `events` (any order: sorted here by id) into `state`; this run's rows and the
    state to carry."""
    fold = GroupFold(state, as_of_ms=as_of_ms, grace_ms=grace_ms)
    for e in sorted(events, key=lambda x: x.id):
        fold.apply(e)
    return fold.finish()
