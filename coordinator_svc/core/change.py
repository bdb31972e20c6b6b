"""GroupChange: a handler's working copy of a group.

Handlers read through it (seeing their own earlier changes) and write to it; it never mutates the
`GroupState` underneath. `records()` turns the changes into one record per changed entity, in an
order replay accepts, plus the events.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import replace
from typing import Any, TypeVar

from connect_protocol.configs import Readable
from connect_protocol.resources import (
    EMPTY,
    ResourceSet,
    TaskId,
    catalogue_resources,
    catalogue_with,
)

from .classic_model import PendingId, RoundChange
from .model import (
    Connector,
    GroupConfigDefaults,
    GroupMeta,
    GroupState,
    Hold,
    Member,
    MemberState,
    ResourceStatus,
    TargetAssignment,
    Tombstone,
    assignor_principals,
    fencing_session_ms,
)
from .records import (
    ClassicRoundRecord,
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventRecord,
    EventType,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    MembersMovedRecord,
    Record,
    StatusRecord,
    TargetRecord,
)
from .results import (
    SCHEDULED_REBALANCE,
    CancelTimer,
    Result,
    ScheduleTimer,
    TimerKey,
    TimerOp,
    Wakeup,
)
from .selection import GroupProfiles, NoSelection, select_with
from .selection_index import Profile, SelectionIndex, profile_of

T = TypeVar("T")
R = TypeVar("R")
K = TypeVar("K")


#: The tombstone of the group a handler runs on when that group does not exist (DESIGN 3.20): a
#: group created by the handler continues its counters. Set by the runtime around the handlers
#: it runs on an absent group (`continuing`); a context variable rather than a parameter of every
#: handler, since only GroupChange's creation of a group reads it. Pure: the core never sets it.
_TOMBSTONE: ContextVar[Tombstone | None] = ContextVar("tombstone", default=None)


@contextmanager
def continuing(tombstone: Tombstone | None) -> Iterator[None]:
    """Within this block, a group created under `tombstone.group_id` continues its epoch and
    fencing-token counters (None: a group starts afresh)."""
    reset = _TOMBSTONE.set(tombstone)
    try:
        yield
    finally:
        _TOMBSTONE.reset(reset)


def _first_counters(group_id: str) -> tuple[int, int]:
    """A new group's first epoch and its last fencing token: (1, 0), or above its tombstone's."""
    tombstone = _TOMBSTONE.get()
    if tombstone is None or tombstone.group_id != group_id:
        return 1, 0
    return tombstone.group_epoch + 1, tombstone.last_fencing_token


class GroupChange:
    def __init__(
        self,
        state: GroupState | None,
        group_id: str,
        now_ms: int,
        defaults: GroupConfigDefaults,
        creator: str | None = None,
    ) -> None:
        """`creator`: the caller's principal, recorded as the group's creator if this change
        creates it."""
        self.state = state
        self.group_id = group_id
        self.now_ms = now_ms
        self.defaults = defaults
        self.created = state is None
        self._meta: GroupMeta | None = None
        self._target: TargetAssignment | None = None
        self._target_changed: frozenset[str] | None = None
        self._members: dict[str, Member] = {}
        self._removed: set[str] = set()
        # Committed members moved to `_moved_epoch` with nothing else changed (DESIGN 3.21).
        self._moved: set[str] = set()
        self._moved_epoch = 0
        self._connectors: dict[str, Connector | None] = {}
        self._configs: dict[str, str] | None = None
        self._statuses: dict[tuple[str, int], ResourceStatus | None] = {}
        self._events: list[EventRecord] = []
        self.timers: list[TimerOp] = []
        # Classic groups (DESIGN 3.19): the round as this change leaves it (made on first use),
        # and the answers to parked calls, delivered after the commit.
        self._round: RoundChange | None = None
        self.wakeups: list[Wakeup] = []
        if state is None:
            epoch, last_token = _first_counters(group_id)
            self._meta = GroupMeta(
                group_id=group_id,
                group_epoch=epoch,
                created_at_ms=now_ms,
                created_by=creator,
                last_fencing_token=last_token,
            )
            self._target = TargetAssignment(assignment_epoch=epoch)
            created: dict[str, Any] = {} if creator is None else {"principal": creator}
            if epoch > 1:  # re-created after a deletion: says where it continues from
                created["continues_from_epoch"] = epoch - 1
            self.event(EventType.GROUP_CREATED, **created)

    # --- reads ---

    @property
    def meta(self) -> GroupMeta:
        if self._meta is not None:
            return self._meta
        assert self.state is not None
        return self.state.meta

    @property
    def target(self) -> TargetAssignment:
        if self._target is not None:
            return self._target
        assert self.state is not None
        return self.state.target

    @property
    def group_epoch(self) -> int:
        return self.meta.group_epoch

    def member(self, member_id: str) -> Member | None:
        if member_id in self._members:
            return self._members[member_id]
        if member_id in self._removed or self.state is None:
            return None
        member = self.state.members.get(member_id)
        if member is not None and member_id in self._moved:
            return replace(member, member_epoch=self._moved_epoch)
        return member

    def members(self) -> dict[str, Member]:
        result = {} if self.state is None else dict(self.state.members)
        for member_id in self._moved:
            result[member_id] = replace(result[member_id], member_epoch=self._moved_epoch)
        for member_id in self._removed:
            result.pop(member_id, None)
        result.update(self._members)
        return result

    def has_members(self) -> bool:
        return self.member_count() > 0

    def member_count(self) -> int:
        """How many members the group has with this change applied: O(members changed)."""
        if self.state is None:
            return len(self._members)
        committed = self.state.members
        gone = sum(1 for m in self._removed if m in committed)
        new = sum(1 for m in self._members if m not in committed)
        return len(committed) - gone + new

    def classic_member_count(self) -> int:
        """How many members of the classic protocol the group has with this change applied:
        O(members changed)."""
        count = 0 if self.state is None else self.state.classic_members
        committed = {} if self.state is None else self.state.members
        for member_id in self._removed | self._members.keys():
            old = committed.get(member_id)
            if old is not None and old.classic is not None:
                count -= 1
        for member in self._members.values():
            if member.classic is not None:
                count += 1
        return count

    def profiles(self, extra: Member | None = None) -> GroupProfiles:
        """The members as assignor selection sees them, with this change (and `extra`, a member
        not yet put) applied: the committed index plus the few members changed here."""
        touched = {**self._members, **({} if extra is None else {extra.member_id: extra})}
        index = SelectionIndex() if self.state is None else self.state.selection_index
        lookup: Callable[[str], Profile | None] = (
            _no_profile if self.state is None else self.state.profile
        )
        principal_lookup: Callable[[str], str | None] = (
            _no_principal if self.state is None else self.state.principal_of
        )
        return GroupProfiles(
            index,
            frozenset(self._removed | touched.keys()),
            {m: profile_of(member) for m, member in touched.items()},
            lookup,
            {m: member.principal for m, member in touched.items()},
            principal_lookup,
        )

    def assignor_principals(self) -> frozenset[str] | None:
        """Who may compute (`assignor.principals`, DESIGN 3.4); None: any principal."""
        if self._configs is None and self.state is not None:
            return self.state.assignor_principals(self.defaults)
        return assignor_principals(self.configs(), self.defaults)

    def left_members(self) -> frozenset[str]:
        """Static members that left (epoch -2) and are held until their session expires."""
        left = set() if self.state is None else set(self.state.left_members)
        left -= self._removed
        for member_id, member in self._members.items():
            if member.state is MemberState.LEFT:
                left.add(member_id)
            else:
                left.discard(member_id)
        return frozenset(left)

    def catalogue_resources(self) -> ResourceSet:
        """Every resource of the catalogue with this change applied (cached by the state)."""
        if self.state is None:
            return catalogue_resources(self.catalogue().values())
        base = self.state.catalogue_resources()
        if not self._connectors:
            return base
        committed = self.state.catalogue
        changes = [
            (
                name,
                None if name not in committed else committed[name].effective_task_count,
                None if connector is None else connector.effective_task_count,
            )
            for name, connector in self._connectors.items()
        ]
        return catalogue_with(base, changes)

    def member_by_instance(self, instance_id: str) -> Member | None:
        for m in self._members.values():
            if m.instance_id == instance_id:
                return m
        if self.state is None:
            return None
        member_id = self.state.instance_owner.get(instance_id)
        if member_id is None or member_id in self._removed or member_id in self._members:
            return None
        return self.state.members.get(member_id)

    def catalogue(self) -> dict[str, Connector]:
        result = {} if self.state is None else dict(self.state.catalogue)
        for name, connector in self._connectors.items():
            if connector is None:
                result.pop(name, None)
            else:
                result[name] = connector
        return result

    def connector(self, name: str) -> Connector | None:
        if name in self._connectors:
            return self._connectors[name]
        return None if self.state is None else self.state.catalogue.get(name)

    def configs(self) -> dict[str, str]:
        if self._configs is not None:
            return dict(self._configs)
        return {} if self.state is None else dict(self.state.configs)

    def config(self, row: Readable[T]) -> T:
        """The typed value of a group configuration as this change leaves it: the group's,
        else the server's default (no copy of the group's configurations)."""
        configs: Mapping[str, str] = self._configs if self._configs is not None else {}
        if self._configs is None and self.state is not None:
            configs = self.state.configs
        return self.defaults.read(row, configs)

    def fencing_session_ms(self) -> int:
        """See `GroupState.fencing_session_ms`: what session expiry and holds must wait for."""
        return fencing_session_ms(self.configs(), self.meta, self.now_ms, self.defaults)

    def effective_configs(self) -> dict[str, str]:
        return {**self.defaults.as_map(), **self.configs()}

    def connector_owner(self, connector: str) -> str | None:
        for m in self._members.values():
            if connector in m.assigned.connectors or connector in m.pending_revocation.connectors:
                return m.member_id
        owner = None if self.state is None else self.state.connector_owner.get(connector)
        if owner is not None and (owner in self._removed or owner in self._members):
            owner = None
        if owner is None:
            for hold in self.meta.holds:
                if connector in hold.resources.connectors:
                    return f"hold:{hold.member_id}"
        return owner

    def task_owner(self, task: TaskId) -> str | None:
        for m in self._members.values():
            if task in m.assigned.tasks or task in m.pending_revocation.tasks:
                return m.member_id
        owner = None if self.state is None else self.state.task_owner.get(task)
        if owner is not None and (owner in self._removed or owner in self._members):
            owner = None
        if owner is None:
            for hold in self.meta.holds:
                if task in hold.resources.tasks:
                    return f"hold:{hold.member_id}"
        return owner

    def holders_of(self, connector: str, task_count: int) -> set[str]:
        """The members holding (assigned or pending) connector `connector` or any of its tasks
        0 .. task_count - 1, as `connector_owner` / `task_owner` would name them, holds left
        out. The committed owner index is read once per resource and the members this change
        touched are looked at once each: O(task_count + touched members)."""
        tasks = [TaskId(connector, t) for t in range(task_count)]
        holders: set[str] = set()
        state = self.state
        if state is not None:
            owner = state.connector_owner.get(connector)
            if owner is not None:
                holders.add(owner)
            task_owner = state.task_owner
            holders.update(o for t in tasks if (o := task_owner.get(t)) is not None)
        holders -= self._removed
        holders -= self._members.keys()  # decided by their state in this change, below
        wanted = set(tasks)
        for m in self._members.values():
            owned = m.owned
            if connector in owned.connectors or not wanted.isdisjoint(owned.tasks):
                holders.add(m.member_id)
        return holders

    def free_for(self, member_id: str, resources: ResourceSet) -> ResourceSet:
        """`resources` less those `connector_owner` / `task_owner` give to another member or a
        hold: what `member_id` may be given now. The same answer as asking per resource, in
        that order (a member of this change first, the first that has it; then the index,
        unless its owner is removed or changed here; then a hold), found by set operations:
        with the members of this change on whole sets (by connector for large ones, so a
        reconciling member's 10,000-task share is not flattened on each heartbeat), and a
        Python step per resource only for those the index gives to another member (a
        100,000-task connector put into a group is 100,000 lookups no more; issue 24)."""
        taken = decided = EMPTY
        for m in self._members.values():
            has = ((resources & m.assigned) | (resources & m.pending_revocation)) - decided
            if not has:
                continue
            if m.member_id != member_id:
                taken = taken | has
            decided = decided | has
        undecided = resources - decided
        state = self.state
        if state is not None and undecided:
            committed = state.members.get(member_id)
            if (
                committed is not None
                and member_id not in self._members
                and member_id not in self._removed
            ):  # indexed to member_id: free, and decided
                undecided = undecided - committed.assigned - committed.pending_revocation
        if undecided:
            by_index = ResourceSet(
                frozenset(
                    self._taken(
                        member_id,
                        set(undecided.connectors),
                        None if state is None else state.connector_owner,
                        lambda hold: hold.resources.connectors,
                    )
                ),
                frozenset(
                    self._taken(
                        member_id,
                        set(undecided.tasks),
                        None if state is None else state.task_owner,
                        lambda hold: hold.resources.tasks,
                    )
                ),
            )
            if by_index:
                taken = taken | by_index
        if not taken:
            return resources
        return resources - taken

    def _taken(
        self,
        member_id: str,
        undecided: set[K],
        index: Mapping[K, str] | None,
        held_in: Callable[[Hold], frozenset[K]],
    ) -> set[K]:
        """Which of `undecided` (none of them had by a member of this change) the index gives
        to someone other than `member_id` (unless its owner is removed or changed here), then
        a hold. Consumes `undecided`."""
        taken: set[K] = set()
        if index is not None and undecided:
            for resource in index.keys() & undecided:
                owner = index[resource]
                if owner in self._removed or owner in self._members:
                    continue  # as if unowned: a hold may still have it
                if owner != member_id:
                    taken.add(resource)
                undecided.discard(resource)
        for hold in self.meta.holds:
            if undecided:
                held = undecided & held_in(hold)
                taken |= held
                undecided -= held
        return taken

    # --- writes ---

    def set_meta(self, **changes: Any) -> None:
        self._meta = replace(self.meta, **changes)

    def set_target(
        self, target: TargetAssignment, changed_members: Iterable[str] | None = None
    ) -> None:
        """Replace the target. `changed_members`: the only members whose entry may differ from
        the previous target's (added, changed or gone), so that only their rows are written;
        None means any."""
        if changed_members is None or (self._target is not None and self._target_changed is None):
            self._target_changed = None
        else:
            self._target_changed = (self._target_changed or frozenset()) | frozenset(
                changed_members
            )
        self._target = target

    def put_member(self, member: Member) -> None:
        self._removed.discard(member.member_id)
        self._moved.discard(member.member_id)
        self._members[member.member_id] = member

    def move_members(self, member_ids: Iterable[str], epoch: int) -> None:
        """Move committed, unchanged members to `epoch` keeping everything else (DESIGN 3.21):
        recorded as one `MembersMovedRecord`, written with one statement. O(len(member_ids))."""
        ids = set(member_ids)
        assert self.state is not None and not (ids & self._members.keys()), "committed only"
        assert not self._moved or epoch == self._moved_epoch, "one move per change"
        self._moved |= ids
        self._moved_epoch = epoch

    def remove_member(self, member_id: str) -> None:
        self._members.pop(member_id, None)
        self._moved.discard(member_id)
        if self.state is not None and member_id in self.state.members:
            self._removed.add(member_id)

    def put_connector(self, connector: Connector) -> None:
        self._connectors[connector.name] = connector

    def remove_connector(self, name: str) -> None:
        self._connectors[name] = None

    def resource_status(self, connector: str, task: int) -> ResourceStatus | None:
        """A resource's status with this change applied. O(1)."""
        key = (connector, task)
        if key in self._statuses:
            return self._statuses[key]
        return None if self.state is None else self.state.resource_status(connector, task)

    def put_status(self, connector: str, task: int, status: ResourceStatus | None) -> None:
        """Store (None: forget) a resource's status (DESIGN 3.20)."""
        self._statuses[(connector, task)] = status

    def set_configs(self, configs: Mapping[str, str]) -> None:
        self._configs = dict(configs)

    def event(self, event_type: EventType, member_id: str | None = None, **payload: Any) -> None:
        self._events.append(
            EventRecord(
                self.group_id, self.group_epoch, event_type, self.now_ms, member_id, payload
            )
        )

    def schedule(self, key: TimerKey, deadline_ms: int, unless_armed: bool = False) -> None:
        """Arm `key` for `deadline_ms` (replacing its deadline; with `unless_armed`, only if it
        is not armed already)."""
        self.timers.append(ScheduleTimer(key, deadline_ms, unless_armed))

    def cancel(self, key: TimerKey) -> None:
        self.timers.append(CancelTimer(key))

    def add_hold(
        self,
        member_id: str,
        resources: ResourceSet,
        until_ms: int,
        principal: str = "",
        instance_id: str | None = None,
    ) -> None:
        """Hold `resources` of a removed member until `until_ms`; its member id and its
        instance id stay bound to `principal` while the hold lasts. A member removed again
        under the id of a hold that still lasts (it rejoined) adds to that hold, and its
        instance id binds until that hold ends, even when it held nothing new."""
        previous = next((h for h in self.meta.holds if h.member_id == member_id), None)
        if not resources and (previous is None or instance_id in (None, previous.instance_id)):
            return
        holds = [h for h in self.meta.holds if h.member_id != member_id]
        if previous is not None:
            # Nothing new to hold: the hold keeps its end.
            until_ms = max(until_ms, previous.until_ms) if resources else previous.until_ms
            resources = resources | previous.resources
            instance_id = instance_id or previous.instance_id
        holds.append(Hold(member_id, resources, until_ms, principal, instance_id))
        self.set_meta(holds=tuple(holds))

    def hold(self, member_id: str) -> Hold | None:
        return next((h for h in self.meta.holds if h.member_id == member_id), None)

    def holds_of_instance(self, instance_id: str) -> list[Hold]:
        """The holds that keep `instance_id` bound (O(holds): callers ask only when an
        instance id would change hands, never on a steady heartbeat)."""
        return [h for h in self.meta.holds if h.instance_id == instance_id]

    def release_hold(self, member_id: str) -> Hold | None:
        hold = next((h for h in self.meta.holds if h.member_id == member_id), None)
        if hold is not None:
            self.set_meta(holds=tuple(h for h in self.meta.holds if h.member_id != member_id))
        return hold

    # --- classic groups: the volatile round and parked calls (DESIGN 3.19) ---

    @property
    def round(self) -> RoundChange:
        """The group's join round with this change's edits on top (reads and writes O(1) per
        member); its net change becomes one `ClassicRoundRecord`."""
        if self._round is None:
            self._round = RoundChange(None if self.state is None else self.state.round)
        return self._round

    def join_round(self, member_id: str) -> int:
        """`member_id` has (re)joined this phase; returns its join order."""
        return self.round.join(member_id)

    def clear_round(self) -> None:
        """A new phase: nobody has joined, awaits sync or is parked (pending ids stay)."""
        self.round.clear()

    def put_pending_id(self, pending_id: str, pending: PendingId) -> None:
        self.round.put_pending(pending_id, pending)

    def drop_pending_id(self, pending_id: str) -> None:
        self.round.drop_pending(pending_id)

    def set_sync_sets(
        self,
        awaiting: Iterable[str] | None = None,
        synced: Iterable[str] = (),
        parked: Iterable[str] = (),
        unparked: Iterable[str] = (),
    ) -> None:
        """Replace who awaits sync (`awaiting`, when given), then mark `synced` members
        answered, `parked` members' SyncGroups parked and `unparked` ones no longer."""
        if awaiting is not None:
            self.round.set_awaiting_sync(awaiting)
        for member_id in synced:
            self.round.mark_synced(member_id)
        for member_id in unparked:
            self.round.unpark(member_id)
        for member_id in parked:
            self.round.park(member_id)

    def set_round(self, **scalars: Any) -> None:
        """Set scalar fields of the round (`ClassicRound`'s: initial, reason, ...)."""
        self.round.set(**scalars)

    def wake(self, kind: str, member_id: str, response: Any) -> None:
        """Answer `member_id`'s parked `kind` call with `response` once this change is
        committed."""
        self.wakeups.append(Wakeup(kind, member_id, response))

    def start_classic_rebalance(
        self, reason: str, member_id: str | None = None, **details: Any
    ) -> None:
        """Start a classic rebalance (a classic group's counterpart of `bump_epoch`: what a
        catalogue change, a hold's end or RemoveMember calls on a classic group). Implemented
        by `classic_rebalance.prepare_rebalance`."""
        from .classic_rebalance import prepare_rebalance  # late: it builds on this module

        prepare_rebalance(self, reason, member_id, **details)

    def result(self, response: R) -> Result[R]:
        """This change as a handler's result: its records, `response`, its timers and wakeups."""
        return Result(self.records(), response, list(self.timers), list(self.wakeups))

    # --- compound operations ---

    def bump_epoch(self, reason: str, **details: Any) -> None:
        """The assignor's input changed: bump the group epoch (DESIGN 3.3). With no members, the
        assignment epoch follows (nothing to compute) and any scheduled rebalance is moot."""
        self.set_meta(group_epoch=self.group_epoch + 1)
        self.event(
            EventType.GROUP_EPOCH_BUMPED, details.pop("member_id", None), reason=reason, **details
        )
        if not self.has_members():
            if self.target.scheduled_rebalance_at_ms is not None:
                self.cancel((SCHEDULED_REBALANCE, ""))
            self.set_target(
                replace(
                    self.target,
                    assignment_epoch=self.group_epoch,
                    members={},
                    scheduled_rebalance_at_ms=None,
                )
            )
            self.set_meta(
                compute_requested_epoch=None, prepared=None, excluded_assignors=frozenset()
            )

    def reselect_assignor(self) -> None:
        """Re-run assignor selection after membership changed; record when the choice changes."""
        selection = select_with(
            self.profiles(),
            self.meta.assignor_member_id,
            self.meta.excluded_assignors | self.left_members(),
            self.assignor_principals(),
        )
        if isinstance(selection, NoSelection):
            if self.meta.assignor_member_id is not None:
                self.set_meta(assignor_member_id=None, compute_requested_epoch=None)
                if self.has_members():
                    self.event(EventType.ASSIGNOR_UNAVAILABLE, reason=selection.reason)
            return
        if selection.assignor_member_id != self.meta.assignor_member_id:
            self.set_meta(
                assignor_member_id=selection.assignor_member_id, compute_requested_epoch=None
            )
            self.event(
                EventType.ASSIGNOR_CHOSEN,
                selection.assignor_member_id,
                assignor=selection.assignor_name,
                version=selection.version,
            )

    def records(self) -> list[Record]:
        out: list[Record] = []
        if self._meta is not None and (self.state is None or self._meta != self.state.meta):
            prepared_changed = self.state is None or self._meta.prepared != self.state.meta.prepared
            out.append(GroupMetaRecord(self._meta, prepared_changed))
        if self._configs is not None:
            out.append(ConfigRecord(self.group_id, dict(self._configs)))
        for name, connector in self._connectors.items():
            if connector is None:
                out.append(ConnectorRemovedRecord(self.group_id, name))
            else:
                out.append(ConnectorRecord(self.group_id, connector))
        for member_id in sorted(self._removed):
            out.append(MemberRemovedRecord(self.group_id, member_id))
        if self._target is not None and (self.state is None or self._target != self.state.target):
            rows = None if self.state is None else self._target_changed
            out.append(TargetRecord(self.group_id, self._target, rows))
        if self._moved:
            out.append(
                MembersMovedRecord(self.group_id, tuple(sorted(self._moved)), self._moved_epoch)
            )
        # Members that give resources up are applied before members that take them.
        changed = [
            m
            for m in self._members.values()
            if self.state is None or self.state.members.get(m.member_id) != m
        ]

        def gives_up(m: Member) -> int:
            old = None if self.state is None else self.state.members.get(m.member_id)
            return 0 if old is not None and m.owned <= old.owned else 1

        def epoch_only(m: Member) -> bool:
            old = None if self.state is None else self.state.members.get(m.member_id)
            return old is not None and m == replace(
                old,
                member_epoch=m.member_epoch,
                previous_epoch=m.previous_epoch,
                state=m.state,
                stable_since_epoch=m.stable_since_epoch,
                lifecycle_revision=m.lifecycle_revision,
            )

        changed.sort(key=lambda m: (gives_up(m), m.member_id))
        out.extend(MemberRecord(self.group_id, m, epoch_only(m)) for m in changed)
        if self._statuses:
            out.append(StatusRecord(self.group_id, dict(self._statuses)))
        delta = None if self._round is None else self._round.delta()
        if delta is not None:
            out.append(ClassicRoundRecord(self.group_id, delta))
        out.extend(self._events)
        return out


def _no_profile(_member_id: str) -> Profile | None:
    return None


def _no_principal(_member_id: str) -> str | None:
    return None
