"""The classic Heartbeat and LeaveGroup (DESIGN 3.19).

A heartbeat writes nothing: it re-arms the member's session and answers NONE, or
REBALANCE_IN_PROGRESS while the group is PREPARING_REBALANCE (the member rejoins), in O(1) and
without a `GroupChange` (GroupMetadataManager `classicGroupHeartbeatToClassicGroup`,
`validateClassicGroupHeartbeat`; GroupMetadataManagerTest `testHeartbeatEmptyGroup`,
`testHeartbeatDuringPreparingRebalance`, `testHeartbeatIllegalGeneration`).

LeaveGroup removes the caller's own members and pending ids only, without a hold (Departure:
Kafka's removes any listed member; here ids are bound to principals), then completes the join
phase or starts a rebalance (GroupMetadataManager `classicGroupLeaveToClassicGroup`,
GroupMetadataManagerTest `testPendingMembersLeaveGroup`).
"""

from __future__ import annotations

from connect_protocol.classic_messages import (
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeftMember,
)
from connect_protocol.errors import (
    CoordinatorError,
    ErrorCode,
    GroupAuthorizationFailed,
    IllegalGeneration,
    UnknownMemberId,
)

from . import mixed_group
from .change import GroupChange
from .classic_model import ClassicState
from .classic_rebalance import REBALANCING, after_removal, classic_meta, remove_member
from .classic_validation import validate_classic_heartbeat, validate_leave
from .model import GroupConfigDefaults, GroupState
from .records import EventType
from .results import CLASSIC_PENDING, SESSION, Result, ScheduleTimer, refused


def heartbeat(
    state: GroupState | None,
    req: ClassicHeartbeatRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[ClassicHeartbeatResponse]:
    """Handle one classic heartbeat: never a record, only the member's session re-armed."""
    try:
        if not validated:
            validate_classic_heartbeat(req)
        if state is not None and not state.meta.is_classic:  # of a connect group (3.19)
            return mixed_group.translated_heartbeat(state, req, now_ms, defaults, principal)
        member = None if state is None else state.members.get(req.member_id)
        if state is None or member is None or member.classic is None:
            raise UnknownMemberId(
                f"member {req.member_id!r} is not in group {req.group_id!r}; join with an "
                "empty member id."
            )
        if principal is not None and member.principal and member.principal != principal:
            raise GroupAuthorizationFailed(
                f"member id {req.member_id!r} belongs to another principal."
            )
        classic = state.meta.classic
        group_state = ClassicState.EMPTY if classic is None else classic.state
        if group_state is ClassicState.EMPTY:
            raise UnknownMemberId(f"group {req.group_id!r} is empty; join with an empty member id.")
        if req.generation_id != state.group_epoch:
            raise IllegalGeneration(
                f"generation {req.generation_id} is not the group's ({state.group_epoch}); rejoin."
            )
    except CoordinatorError as error:
        return refused(ClassicHeartbeatResponse, error)
    session = ScheduleTimer((SESSION, member.member_id), now_ms + member.classic.session_timeout_ms)
    if group_state is ClassicState.PREPARING_REBALANCE:
        response = ClassicHeartbeatResponse(
            ErrorCode.REBALANCE_IN_PROGRESS, REBALANCING, member.lifecycle_revision
        )
        return Result([], response, [session])
    return Result(
        [], ClassicHeartbeatResponse(lifecycle_revision=member.lifecycle_revision), [session]
    )


def leave_group(
    state: GroupState | None,
    req: LeaveGroupRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[LeaveGroupResponse]:
    """Handle one LeaveGroup: each listed member or pending id of the caller's is removed (no
    hold: the member stopped its work before it left); others are answered per member."""
    try:
        if not validated:
            validate_leave(req)
        if state is None:
            raise UnknownMemberId(f"group {req.group_id!r} has no classic members.")
    except CoordinatorError as error:
        return refused(LeaveGroupResponse, error)
    change = GroupChange(state, req.group_id, now_ms, defaults)
    if not state.meta.is_classic:  # classic members of a connect group (3.19)
        return mixed_group.translated_leave(change, req, principal)
    outcomes: list[LeftMember] = []
    first_removed: str | None = None
    dropped = False
    for leaving in req.members:
        member_id = leaving.member_id
        pending = change.round.pending(member_id)
        member = change.member(member_id)
        bound_to = (
            pending.principal
            if pending is not None
            else (member.principal if member is not None else "")
        )
        if pending is None and (member is None or member.classic is None):
            outcomes.append(
                LeftMember(member_id, ErrorCode.UNKNOWN_MEMBER_ID, "no such member in the group.")
            )
        elif principal is not None and bound_to and bound_to != principal:
            outcomes.append(
                LeftMember(
                    member_id,
                    ErrorCode.GROUP_AUTHORIZATION_FAILED,
                    "a member leaves only for itself (this id belongs to another principal).",
                )
            )
        elif pending is not None:
            change.drop_pending_id(member_id)
            change.cancel((CLASSIC_PENDING, member_id))
            dropped = True
            outcomes.append(LeftMember(member_id))
        else:
            assert member is not None
            remove_member(
                change,
                member,
                hold=False,
                event=EventType.MEMBER_LEFT,
                static=False,
                released=member.owned.payload(),
                reason=leaving.reason,
            )
            first_removed = first_removed or member_id
            outcomes.append(LeftMember(member_id))
    if first_removed is not None:
        after_removal(change, "member left", first_removed)
    elif dropped and classic_meta(change).state is ClassicState.PREPARING_REBALANCE:
        after_removal(change, "pending member left", None)
    return change.result(LeaveGroupResponse(members=tuple(outcomes)))
