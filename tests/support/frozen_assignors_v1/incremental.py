"""The IncrementalCooperative assignor: KIP-415's deferred resolution of imbalance (DESIGN 3.8).

Sticky and balanced: each member keeps its previous target share (or, if it has none, what it
owns), resources deleted from the catalogue disappear, and only what balance requires moves:
every member ends with the floor or the ceiling of the connectors and, separately, of the tasks.
New resources are placed at once. Resources lost with a departed member are held back (left
unassigned, with a scheduled rebalance) for up to `scheduled.rebalance.max.delay.ms`, so that a
worker that returns (same member id, or same instance id) gets exactly its own work back; a new
worker ends the delay, and once it has passed the lost resources are spread over the workers
present. Everything remembered between rounds is in the `assignor_state` blob (`state.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from connect_protocol.resources import EMPTY, ResourceSet
from worker_agent.assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)

from .balance import balance
from .state import AssignorState, HeldShare, decode_state, encode_state

__all__ = ["DEFAULT_MAX_DELAY_MS", "IncrementalCooperativeAssignor"]

#: `scheduled.rebalance.max.delay.ms` when the group configurations do not say (KIP-415).
DEFAULT_MAX_DELAY_MS = 300_000


class IncrementalCooperativeAssignor(ConnectAssignor):
    """`incremental_cooperative`, versions 1 (`compatible`) to 2 (`sessioned`).

    Both versions compute the same targets; `maximum_version=1` is what a `compatible` agent
    advertises (DESIGN 3.15).
    """

    name = "incremental_cooperative"
    minimum_version = 1

    def __init__(self, maximum_version: int = 2) -> None:
        if not 1 <= maximum_version <= 2:
            raise ValueError(
                f"incremental_cooperative speaks versions 1 to 2; maximum_version "
                f"{maximum_version} is outside that range."
            )
        self.maximum_version = maximum_version

    def assign(self, group: GroupView) -> AssignmentResult:
        if not group.members:
            return AssignmentResult(members={}, assignor_state=group.assignor_state)
        members = {m.member_id: m for m in group.members}
        catalogue = group.all_resources()
        now = group.coordinator_time_ms
        max_delay = max(0, group.config_int(SCHEDULED_REBALANCE_MAX_DELAY_MS, DEFAULT_MAX_DELAY_MS))
        previous = decode_state(group.assignor_state)

        shares = _sticky_start(group, members, catalogue)
        free = catalogue - _union(shares.values())
        earlier = _still_held(previous.held, free)
        lost = _lost(group, members, previous, free - _union(s.resources for s in earlier))
        returning = _give_back(earlier + lost, members, shares)
        earlier = tuple(s for s in earlier if s.member_id not in returning.held_for)
        lost = tuple(s for s in lost if s.member_id not in returning.held_for)

        newcomer = any(m not in group.target and m not in returning.members for m in members)
        held: tuple[HeldShare, ...] = ()
        deadline: int | None = None
        if not newcomer and max_delay > 0:  # else a new worker ends it and fills first (3.8)
            held, deadline = _delay(earlier, lost, previous.deadline_ms, now, max_delay)

        targets = _balanced(shares, catalogue - _union(shares.values()), held, members)
        state = AssignorState(
            deadline_ms=deadline,
            held=held,
            instances={m.member_id: m.instance_id for m in members.values() if m.instance_id},
        )
        return AssignmentResult(
            members=targets,
            assignor_state=encode_state(state),
            scheduled_rebalance_delay_ms=0 if deadline is None else deadline - now,
        )


@dataclass
class _Returning:
    """Who got held-back work back this round: the receiving members and the departed ids."""

    members: set[str] = field(default_factory=set)
    held_for: set[str] = field(default_factory=set)


def _union(sets: Iterable[ResourceSet]) -> ResourceSet:
    out = EMPTY
    for s in sets:
        out = out | s
    return out


def _sticky_start(
    group: GroupView, members: Mapping[str, MemberView], catalogue: ResourceSet
) -> dict[str, ResourceSet]:
    """Each present member's previous target share, or what it owns if it has none; within the
    catalogue, each resource once (target shares first, then by member id)."""
    shares: dict[str, ResourceSet] = {}
    taken = EMPTY
    in_target = sorted(m for m in members if m in group.target)
    others = sorted(m for m in members if m not in group.target)
    for member_id in in_target + others:
        start = group.target[member_id] if member_id in group.target else members[member_id].owned
        shares[member_id] = (start & catalogue) - taken
        taken = taken | shares[member_id]
    return shares


def _still_held(held: Iterable[HeldShare], free: ResourceSet) -> tuple[HeldShare, ...]:
    """The previous round's held shares, less what was deleted or has been placed since (and
    each resource once, should a blob hold it twice)."""
    out: list[HeldShare] = []
    for share in sorted(held, key=lambda s: s.member_id):
        resources = share.resources & free
        free = free - resources
        if resources:
            out.append(HeldShare(share.member_id, share.instance_id, resources))
    return tuple(out)


def _lost(
    group: GroupView, members: Mapping[str, MemberView], previous: AssignorState, free: ResourceSet
) -> tuple[HeldShare, ...]:
    """Shares of the previous target whose members have departed, as far as nobody has them."""
    out: list[HeldShare] = []
    for member_id in sorted(m for m in group.target if m not in members):
        resources = group.target[member_id] & free
        free = free - resources
        if resources:
            out.append(HeldShare(member_id, previous.instances.get(member_id), resources))
    return tuple(out)


def _give_back(
    held: Iterable[HeldShare], members: Mapping[str, MemberView], shares: dict[str, ResourceSet]
) -> _Returning:
    """A departed member that is back (same member id, or a member with its instance id) gets
    its held share back: added to `shares`."""
    by_instance = {m.instance_id: m.member_id for m in members.values() if m.instance_id}
    returning = _Returning()
    for share in held:
        receiver = share.member_id if share.member_id in members else None
        if receiver is None and share.instance_id is not None:
            receiver = by_instance.get(share.instance_id)
        if receiver is not None:
            shares[receiver] = shares[receiver] | share.resources
            returning.members.add(receiver)
            returning.held_for.add(share.member_id)
    return returning


def _delay(
    earlier: tuple[HeldShare, ...],
    lost: tuple[HeldShare, ...],
    deadline: int | None,
    now: int,
    max_delay: int,
) -> tuple[tuple[HeldShare, ...], int | None]:
    """What stays held, and until when. A running delay keeps its deadline (shares lost during
    it join it); once it has passed, what it held is released; a new loss starts a full delay.
    The deadline never lies further than `max_delay` ahead (the configuration may shrink)."""
    if deadline is None or now >= deadline:
        earlier = ()
    held = _merge(earlier + lost)
    if not held:
        return (), None
    if deadline is None or not earlier:
        return held, now + max_delay
    return held, min(deadline, now + max_delay)


def _merge(held: Iterable[HeldShare]) -> tuple[HeldShare, ...]:
    """One share per departed member, sorted by member id."""
    merged: dict[str, HeldShare] = {}
    for share in held:
        before = merged.get(share.member_id)
        if before is not None:
            share = HeldShare(
                share.member_id,
                before.instance_id or share.instance_id,
                before.resources | share.resources,
            )
        merged[share.member_id] = share
    return tuple(merged[m] for m in sorted(merged))


def _balanced(
    shares: Mapping[str, ResourceSet],
    unassigned: ResourceSet,
    held: Iterable[HeldShare],
    members: Mapping[str, MemberView],
) -> dict[str, ResourceSet]:
    """Balance connectors and, separately, tasks; held-back resources stay out."""
    to_place = unassigned - _union(s.resources for s in held)
    connectors = balance(
        {m: s.connectors for m, s in shares.items()},
        to_place.connectors,
        {m: v.owned.connectors for m, v in members.items()},
    )
    tasks = balance(
        {m: s.tasks for m, s in shares.items()},
        to_place.tasks,
        {m: v.owned.tasks for m, v in members.items()},
    )
    return {m: ResourceSet(connectors[m], tasks[m]) for m in sorted(shares)}
