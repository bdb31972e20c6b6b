"""The IncrementalCooperative assignor: KIP-415's deferred resolution of imbalance (DESIGN 3.8).

Sticky and balanced: each member keeps its previous target share (or, if it has none, what it
owns), resources deleted from the catalogue disappear, and only what balance requires moves:
every member ends with the floor or the ceiling of the connectors and, separately, of the tasks.
New resources are placed at once. Resources lost with a departed member are held back (left
unassigned, with a scheduled rebalance) for up to `scheduled.rebalance.max.delay.ms`, so that a
worker that returns (same member id, or same instance id) gets exactly its own work back; a new
worker ends the delay, and once it has passed the lost resources are spread over the workers
present. While a delay runs (this round leaves something held back, so no new worker came),
nothing that runs is moved (DESIGN 3.18; Kafka Connect makes no load-balancing revocations
then either): every member keeps its whole share, new resources go to the least loaded members,
deleted ones leave holes, and a returning worker gets all of its own back; balance is restored
when the delay ends or a newcomer ends it. Everything remembered between rounds is in the
`assignor_state` blob (`state.py`).

Cost: linear in members plus resources. Each resource is claimed at most once, into mutable
per-kind sets (`_Claims`); a share that nothing changes is passed through as the very frozenset
of the previous target; the catalogue is never expanded, only the resources nobody holds are
built (in name order, so they need no sorting); the sorts left are those whose order shows in
the result (see `balance.py`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import TypeVar

from connect_protocol.configs import DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS
from connect_protocol.resources import ResourceSet, TaskId

from ..assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)
from .balance import TASK_ORDER, balance_sorted, place_sorted
from .state import AssignorState, HeldShare, decode_state, encode_state

__all__ = ["DEFAULT_MAX_DELAY_MS", "IncrementalCooperativeAssignor"]

#: `scheduled.rebalance.max.delay.ms` when the group configurations do not say (KIP-415).
DEFAULT_MAX_DELAY_MS = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS


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
        claims = _Claims(group.catalogue)
        now = group.coordinator_time_ms
        max_delay = max(0, group.config_int(SCHEDULED_REBALANCE_MAX_DELAY_MS, DEFAULT_MAX_DELAY_MS))
        previous = decode_state(group.assignor_state)

        shares = _sticky_start(group, members, claims)
        earlier = _still_held(previous.held, claims)
        lost = _lost(group, members, previous, claims)
        returning = _give_back(earlier + lost, members, shares)
        earlier = tuple(s for s in earlier if s.member_id not in returning.held_for)
        lost = tuple(s for s in lost if s.member_id not in returning.held_for)

        newcomer = any(m not in group.target and m not in returning.members for m in members)
        held: tuple[HeldShare, ...] = ()
        held_from: tuple[HeldShare, ...] = ()
        deadline: int | None = None
        if not newcomer and max_delay > 0:  # else a new worker ends it and fills first (3.8)
            held, deadline, held_from = _delay(earlier, lost, previous.deadline_ms, now, max_delay)
        # Back to the pool: whatever was held or lost, neither given back nor held now.
        holding = {id(s) for s in held_from}
        released = [s for s in returning.not_given if id(s) not in holding]

        # While a delay runs (and so no newcomer came), nothing that runs is moved (3.18).
        targets = _balanced(shares, claims, released, members, revoke=deadline is None)
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
    """Who got held-back work back this round: the receiving members and the departed ids;
    and the held shares that nobody got back."""

    members: set[str] = field(default_factory=set)
    held_for: set[str] = field(default_factory=set)
    not_given: list[HeldShare] = field(default_factory=list)


@dataclass
class _Shares:
    """Each present member's share, per kind (frozensets: replaced, never mutated)."""

    connectors: dict[str, frozenset[str]] = field(default_factory=dict)
    tasks: dict[str, frozenset[TaskId]] = field(default_factory=dict)


R = TypeVar("R", str, TaskId)

_CONNECTOR_OF = attrgetter("connector")


class _Claims:
    """Every catalogue resource this round has placed so far (in a share, or held back), per
    kind, so that each resource goes to its first claimant only.

    The catalogue (connector -> task count) is never expanded into resources: a connector is in
    it if its name is a key, a task if its number is below its connector's count."""

    def __init__(self, catalogue: Mapping[str, int]) -> None:
        self.catalogue = dict(catalogue)
        self.connectors: set[str] = set()
        self.tasks: set[TaskId] = set()

    def claim(self, resources: ResourceSet) -> tuple[frozenset[str], frozenset[TaskId]]:
        """What of `resources` is in the catalogue and not yet claimed, now claimed."""
        catalogue = self.catalogue
        count = catalogue.get
        connectors, tasks = resources.connectors, resources.tasks
        return (
            _take(connectors, [c for c in connectors if c not in catalogue], self.connectors),
            _take(tasks, [t for t in tasks if not 0 <= t.task < count(t.connector, 0)], self.tasks),
        )

    def unclaimed(self) -> tuple[list[str], list[TaskId]]:
        """The catalogue resources nobody has claimed, each kind in name order."""
        names = sorted(self.catalogue)
        connectors = [c for c in names if c not in self.connectors]
        claimed = Counter(map(_CONNECTOR_OF, self.tasks))  # claimed tasks are distinct and valid
        tasks: list[TaskId] = []
        for name in names:
            count = self.catalogue[name]
            have = claimed.get(name, 0)
            if have >= count:  # every task of `name` is claimed (or it has none)
                continue
            every = map(TaskId, repeat(name, count), range(count))
            if have:
                tasks.extend(t for t in every if t not in self.tasks)
            else:
                tasks.extend(every)
        return connectors, tasks


def _take(start: frozenset[R], outside: list[R], taken: set[R]) -> frozenset[R]:
    """`start` less `outside` and less what is in `taken`; added to `taken`. `start` itself
    when nothing is left out (no copy)."""
    share = start
    if outside:
        share = share.difference(outside)
    if not taken.isdisjoint(share):
        share = share.difference(taken)
    taken.update(share)
    return share if type(share) is frozenset else frozenset(share)


def _sticky_start(group: GroupView, members: Mapping[str, MemberView], claims: _Claims) -> _Shares:
    """Each present member's previous target share, or what it owns if it has none; within the
    catalogue, each resource once (target shares first, then by member id)."""
    shares = _Shares()
    in_target = sorted(m for m in members if m in group.target)
    others = sorted(m for m in members if m not in group.target)
    for member_id in in_target + others:
        start = group.target[member_id] if member_id in group.target else members[member_id].owned
        shares.connectors[member_id], shares.tasks[member_id] = claims.claim(start)
    return shares


def _still_held(held: Iterable[HeldShare], claims: _Claims) -> tuple[HeldShare, ...]:
    """The previous round's held shares, less what was deleted or has been placed since (and
    each resource once, should a blob hold it twice)."""
    out: list[HeldShare] = []
    for share in sorted(held, key=lambda s: s.member_id):
        connectors, tasks = claims.claim(share.resources)
        if connectors or tasks:
            out.append(
                HeldShare(share.member_id, share.instance_id, ResourceSet(connectors, tasks))
            )
    return tuple(out)


def _lost(
    group: GroupView, members: Mapping[str, MemberView], previous: AssignorState, claims: _Claims
) -> tuple[HeldShare, ...]:
    """Shares of the previous target whose members have departed, as far as nobody has them."""
    out: list[HeldShare] = []
    for member_id in sorted(m for m in group.target if m not in members):
        connectors, tasks = claims.claim(group.target[member_id])
        if connectors or tasks:
            resources = ResourceSet(connectors, tasks)
            out.append(HeldShare(member_id, previous.instances.get(member_id), resources))
    return tuple(out)


def _give_back(
    held: Iterable[HeldShare], members: Mapping[str, MemberView], shares: _Shares
) -> _Returning:
    """A departed member that is back (same member id, or a member with its instance id) gets
    its held share back: added to `shares`."""
    by_instance = {m.instance_id: m.member_id for m in members.values() if m.instance_id}
    returning = _Returning()
    given: dict[str, list[ResourceSet]] = {}
    for share in held:
        receiver = share.member_id if share.member_id in members else None
        if receiver is None and share.instance_id is not None:
            receiver = by_instance.get(share.instance_id)
        if receiver is not None:
            given.setdefault(receiver, []).append(share.resources)
            returning.members.add(receiver)
            returning.held_for.add(share.member_id)
        else:
            returning.not_given.append(share)
    for receiver, parts in given.items():  # one copy per receiver, however many shares it gets
        connectors = shares.connectors[receiver].union(*(p.connectors for p in parts))
        shares.connectors[receiver] = connectors
        shares.tasks[receiver] = shares.tasks[receiver].union(*(p.tasks for p in parts))
    return returning


def _delay(
    earlier: tuple[HeldShare, ...],
    lost: tuple[HeldShare, ...],
    deadline: int | None,
    now: int,
    max_delay: int,
) -> tuple[tuple[HeldShare, ...], int | None, tuple[HeldShare, ...]]:
    """What stays held, until when, and the shares it is made of. A running delay keeps its
    deadline (shares lost during it join it); once it has passed, what it held is released; a
    new loss starts a full delay. The deadline never lies further than `max_delay` ahead (the
    configuration may shrink)."""
    if deadline is None or now >= deadline:
        earlier = ()
    held = _merge(earlier + lost)
    if not held:
        return (), None, ()
    if deadline is None or not earlier:
        return held, now + max_delay, earlier + lost
    return held, min(deadline, now + max_delay), earlier + lost


def _merge(held: Iterable[HeldShare]) -> tuple[HeldShare, ...]:
    """One share per departed member, sorted by member id."""
    grouped: dict[str, list[HeldShare]] = {}
    for share in held:
        grouped.setdefault(share.member_id, []).append(share)
    merged: list[HeldShare] = []
    for member_id in sorted(grouped):
        shares = grouped[member_id]
        if len(shares) == 1:
            merged.append(shares[0])
            continue
        instance_id = shares[0].instance_id
        for share in shares[1:]:
            instance_id = instance_id or share.instance_id
        resources = ResourceSet(
            frozenset().union(*(s.resources.connectors for s in shares)),
            frozenset().union(*(s.resources.tasks for s in shares)),
        )
        merged.append(HeldShare(member_id, instance_id, resources))
    return tuple(merged)


def _balanced(
    shares: _Shares,
    claims: _Claims,
    released: Iterable[HeldShare],
    members: Mapping[str, MemberView],
    *,
    revoke: bool,
) -> dict[str, ResourceSet]:
    """Balance connectors and, separately, tasks, over what nobody claimed plus what was
    released; what stays held is out of it. Without `revoke` (a delay runs), only place those
    on the least loaded: every member keeps its whole share, however uneven."""
    ids = sorted(members)
    connectors_to_place, tasks_to_place = claims.unclaimed()
    presorted = True
    for share in released:
        connectors_to_place.extend(share.resources.connectors)
        tasks_to_place.extend(share.resources.tasks)
        presorted = False
    if not revoke:
        connectors = place_sorted(ids, shares.connectors, connectors_to_place, presorted=presorted)
        tasks = place_sorted(ids, shares.tasks, tasks_to_place, key=TASK_ORDER, presorted=presorted)
        return {m: ResourceSet(connectors[m], tasks[m]) for m in ids}
    connectors = balance_sorted(
        ids,
        shares.connectors,
        connectors_to_place,
        {m: v.owned.connectors for m, v in members.items()},
        presorted=presorted,
    )
    tasks = balance_sorted(
        ids,
        shares.tasks,
        tasks_to_place,
        {m: v.owned.tasks for m, v in members.items()},
        key=TASK_ORDER,
        presorted=presorted,
    )
    return {m: ResourceSet(connectors[m], tasks[m]) for m in ids}
