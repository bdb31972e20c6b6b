"""DeleteGroup and RemoveMember (DESIGN 3.20): the operator's ways to take a group, or one of its
members, away for good.

DeleteGroup deletes all of a group's state (members' rows, catalogue, target, configurations,
statuses) and keeps its events; it is refused NON_EMPTY_GROUP while the group has a member (a
LEFT static member too: its instance id is kept for it), a hold that has not ended, a classic
state other than EMPTY, or, unless `with_catalogue`, connectors. Its `Tombstone` keeps the
group's last epoch and fencing token: a group created again under the id continues both
(`change.continuing`), so (group, epoch) stays unique in the events and tokens only rise.

RemoveMember removes a member of either protocol as a fence does (DESIGN 3.13): what it holds
goes to nobody for a session timeout (its agent, cut off, has fenced itself by then), its member
id and instance id stay bound to its principal while held, and the group epoch is bumped (a
classic group starts a rebalance). A static member that had left holds nothing (its agent
stopped its work when it left): its reservation simply ends.

Costs: DeleteGroup O(1) in the core (the store deletes the rows); RemoveMember O(the member's
resources), as a fence."""

from __future__ import annotations

from typing import Any

from connect_protocol.errors import (
    CoordinatorError,
    GroupIdNotFound,
    NonEmptyGroup,
    UnknownMemberId,
)
from connect_protocol.messages import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    RemoveMemberRequest,
    RemoveMemberResponse,
)

from .admin import who
from .change import GroupChange
from .classic_model import ClassicState
from .classic_rebalance import after_removal
from .classic_rebalance import remove_member as remove_classic_member
from .conversion import maybe_downgrade
from .mixed_group import session_ms
from .model import GroupConfigDefaults, GroupState, Member, MemberState, Tombstone
from .records import EventRecord, EventType, GroupDeletedRecord
from .results import CLASSIC_MEMBER_DEADLINE, HOLD, REVOCATION, SESSION, Result, refused
from .validation import validate_delete_group, validate_remove_member

# --- DeleteGroup ------------------------------------------------------------------------------


def delete_group(
    state: GroupState | None,
    req: DeleteGroupRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[DeleteGroupResponse]:
    try:
        if not validated:
            validate_delete_group(req)
        if state is None:
            raise GroupIdNotFound(f"group {req.group_id!r} does not exist.")
        check_deletable(state, req.with_catalogue, now_ms)
    except CoordinatorError as error:
        return refused(DeleteGroupResponse, error)
    meta = state.meta
    tombstone = Tombstone(req.group_id, meta.group_epoch, meta.last_fencing_token)
    response = DeleteGroupResponse(
        group_epoch=meta.group_epoch,
        last_fencing_token=meta.last_fencing_token,
        connectors_deleted=len(state.catalogue),
        tasks_deleted=state.catalogue_tasks,
        configs_deleted=len(state.configs),
    )
    event = EventRecord(
        req.group_id,
        meta.group_epoch,
        EventType.GROUP_DELETED,
        now_ms,
        payload={
            "group_type": meta.group_type.value,
            "connectors_deleted": response.connectors_deleted,
            "tasks_deleted": response.tasks_deleted,
            "configs_deleted": response.configs_deleted,
            "last_fencing_token": meta.last_fencing_token,
            **who(req.caller, principal),
        },
    )
    return Result(
        [event, GroupDeletedRecord(req.group_id, tombstone, now_ms, principal or "")], response
    )


def check_deletable(state: GroupState, with_catalogue: bool, now_ms: int) -> None:
    """NON_EMPTY_GROUP, saying why, unless the group may be deleted now. O(1) but for the holds
    (a handful at most: each is a removed member's, for a session timeout)."""
    group_id = state.group_id
    classic = state.meta.classic
    if state.meta.is_classic and classic is not None and classic.state is not ClassicState.EMPTY:
        raise NonEmptyGroup(
            f"classic group {group_id!r} is {classic.state.value}, not EMPTY "
            f"({len(state.members):,} members); retry once its members have left (or been "
            "removed with RemoveMember) and it is EMPTY."
        )
    if state.members:
        left = len(state.left_members)
        static = (
            f" ({left} of them static members that left, kept for their rejoin)" if left else ""
        )
        raise NonEmptyGroup(
            f"group {group_id!r} has {len(state.members):,} members{static}; they must leave "
            "first, or be removed with RemoveMember (`coordinator-svc remove-member`), and "
            "their held work must be released."
        )
    holds = [h for h in state.meta.holds if h.until_ms > now_ms]
    if holds:
        until = max(h.until_ms for h in holds)
        raise NonEmptyGroup(
            f"group {group_id!r} still holds the work of {len(holds)} removed member(s) until "
            f"{until} (coordinator ms), so that nothing runs twice; retry after that."
        )
    if state.catalogue and not with_catalogue:
        raise NonEmptyGroup(
            f"group {group_id!r} has {len(state.catalogue):,} connectors "
            f"({state.catalogue_tasks:,} tasks); delete them first, or delete the group with "
            "its catalogue (with_catalogue; `coordinator-svc delete-group --with-catalogue`)."
        )


# --- RemoveMember -----------------------------------------------------------------------------


def remove_member(
    state: GroupState | None,
    req: RemoveMemberRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[RemoveMemberResponse]:
    try:
        if not validated:
            validate_remove_member(req)
        if state is None:
            raise GroupIdNotFound(f"group {req.group_id!r} does not exist.")
        member = _named_member(state, req)
    except CoordinatorError as error:
        return refused(RemoveMemberResponse, error)
    change = GroupChange(state, req.group_id, now_ms, defaults)
    details: dict[str, Any] = {
        "reason": req.reason,
        "protocol": "classic" if member.classic is not None else "connect",
        **who(req.caller, principal),
    }
    if state.meta.is_classic:
        until = _remove_from_classic_group(change, member, details)
    else:
        until = _remove_from_connect_group(change, member, details)
    held = len(member.owned) if until else 0
    return change.result(
        RemoveMemberResponse(
            member_id=member.member_id,
            group_epoch=change.group_epoch,
            resources_held=held,
            held_until_ms=until if held else 0,
        )
    )


def _named_member(state: GroupState, req: RemoveMemberRequest) -> Member:
    if req.member_id:
        member = state.members.get(req.member_id)
        if member is None:
            raise UnknownMemberId(
                f"group {req.group_id!r} has no member {req.member_id!r} (it may have left or "
                "been removed already)."
            )
        return member
    member_id = state.instance_owner.get(req.instance_id)
    member = None if member_id is None else state.members.get(member_id)
    if member is None:
        raise UnknownMemberId(
            f"group {req.group_id!r} has no member with instance id {req.instance_id!r}."
        )
    return member


def _remove_from_connect_group(change: GroupChange, member: Member, details: dict[str, Any]) -> int:
    """As a fence (`heartbeat.fence`; a classic-protocol member as `mixed_group.deadline_missed`):
    its work held for the session its agent fences itself by. Returns the hold's end (0: a
    static member that had left, which holds nothing)."""
    member_id = member.member_id
    left = member.state is MemberState.LEFT
    until = 0
    change.remove_member(member_id)
    if not left:
        until = change.now_ms + (
            session_ms(change, member)
            if member.classic is not None
            else change.fencing_session_ms()
        )
        change.add_hold(member_id, member.owned, until, member.principal, member.instance_id)
        if member.owned:
            change.schedule((HOLD, member_id), until)
    for kind in (SESSION, REVOCATION, CLASSIC_MEMBER_DEADLINE):
        change.cancel((kind, member_id))
    held = {"held": member.owned.payload(), "held_until_ms": until} if until else {}
    change.event(EventType.MEMBER_REMOVED, member_id, static_left=left, **held, **details)
    change.bump_epoch("member removed", member_id=member_id)
    change.reselect_assignor()
    if member.classic is None:
        maybe_downgrade(change, "last connect-protocol member removed")
    return until


def _remove_from_classic_group(change: GroupChange, member: Member, details: dict[str, Any]) -> int:
    """As a classic revocation timeout: removed with its work held for its own session
    timeout, and a rebalance started (or the join phase completed without it)."""
    remove_classic_member(
        change, member, hold=True, event=EventType.MEMBER_REMOVED, static_left=False, **details
    )
    after_removal(change, "member removed", member.member_id)
    hold = change.hold(member.member_id)
    return 0 if hold is None else hold.until_ms
