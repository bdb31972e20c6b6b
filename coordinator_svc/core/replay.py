"""Apply records to group state: the one path for live changes and for loading after takeover."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from .errors import IllegalStateError
from .model import GroupState, MemberState, TargetAssignment
from .records import (
    ConfigRecord,
    ConnectorRecord,
    ConnectorRemovedRecord,
    EventRecord,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    MembersMovedRecord,
    Record,
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


def apply(state: GroupState, record: Record) -> None:
    """Apply one record. Raises IllegalStateError if it would break an invariant."""
    visit(record, _Apply(state))


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
            state.members[member_id] = replace(member, member_epoch=epoch)

    def member_removed(self, record: MemberRemovedRecord) -> None:
        self.state.remove_member(record.member_id)

    def connector(self, record: ConnectorRecord) -> None:
        self.state.put_connector(record.connector)

    def connector_removed(self, record: ConnectorRemovedRecord) -> None:
        self.state.remove_connector(record.name)

    def configs(self, record: ConfigRecord) -> None:
        self.state.configs = dict(record.configs)

    def event(self, record: EventRecord) -> None:
        pass
