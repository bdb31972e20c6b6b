"""Group type conversions (DESIGN 3.19 "Empty conversions"): an EMPTY group with no holds takes
its first joiner's protocol, keeping its catalogue, configurations and fencing token counter.
Group epoch and generation are one counter that never goes down: to classic, generation = group
epoch; to connect, group epoch = assignment epoch = max(generation, 1).

This module owns the rule (`convertible`) and the two conversions; the join handlers call them
(a classic JoinGroup into an empty connect group, P1; a connect join into an empty classic
group, `heartbeat.py`); these cost O(1) but for dropping a classic group's pending ids. Non-empty
groups convert by `upgrade` (DESIGN 3.19 "Upgrade") and `downgrade` ("Downgrade"), each O(members)
once per conversion; `mixed_group.py` holds the policy that allows them.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType
from typing import Any

from connect_protocol.classic_messages import JoinGroupResponse, protocol_version
from connect_protocol.errors import ErrorCode

from .change import GroupChange
from .classic_model import (
    AcceptedAssignment,
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicState,
    GroupType,
)
from .errors import IllegalStateError
from .model import GroupState, MemberState, TargetAssignment, TargetEntry
from .records import EventType
from .results import (
    ASSIGNOR,
    CLASSIC_JOIN,
    CLASSIC_MEMBER_DEADLINE,
    CLASSIC_PENDING,
    CLASSIC_SYNC,
    SCHEDULED_REBALANCE,
    WAKE_JOIN,
    WAKE_SYNC,
)

#: A generation no call names (generations start at 0).
NO_GENERATION = -1

TO_CLASSIC = "to_classic"
TO_CONNECT = "to_connect"


def convertible(group: GroupChange | GroupState) -> bool:
    """Whether the group may change type: no members at all (a static member that LEFT is
    still a member) and no holds (a removed member may still run held work). O(1) for a
    `GroupState`, O(members changed) for a `GroupChange`."""
    if isinstance(group, GroupChange):
        return not group.has_members() and not group.meta.holds
    return not group.members and not group.meta.holds


def _require_convertible(change: GroupChange, direction: str) -> None:
    if not convertible(change):
        raise IllegalStateError(
            f"group {change.group_id!r} cannot be converted {direction}: it has members or holds"
        )


def _emptied_target(change: GroupChange, epoch: int) -> None:
    """The target of an empty group at `epoch`: no shares, no scheduled rebalance (its timer
    cancelled), the assignor's state kept (it is the connect assignor's memory; harmless)."""
    target = change.target
    if target.scheduled_rebalance_at_ms is not None:
        change.cancel((SCHEDULED_REBALANCE, ""))
    changed = None if target.members else ()
    change.set_target(
        replace(
            target,
            assignment_epoch=epoch,
            members={},
            scheduled_rebalance_at_ms=None,
            lost_work_rebalance_at_ms=None,
            next_wave_at_ms=None,
        ),
        changed,
    )


def _no_computation(change: GroupChange) -> None:
    """Nothing of the connect protocol's computation survives a conversion."""
    meta = change.meta
    if meta.compute_requested_epoch is not None:
        change.cancel((ASSIGNOR, ""))
    change.set_meta(
        assignor_member_id=None,
        compute_requested_epoch=None,
        excluded_assignors=frozenset(),
        compute_not_before_ms=None,
        prepared=None,
    )


def to_classic(change: GroupChange) -> None:
    """Make the (convertible) connect group classic: type classic, state EMPTY, generation =
    group epoch, any scheduled rebalance dropped, GROUP_CONVERTED (direction to_classic).
    IllegalStateError if it is not convertible or already classic (a caller's bug)."""
    _require_convertible(change, TO_CLASSIC)
    if change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is already classic")
    epoch = change.group_epoch
    _emptied_target(change, epoch)
    _no_computation(change)
    change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta(ClassicState.EMPTY))
    _converted(change, TO_CLASSIC, epoch)


def to_connect(change: GroupChange) -> None:
    """Make the (convertible) classic group connect: group epoch = assignment epoch =
    max(generation, 1), classic state and round dropped (pending ids too, with their timers and
    the join and sync deadlines), GROUP_CONVERTED (direction to_connect). IllegalStateError if
    it is not convertible or not classic (a caller's bug)."""
    _require_convertible(change, TO_CONNECT)
    if not change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is not classic")
    generation = change.group_epoch
    epoch = max(generation, 1)
    _drop_round(change)
    change.set_meta(group_type=GroupType.CONNECT, classic=None, group_epoch=epoch)
    _emptied_target(change, epoch)
    _no_computation(change)
    _converted(change, TO_CONNECT, generation)


# --- conversions of non-empty groups (issue 27) ---------------------------------------------


def upgrade(change: GroupChange) -> None:
    """Convert a non-empty classic group to connect, in any classic state (DESIGN 3.19
    "Upgrade", Kafka's convertToConsumerGroup), before the connect join that asked for it
    proceeds: parked calls are answered REBALANCE_IN_PROGRESS; group epoch = assignment epoch =
    generation; each member becomes a member at that epoch whose current assignment is what it
    holds less its pending revocation, which it keeps (UNREVOKED if any); the target equals the
    current assignments, so nothing moves; holds go on. O(members): once per conversion."""
    from .classic_rebalance import rebalance_in_progress_sync  # late: it builds on this module
    from .mixed_group import assignors_of

    if not change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is not classic")
    generation = change.group_epoch
    epoch = max(generation, 1)
    classic = change.meta.classic or ClassicGroupMeta()
    round_ = change.round
    if classic.state is ClassicState.PREPARING_REBALANCE:
        for member_id in sorted(round_.joined()):
            change.wake(WAKE_JOIN, member_id, _rejoin_join(member_id))
    for member_id in sorted(round_.parked_sync()):
        change.wake(WAKE_SYNC, member_id, rebalance_in_progress_sync())
    _drop_round(change)
    counts = {GroupType.CLASSIC.value: 0, GroupType.CONNECT.value: 0}
    shares: dict[str, TargetEntry] = {}
    for member in sorted(change.members().values(), key=lambda m: m.member_id):
        info = member.classic
        if info is None:
            counts[GroupType.CONNECT.value] += 1
            continue
        counts[GroupType.CLASSIC.value] += 1
        change.put_member(
            replace(
                member,
                member_epoch=epoch,
                previous_epoch=epoch,
                assignors=assignors_of(info.protocols),
                state=MemberState.UNREVOKED if member.pending_revocation else MemberState.STABLE,
                stable_since_epoch=epoch,
                # Only the protocol version its worker acts on is kept (the generation never
                # matches: a SyncGroup is answered what its translated JoinGroup fixes).
                classic=replace(info, accepted=_acting(classic, info)),
            )
        )
        if member.assigned:
            shares[member.member_id] = TargetEntry(member.assigned)
    change.set_meta(group_type=GroupType.CONNECT, classic=None, group_epoch=epoch)
    change.set_target(
        TargetAssignment(assignment_epoch=epoch, members=MappingProxyType(shares)), None
    )
    _no_computation(change)
    _converted(change, TO_CONNECT, generation, counts, classic_state=classic.state.value)


def _downgrade_allowed(change: GroupChange) -> bool:
    """A connect group without connect-protocol members (classic ones only, or none) whose
    policy allows the downgrade. O(members changed)."""
    from connect_protocol.configs import MIGRATION_POLICY

    from .mixed_group import conversion_allowed

    return (
        not change.meta.is_classic
        and change.classic_member_count() == change.member_count()
        and conversion_allowed(change.config(MIGRATION_POLICY), TO_CLASSIC)
    )


def downgrade_due(change: GroupChange) -> bool:
    """Whether the connect group has members, all of the classic protocol (the last
    connect-protocol member is gone), and its policy allows the downgrade. O(members changed)."""
    return change.member_count() > 0 and _downgrade_allowed(change)


def downgrade_for_classic_join(change: GroupChange) -> bool:
    """Before a classic JoinGroup into a connect group that is not convertible as empty (it has
    holds) and has no connect-protocol member: downgrade it if the policy allows, so that the
    join proceeds on a classic group (else the join would make a connect group nobody can
    compute for). Whether it did."""
    if not _downgrade_allowed(change):
        return False
    downgrade(change, "a classic worker joined a connect group without connect members")
    return True


def maybe_downgrade(change: GroupChange, reason: str) -> bool:
    """Downgrade the group if it is due (`downgrade_due`); whether it did."""
    if not downgrade_due(change):
        return False
    downgrade(change, reason)
    return True


def downgrade(change: GroupChange, reason: str) -> None:
    """Convert a connect group whose members all speak the classic protocol to classic
    (DESIGN 3.19 "Downgrade", Kafka's convertToClassicGroup): generation = group epoch, each
    member holds its current plus pending sets, the target and any scheduled rebalance are
    dropped, and a classic rebalance starts (`reason`); the new leader starts from empty
    memory, as Connect's does, and holds apply as in classic groups. Calls carrying older
    epochs get ILLEGAL_GENERATION and the members rejoin. O(members): once per conversion."""
    from .classic_rebalance import prepare_rebalance, vote  # late: it builds on this module

    if change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is already classic")
    epoch = change.group_epoch
    members = sorted(change.members().values(), key=lambda m: m.member_id)
    if any(m.classic is None for m in members):
        raise IllegalStateError(f"group {change.group_id!r} has connect-protocol members")
    for member in members:
        assert member.classic is not None
        change.cancel((CLASSIC_MEMBER_DEADLINE, member.member_id))
        change.put_member(
            replace(
                member,
                state=MemberState.UNREVOKED if member.pending_revocation else MemberState.STABLE,
                # `accepted` stays: it says which protocol version its worker acts on.
                classic=member.classic,
            )
        )
    _emptied_target(change, epoch)
    _no_computation(change)
    protocol = vote(members) if members else None
    state = ClassicState.STABLE if members else ClassicState.EMPTY  # EMPTY: holds only
    change.set_meta(
        group_type=GroupType.CLASSIC,
        classic=ClassicGroupMeta(state, protocol_name=protocol),
    )
    _converted(
        change, TO_CLASSIC, epoch, {GroupType.CLASSIC.value: len(members)}, protocol=protocol
    )
    prepare_rebalance(change, reason)


def _acting(classic: ClassicGroupMeta, info: ClassicMemberInfo) -> AcceptedAssignment | None:
    """What a classic member keeps of its accepted assignment through an upgrade: the protocol
    version its worker acts on (its last answer's; else the generation's protocol), under a
    generation no call can name. A member that has not rejoined since an earlier downgrade
    still acts on its translated answer's version, not on the group's voted protocol."""
    if info.accepted is not None:
        version: int | None = info.accepted.version
    elif classic.protocol_name is not None:
        version = protocol_version(classic.protocol_name)
    else:
        version = None
    return None if version is None else AcceptedAssignment(NO_GENERATION, version, answered=True)


def _converted(
    change: GroupChange,
    direction: str,
    generation: int,
    counts: dict[str, int] | None = None,
    **details: Any,
) -> None:
    """GROUP_CONVERTED: the direction, the generation (= the group epoch before), the members
    per protocol (`counts`, the others 0) and `details`."""
    members = {GroupType.CLASSIC.value: 0, GroupType.CONNECT.value: 0, **(counts or {})}
    change.event(
        EventType.GROUP_CONVERTED,
        direction=direction,
        group_epoch_before=generation,
        generation=generation,
        members=members,
        **details,
    )


def _drop_round(change: GroupChange) -> None:
    """The classic round and its timers go (pending ids too)."""
    change.cancel((CLASSIC_JOIN, ""))
    change.cancel((CLASSIC_SYNC, ""))
    if change.state is not None and change.state.round is not None:
        for pending_id in change.round.pending_ids():
            change.drop_pending_id(pending_id)
            change.cancel((CLASSIC_PENDING, pending_id))
        if not change.state.round.is_idle():
            change.clear_round()
        change.set_round(
            initial=False,
            initial_remaining_ms=0,
            new_member_added=False,
            leader_unavailable_reason="",
        )


def _rejoin_join(member_id: str) -> JoinGroupResponse:
    return JoinGroupResponse(
        ErrorCode.REBALANCE_IN_PROGRESS,
        "the group was converted to the connect protocol while your JoinGroup waited; send it "
        "again.",
        member_id=member_id,
    )
