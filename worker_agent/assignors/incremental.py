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

Paced waves (seed 002 Design III, DESIGN 3.18), with `rebalance.wave.max.resources` = N > 0
(0, the default, changes nothing: every round is exactly as described above):

- Only balancing moves are paced: a resource taken from a member that runs it (it is in that
  member's `owned`) to improve balance. Lost, released and new resources are placed at once as
  above; resources a member holds in its target but does not run yet move freely.
- A round may start a wave only when no earlier wave is in motion and the pause after the last
  one has passed; it then moves at most N running resources (the most loaded members give
  first, and the budget is shared by connectors and tasks in proportion to what each kind still
  has to move). Otherwise it moves no running resource: new and lost work still goes to the
  least loaded members below their quota. The plan is made afresh every round from the current
  group (the state keeps only the pacing bookkeeping, never a stale list of moves), and its last
  wave leaves the floor/ceiling balance of the unpaced assignor.
- A resource is in motion from the round that moves it until it shows in its new owner's
  `owned` (the coordinator has sent it there). A wave's resources are pinned to their receivers
  while in motion (counted as running there, so never moved freely). An entry is dropped when
  its receiver departs (the resource is then lost work) or the resource is deleted.
- Delivery time: the latest `last_grant_at_ms` of the receivers seen holding wave resources
  (the round's own time when a coordinator reports no grant time). A resource that leaves the
  wave unseen (its receiver departed, or it was deleted) counts as delivered at the round that
  sees it go, which is no earlier than a delivery the round cannot see any more. The next wave
  is due `rebalance.wave.pause.ms` after the wave's last resource is delivered.
- Asking for the next wave: while the plan is unfinished (the round's result is outside the
  floor/ceiling balance) the state records `next_wave_ms`: the due time if the pause is running,
  or, while the wave is still in motion, `now + max(pause, heartbeat.interval.ms)` (a delivery
  seen later cannot make the next wave due sooner than a pause from now, and deliveries happen
  at heartbeats). The result's `next_wave_delay_ms` says it, `lost_work_delay_ms` says the
  lost-work delay, and `scheduled_rebalance_delay_ms` is the earlier of the two.
- During a lost-work delay (no newcomer) nothing that runs moves, as above, so the next wave
  is never asked before the delay's end (both are reported; the delay's own round goes on with
  the plan). A newcomer ends the delay only; the waves go on paced (it gets new and lost work
  at once, and balancing work wave by wave).
- Setting N to 0 drops the wave bookkeeping at the next round: everything moves at once.

Cost: linear in members plus resources. Each resource is claimed at most once, into mutable
per-kind sets (`_Claims`); a share that nothing changes is passed through as the very frozenset
of the previous target; the catalogue is never expanded, only the resources nobody holds are
built (in name order, so they need no sorting); the sorts left are those whose order shows in
the result (see `balance.py`). Pacing adds O(N log members) to choose a wave's moves, and the
wave's size to follow it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import TypeVar

from connect_protocol.configs import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_REBALANCE_WAVE_MAX_RESOURCES,
    DEFAULT_REBALANCE_WAVE_PAUSE_MS,
    DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
    HEARTBEAT_INTERVAL_MS,
    REBALANCE_WAVE_MAX_RESOURCES,
    REBALANCE_WAVE_PAUSE_MS,
)
from connect_protocol.resources import ResourceSet, TaskId

from ..assignor import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    AssignmentResult,
    ConnectAssignor,
    GroupView,
    MemberView,
)
from .balance import TASK_ORDER, balance_planned, place_sorted, plan_surplus
from .state import AssignorState, HeldShare, WaveShare, decode_state, encode_state

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
        revoke = deadline is None
        pace = group.config_int(REBALANCE_WAVE_MAX_RESOURCES, DEFAULT_REBALANCE_WAVE_MAX_RESOURCES)
        wave = _Wave()
        if pace <= 0:  # no pacing: everything balance needs moves in this target
            targets, _ = _balanced(shares, claims, released, members, revoke=revoke)
        else:
            wave = _paced(group, previous, members, shares)
            budget = pace if wave.may_start(now) else 0
            targets, moved = _balanced(
                shares, claims, released, members, revoke=revoke, budget=budget, pinned=wave.motion
            )
            wave.after(targets, moved, lost_work_deadline=deadline, now=now)
        state = AssignorState(
            deadline_ms=deadline,
            held=held,
            instances={m.member_id: m.instance_id for m in members.values() if m.instance_id},
            wave=tuple(WaveShare(m, r) for m, r in sorted(wave.motion.items())),
            wave_delivered_ms=wave.delivered_ms,
            next_wave_ms=wave.next_ms,
        )
        lost_work_ms = 0 if deadline is None else deadline - now
        next_wave_ms = 0 if wave.next_ms is None else wave.next_ms - now
        return AssignmentResult(
            members=targets,
            assignor_state=encode_state(state),
            scheduled_rebalance_delay_ms=min(
                (d for d in (lost_work_ms, next_wave_ms) if d > 0), default=0
            ),
            lost_work_delay_ms=lost_work_ms,
            next_wave_delay_ms=next_wave_ms,
        )


@dataclass
class _Wave:
    """A paced plan's bookkeeping for one round (DESIGN 3.18), from the previous state and the
    members' owned lists; see the module docstring.

    Attributes:
        motion: per receiver, the wave resources not yet delivered to it.
        delivered_ms: the latest grant time seen of the receivers of the current or last wave.
        pause_ms: `rebalance.wave.pause.ms`.
        poll_ms: how long to wait before looking again at a wave in motion.
        next_ms: the next wave's deadline this round asks for (set by `after`), or None.
    """

    motion: dict[str, ResourceSet] = field(default_factory=dict)
    delivered_ms: int | None = None
    pause_ms: int = 0
    poll_ms: int = 0
    next_ms: int | None = None

    def seen(self, at_ms: int) -> None:
        """Some of the wave has arrived (at `at_ms`), or has left it unseen (seen gone at
        `at_ms`, which is no earlier than any delivery it may have had)."""
        self.delivered_ms = at_ms if self.delivered_ms is None else max(at_ms, self.delivered_ms)

    def due_ms(self) -> int | None:
        """When the next wave may start, once nothing is in motion (None: at once)."""
        return None if self.delivered_ms is None else self.delivered_ms + self.pause_ms

    def may_start(self, now: int) -> bool:
        due = self.due_ms()
        return not self.motion and (due is None or now >= due)

    def after(
        self,
        targets: Mapping[str, ResourceSet],
        moved: Mapping[str, ResourceSet],
        *,
        lost_work_deadline: int | None,
        now: int,
    ) -> None:
        """Record what this round moved (a new wave starts afresh) and whether, and when, to
        ask for the next wave: never before the end of a lost-work delay (its deadline,
        `lost_work_deadline`), during which nothing that runs moves."""
        if moved:
            self.motion, self.delivered_ms = dict(moved), None
        due = self.due_ms()
        if not self.motion and (due is None or due <= now):
            self.delivered_ms = None  # the pause is over: nothing left to remember
        if _is_balanced(targets.values()):
            return  # no plan left (a wave still in motion is followed when a round comes)
        if self.motion:  # look again: a delivery seen then is due a pause later at the soonest
            at = now + max(self.pause_ms, self.poll_ms, 1)
        elif due is not None and due > now:
            at = due
        elif lost_work_deadline is not None:  # free to move as soon as the delay ends
            at = lost_work_deadline
        else:  # not reached: a round free to move that leaves imbalance has started a wave
            at = now + max(self.poll_ms, 1)
        self.next_ms = at if lost_work_deadline is None else max(at, lost_work_deadline)


def _paced(
    group: GroupView,
    previous: AssignorState,
    members: Mapping[str, MemberView],
    shares: _Shares,
) -> _Wave:
    """The wave bookkeeping at the start of a paced round: the previous wave's resources that
    are still in motion (each still in its receiver's share and not in its owned list), and
    when the wave was last seen to arrive: the latest grant time of the receivers holding some
    of theirs (even if deleted since), or now for resources that left the wave unseen (their
    receiver departed, or they were deleted): a delivery this round cannot see may have come
    just before. Linear in the wave's size."""
    now = group.coordinator_time_ms
    wave = _Wave(
        delivered_ms=previous.wave_delivered_ms,
        pause_ms=max(0, group.config_int(REBALANCE_WAVE_PAUSE_MS, DEFAULT_REBALANCE_WAVE_PAUSE_MS)),
        poll_ms=max(0, group.config_int(HEARTBEAT_INTERVAL_MS, DEFAULT_HEARTBEAT_INTERVAL_MS)),
    )
    for entry in previous.wave:
        member, sent = members.get(entry.member_id), entry.resources
        if member is None:  # departed: what it was sent is lost work now; seen gone now
            wave.seen(now)
            continue
        receiver, owned = member.member_id, member.owned
        arrived = sent & owned
        if arrived:  # delivered (even if deleted since)
            wave.seen(member.last_grant_at_ms or now)
        waiting = ResourceSet(
            (sent.connectors & shares.connectors[receiver]) - owned.connectors,
            (sent.tasks & shares.tasks[receiver]) - owned.tasks,
        )
        if waiting:
            wave.motion[receiver] = waiting
        if len(arrived) + len(waiting) < len(sent):  # deleted unseen: seen gone now
            wave.seen(now)
    return wave


def _is_balanced(shares: Iterable[ResourceSet]) -> bool:
    """Every member holds the floor or the ceiling of the connectors and, separately, of the
    tasks (its counts are within one of every other member's)."""
    connectors, tasks = [], []
    for share in shares:
        connectors.append(len(share.connectors))
        tasks.append(len(share.tasks))
    return not connectors or (
        max(connectors) - min(connectors) <= 1 and max(tasks) - min(tasks) <= 1
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
    budget: int | None = None,
    pinned: Mapping[str, ResourceSet] | None = None,
) -> tuple[dict[str, ResourceSet], dict[str, ResourceSet]]:
    """Balance connectors and, separately, tasks, over what nobody claimed plus what was
    released; what stays held is out of it. Without `revoke` (a delay runs), only place those
    on the least loaded: every member keeps its whole share, however uneven.

    With a `budget` (a paced round), at most that many running resources are given up, both
    kinds together; `pinned` resources (a wave in motion) count as running where they go. Also
    returns, per receiver, the running resources it got (`{}` without a budget)."""
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
        return {m: ResourceSet(connectors[m], tasks[m]) for m in ids}, {}
    running = {m: v.owned for m, v in members.items()}
    for member_id, resources in (pinned or {}).items():
        running[member_id] = running[member_id] | resources
    connector_plan = plan_surplus(
        ids,
        shares.connectors,
        len(connectors_to_place),
        {m: r.connectors for m, r in running.items()},
    )
    task_plan = plan_surplus(
        ids, shares.tasks, len(tasks_to_place), {m: r.tasks for m, r in running.items()}
    )
    connector_limit = task_limit = None
    if budget is not None:
        connector_limit, task_limit = _split(
            budget, connector_plan.running_total, task_plan.running_total
        )
    connectors, moved_connectors = balance_planned(
        ids,
        shares.connectors,
        connectors_to_place,
        connector_plan,
        limit=connector_limit,
        presorted=presorted,
    )
    tasks, moved_tasks = balance_planned(
        ids,
        shares.tasks,
        tasks_to_place,
        task_plan,
        limit=task_limit,
        key=TASK_ORDER,
        presorted=presorted,
    )
    moved: dict[str, ResourceSet] = {}
    for member_id in sorted(moved_connectors.keys() | moved_tasks.keys()):
        moved[member_id] = ResourceSet(
            frozenset(moved_connectors.get(member_id, ())),
            frozenset(moved_tasks.get(member_id, ())),
        )
    return {m: ResourceSet(connectors[m], tasks[m]) for m in ids}, moved


def _split(budget: int, connectors: int, tasks: int) -> tuple[int, int]:
    """A wave's budget of running moves over the two kinds, in proportion to what each still
    has to move (connectors rounded down); whatever one kind cannot use goes to the other."""
    if connectors + tasks <= budget:
        return connectors, tasks
    for_connectors = budget * connectors // (connectors + tasks)
    for_tasks = min(tasks, budget - for_connectors)
    return min(connectors, budget - for_tasks), for_tasks
