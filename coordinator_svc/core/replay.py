"""Apply records to group state: the one path for live changes and for loading after takeover.

An `Undo` given to `apply` remembers what each record is about to change (the previous value of
each entity it touches), so that the records of a batch whose commit failed can be taken back
in memory at the cost of what they changed, never a copy of the group (DESIGN 3.21).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from .classic_model import ClassicRound
from .errors import IllegalStateError
from .model import (
    Connector,
    GroupMeta,
    GroupState,
    Member,
    MemberState,
    ResourceStatus,
    TargetAssignment,
)
from .records import (
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
    visit,
)


def new_state(records: Iterable[Record]) -> GroupState:
    """Build a group's state from records whose first state record is its GroupMetaRecord."""
    state: GroupState | None = None
    for record in records:
        if state is None:
            if isinstance(record, EventRecord):
                continue
            if not isinstance(record, GroupMetaRecord):
                raise IllegalStateError(f"a group must start with its metadata, got {record!r}")
            # A placeholder until the group's TargetRecord: at the lowest epoch a target can have
            # (epochs start at 1, DESIGN 3.2), so that the real one never looks like a step down
            # (a group created by a join has group epoch 2 and target epoch 1 in one batch).
            state = GroupState(record.meta, TargetAssignment(min(1, record.meta.group_epoch)))
            continue
        apply(state, record)
    if state is None:
        raise IllegalStateError("no group metadata record")
    return state


def apply(state: GroupState, record: Record, undo: Undo | None = None) -> None:
    """Apply one record. Raises IllegalStateError if it would break an invariant. With `undo`,
    what the record changes is remembered first (also when it raises: putting back a value
    it did not change is harmless)."""
    if undo is not None:
        visit(record, _Remember(state, undo))
    visit(record, _Apply(state))


Step = Callable[[GroupState], None]


class Undo:
    """The inverse of the records applied to one state, newest last: `rollback` puts each
    changed entity's previous value back, newest first, through the state's own mutators (so
    its indexes and running sums come back too). Costs O(what changed)."""

    __slots__ = ("_steps",)

    def __init__(self) -> None:
        self._steps: list[Step] = []

    def __len__(self) -> int:
        return len(self._steps)

    def push(self, step: Step) -> None:
        self._steps.append(step)

    def rollback(self, state: GroupState) -> None:
        """Undo every remembered change on `state` (the state they were applied to)."""
        steps, self._steps = self._steps, []
        for step in reversed(steps):
            step(state)


def _set_meta(meta: GroupMeta) -> Step:
    return lambda s: setattr(s, "meta", meta)


def _set_target(target: TargetAssignment) -> Step:
    return lambda s: setattr(s, "target", target)


def _set_configs(configs: dict[str, str]) -> Step:
    return lambda s: setattr(s, "configs", configs)


def _restore_member(member_id: str, old: Member | None) -> Step:
    if old is None:
        return lambda s: s.remove_member(member_id)
    return lambda s: s.put_member(old)


def _restore_moved(old: list[Member]) -> Step:
    def restore(s: GroupState) -> None:
        for member in old:  # only their epochs changed: the indexes never saw the move
            s.put_member_epoch(member)

    return restore


def _restore_round(old: ClassicRound | None, record: ClassicRoundRecord) -> Step:
    """The inverse of applying `record` to the round `old` (None: the group had none yet)."""
    if old is None:
        return lambda s: setattr(s, "round", None)
    restore = old.remember(record.delta)

    def step(s: GroupState) -> None:
        assert s.round is old, "a round is only ever changed in place"
        restore(old)

    return step


def _restore_connector(
    name: str, old: Connector | None, statuses: dict[int, ResourceStatus] | None = None
) -> Step:
    if old is None:
        return lambda s: s.remove_connector(name)

    def restore(s: GroupState) -> None:
        s.put_connector(old)
        for task, status in (statuses or {}).items():
            s.put_status(name, task, status)

    return restore


def _restore_statuses(old: list[tuple[str, int, ResourceStatus | None]]) -> Step:
    def restore(s: GroupState) -> None:
        for connector, task, status in old:
            s.put_status(connector, task, status)

    return restore


class _Remember:
    """What a record is about to change, pushed on an `Undo` (a `RecordVisitor`)."""

    __slots__ = ("state", "undo")

    def __init__(self, state: GroupState, undo: Undo) -> None:
        self.state, self.undo = state, undo

    def meta(self, record: GroupMetaRecord) -> None:
        self.undo.push(_set_meta(self.state.meta))

    def target(self, record: TargetRecord) -> None:
        self.undo.push(_set_target(self.state.target))

    def member(self, record: MemberRecord) -> None:
        member_id = record.member.member_id
        self.undo.push(_restore_member(member_id, self.state.members.get(member_id)))

    def members_moved(self, record: MembersMovedRecord) -> None:
        members = self.state.members
        self.undo.push(_restore_moved([members[m] for m in record.member_ids if m in members]))

    def member_removed(self, record: MemberRemovedRecord) -> None:
        member_id = record.member_id
        self.undo.push(_restore_member(member_id, self.state.members.get(member_id)))

    def connector(self, record: ConnectorRecord) -> None:
        name = record.connector.name
        self.undo.push(_restore_connector(name, self.state.catalogue.get(name)))

    def connector_removed(self, record: ConnectorRemovedRecord) -> None:
        state, name = self.state, record.name
        old_statuses = state.statuses.get(name)
        self.undo.push(_restore_connector(name, state.catalogue.get(name), old_statuses))

    def statuses(self, record: StatusRecord) -> None:
        state = self.state
        old = [(c, t, state.resource_status(c, t)) for c, t in record.statuses]
        self.undo.push(_restore_statuses(old))

    def configs(self, record: ConfigRecord) -> None:
        self.undo.push(_set_configs(self.state.configs))

    def classic_round(self, record: ClassicRoundRecord) -> None:
        self.undo.push(_restore_round(self.state.round, record))

    def group_deleted(self, record: GroupDeletedRecord) -> None:
        pass  # the state is left as it was (see `_Apply.group_deleted`)

    def event(self, record: EventRecord) -> None:
        pass


class _Apply:
    """Records applied to a state (a `RecordVisitor`), checking the invariants."""

    __slots__ = ("state",)

    def __init__(self, state: GroupState) -> None:
        self.state = state

    def meta(self, record: GroupMetaRecord) -> None:
        state, meta = self.state, record.meta
        if meta.group_epoch < state.meta.group_epoch:
            raise IllegalStateError(
                f"group epoch of {state.group_id} would go down: "
                f"{state.meta.group_epoch} -> {meta.group_epoch}"
            )
        state.meta = meta

    def target(self, record: TargetRecord) -> None:
        state, target = self.state, record.target
        if target.assignment_epoch < state.target.assignment_epoch:
            raise IllegalStateError(
                f"assignment epoch of {state.group_id} would go down: "
                f"{state.target.assignment_epoch} -> {target.assignment_epoch}"
            )
        if target.assignment_epoch > state.meta.group_epoch:
            raise IllegalStateError(
                f"assignment epoch {target.assignment_epoch} ahead of group epoch "
                f"{state.meta.group_epoch} in {state.group_id}"
            )
        state.target = target

    def member(self, record: MemberRecord) -> None:
        member = record.member
        old = self.state.members.get(member.member_id)
        if old is not None and member.member_epoch < old.member_epoch:
            raise IllegalStateError(
                f"epoch of member {member.member_id} would go down: "
                f"{old.member_epoch} -> {member.member_epoch}"
            )
        if member.assigned & member.pending_revocation:
            raise IllegalStateError(
                f"member {member.member_id} has resources both assigned and pending revocation"
            )
        self.state.put_member(member)

    def members_moved(self, record: MembersMovedRecord) -> None:
        """Only the epoch changes: what each member owns, its instance id and its assignors stay,
        so the owner and selection indexes stay as they are (O(1) per member, not O(share))."""
        state, epoch = self.state, record.epoch
        if epoch > state.target.assignment_epoch:
            raise IllegalStateError(
                f"members of {state.group_id} moved to epoch {epoch}, past the assignment epoch "
                f"{state.target.assignment_epoch}"
            )
        for member_id in record.member_ids:
            member = state.members.get(member_id)
            if member is None:
                raise IllegalStateError(f"member {member_id} moved to epoch {epoch} is gone")
            if member.state is not MemberState.STABLE or member.pending_revocation:
                raise IllegalStateError(
                    f"member {member_id} moved to epoch {epoch} while {member.state.value} "
                    "or with resources pending revocation"
                )
            if epoch < member.member_epoch:
                raise IllegalStateError(
                    f"epoch of member {member_id} would go down: {member.member_epoch} -> {epoch}"
                )
            state.put_member_epoch(replace(member, member_epoch=epoch))

    def member_removed(self, record: MemberRemovedRecord) -> None:
        self.state.remove_member(record.member_id)

    def connector(self, record: ConnectorRecord) -> None:
        self.state.put_connector(record.connector)

    def connector_removed(self, record: ConnectorRemovedRecord) -> None:
        self.state.remove_connector(record.name)

    def configs(self, record: ConfigRecord) -> None:
        self.state.configs = dict(record.configs)

    def statuses(self, record: StatusRecord) -> None:
        for (connector, task), status in record.statuses.items():
            self.state.put_status(connector, task, status)

    def group_deleted(self, record: GroupDeletedRecord) -> None:
        """Nothing: the state object is not emptied; the runtime drops it after a deletion's
        commit (`group_commit`), and keeps it to put back if that commit fails."""

    def classic_round(self, record: ClassicRoundRecord) -> None:
        """The round changes in place, at the cost of what the delta names (DESIGN 3.21)."""
        state = self.state
        if state.round is None:
            state.round = ClassicRound()
        state.round.apply(record.delta)

    def event(self, record: EventRecord) -> None:
        pass
