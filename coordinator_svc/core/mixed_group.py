"""Classic-protocol members of a connect group (DESIGN 3.19 "Classic members of a connect
group"): a worker that still speaks JoinGroup/SyncGroup/Heartbeat/LeaveGroup is a member of a
connect group like any other, reconciled by the same rules (3.11), while the group migrates.

Its calls are translated as Kafka's GroupMetadataManager translates a classic consumer's calls
to a consumer group (`classicGroupJoinToConsumerGroup`, `classicGroupSyncToConsumerGroup`,
`classicGroupHeartbeatToConsumerGroup`, `classicGroupLeaveToConsumerGroup`), reading our
assignment epoch where Kafka reads the group epoch (Departure: our assignor is asynchronous, so
the group epoch runs ahead of any target a call can reconcile to):

- JoinGroup is answered at once: the member is created or updated, its owned list is its
  allocation (version 0: none), it is reconciled, and the answer's generation is its member
  epoch after that, with no leader and no member list. What its SyncGroup will be answered is
  fixed then (`AcceptedAssignment`), so a retry gets the same answer.
- SyncGroup writes nothing: the generation must be the member epoch, and the answer is what the
  JoinGroup fixed (versions 1-2: `revoked` = owned - assigned, `assignment` = assigned - owned,
  so Connect's merge yields what it is assigned; version 0: the whole set), unless a newer target
  was installed meanwhile (REBALANCE_IN_PROGRESS: rejoin).
- Heartbeat writes nothing: REBALANCE_IN_PROGRESS exactly when the member is behind the
  assignment epoch, UNREVOKED, or UNRELEASED with all it waits for free.
- LeaveGroup removes the member without a hold.
- A missed sync deadline (after a JoinGroup) or join deadline (after the first
  REBALANCE_IN_PROGRESS) removes the member with a hold, as a revocation timeout does.

Protocols map to assignors (`assignors_of`); a classic member votes and must be covered, but
only a connect-protocol member may compute (`selection_index.CLASSIC_MARK`).

Also the migration policy's rules (`conversion_allowed`) and refusals. Every call costs
O(the member's share), none reads the whole group.
"""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.classic_messages import (
    COOPERATIVE_VERSION,
    PROTOCOL_TYPE,
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    ClassicProtocol,
    ConnectWorkerAssignment,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeftMember,
    SyncGroupRequest,
    SyncGroupResponse,
    protocol_version,
)
from connect_protocol.configs import (
    MIGRATION_BIDIRECTIONAL,
    MIGRATION_DISABLED,
    MIGRATION_DOWNGRADE,
    MIGRATION_POLICY,
    MIGRATION_UPGRADE,
)
from connect_protocol.errors import (
    ErrorCode,
    GroupAuthorizationFailed,
    GroupMaxSizeReached,
    IllegalGeneration,
    InconsistentGroupProtocol,
    RebalanceInProgress,
    UnknownMemberId,
)
from connect_protocol.messages import Assignor
from connect_protocol.resources import EMPTY, ResourceSet

from .change import GroupChange
from .classic_model import AcceptedAssignment, ClassicMemberInfo, GroupType
from .delivery import reconcile_member
from .model import GroupConfigDefaults, GroupState, Member, MemberState
from .records import EventType
from .results import (
    CLASSIC_MEMBER_DEADLINE,
    HOLD,
    REVOCATION,
    SESSION,
    Parked,
    Result,
    ScheduleTimer,
    TimerOp,
)
from .selection import NoSelection, select_with

EAGER_ASSIGNOR = "eager"
COOPERATIVE_ASSIGNOR = "incremental_cooperative"

TO_CONNECT = "to_connect"
TO_CLASSIC = "to_classic"

_ALLOWED = {
    TO_CONNECT: frozenset({MIGRATION_BIDIRECTIONAL, MIGRATION_UPGRADE}),
    TO_CLASSIC: frozenset({MIGRATION_BIDIRECTIONAL, MIGRATION_DOWNGRADE}),
}

REJOIN = "the group's assignment moved on: rejoin (JoinGroup with your member id)."


# --- the policy ------------------------------------------------------------------------------


def conversion_allowed(policy: str, direction: str) -> bool:
    """Whether `group.protocol.migration.policy` `policy` lets a non-empty group convert in
    `direction` (TO_CONNECT: an upgrade; TO_CLASSIC: a downgrade)."""
    return policy in _ALLOWED[direction]


def upgrade_refused(group_id: str, policy: str) -> InconsistentGroupProtocol:
    """A connect join to a non-empty classic group whose policy forbids the upgrade."""
    return InconsistentGroupProtocol(
        f"group {group_id!r} is a classic group with members, and its "
        f"{MIGRATION_POLICY.name} is {policy!r}, which does not allow converting it to the "
        "connect protocol: join with the classic protocol, or set the policy to "
        f"{MIGRATION_UPGRADE!r} or {MIGRATION_BIDIRECTIONAL!r} (coordinator-svc alter-configs)."
    )


def classic_join_refused(group_id: str, policy: str) -> InconsistentGroupProtocol:
    """A classic join to a non-empty connect group whose policy is `disabled` (KAFKA-20640)."""
    return InconsistentGroupProtocol(
        f"group {group_id!r} is a connect group that is not empty (it has members or held "
        f"work), and its {MIGRATION_POLICY.name} is {policy!r}, which admits no "
        "classic-protocol worker to it: join with the connect "
        f"protocol, or set the policy to {MIGRATION_BIDIRECTIONAL!r}, {MIGRATION_UPGRADE!r} or "
        f"{MIGRATION_DOWNGRADE!r} (coordinator-svc alter-configs)."
    )


# --- the assignor mapping ------------------------------------------------------------------


def assignors_of(protocols: tuple[ClassicProtocol, ...]) -> tuple[Assignor, ...]:
    """A classic member's protocols as client assignors, in its order of preference, versions of
    one assignor merged into a range: default -> eager 0, compatible -> incremental_cooperative
    1, sessioned -> incremental_cooperative 2; the version is the top of the range, with no
    metadata (Departure: seed 004's version -1 is outside our ranges)."""
    ranges: dict[str, tuple[int, int]] = {}
    for protocol in protocols:
        version = protocol_version(protocol.name)
        if version is None:
            continue  # validated away before a handler runs
        name = COOPERATIVE_ASSIGNOR if version >= COOPERATIVE_VERSION else EAGER_ASSIGNOR
        low, high = ranges.get(name, (version, version))
        ranges[name] = (min(low, version), max(high, version))
    return tuple(Assignor(name, lo, hi, version=hi) for name, (lo, hi) in ranges.items())


def owned_list(protocol: ClassicProtocol) -> ResourceSet:
    """What a JoinGroup says the worker runs: the allocation of its first protocol (version 0,
    or a cooperative worker's first join: nothing)."""
    version = protocol_version(protocol.name) or 0
    allocation = protocol.metadata.allocation
    if version < COOPERATIVE_VERSION or allocation is None:
        return EMPTY
    return allocation


def sync_answer_of(member: Member, owned: ResourceSet, version: int) -> AcceptedAssignment:
    """What the member's SyncGroup is answered after a JoinGroup that reported `owned`."""
    assigned = member.assigned
    if version < COOPERATIVE_VERSION:
        return AcceptedAssignment(member.member_epoch, version, assigned)
    return AcceptedAssignment(member.member_epoch, version, assigned - owned, owned - assigned)


def session_ms(change: GroupChange, member: Member) -> int:
    """How long the member's work is held after it is removed without leaving: its own session
    timeout (its agent fences itself after it), at least the group's fencing session."""
    own = member.classic.session_timeout_ms if member.classic is not None else 0
    return max(own, change.fencing_session_ms())


# --- JoinGroup -------------------------------------------------------------------------------


def translated_join(
    change: GroupChange,
    req: JoinGroupRequest,
    principal: str | None,
    new_member_id: str,
) -> Result[JoinGroupResponse | Parked]:
    """A JoinGroup to a connect group that may not change type (the module docstring)."""
    policy = change.config(MIGRATION_POLICY)
    if policy == MIGRATION_DISABLED:
        raise classic_join_refused(req.group_id, policy)
    if not req.member_id:
        if not new_member_id:
            raise ValueError("a JoinGroup without a member id needs a new member id to hand out")
        required: JoinGroupResponse | Parked = JoinGroupResponse(
            ErrorCode.MEMBER_ID_REQUIRED,
            "send JoinGroup again at once with this member id.",
            member_id=new_member_id,
        )
        return change.result(required)
    member = change.member(req.member_id)
    if member is not None:
        _check_bound(principal, member.principal, req.member_id)
        if member.classic is None:
            raise UnknownMemberId(
                f"member {req.member_id!r} of group {req.group_id!r} uses the connect protocol; "
                "join with an empty member id."
            )
        member = _rejoined(change, member, req, principal)
    else:
        hold = change.hold(req.member_id)
        if hold is not None:
            # A member removed with its work held (a missed deadline, a session expiry): as in
            # a classic group and Kafka, its id is gone. Admitting it anew would answer it
            # NONE, which restarts its worker's fencing clock while the hold keeps its old end.
            _check_bound(principal, hold.principal, req.member_id)
            raise UnknownMemberId(
                f"member {req.member_id!r} was removed from group {req.group_id!r}; stop your "
                "work and join with an empty member id."
            )
        member = _joined(change, req, principal)
    first = req.protocols[0]
    owned = owned_list(first)
    after = reconcile_member(change, member, owned)
    if after.state is MemberState.UNREVOKED:
        # A revocation the owned list already satisfies (an eager worker stopped everything
        # before it joined) is acknowledged in the same call, not by one more round.
        after = reconcile_member(change, after, owned)
    version = protocol_version(first.name) or 0
    assert after.classic is not None
    fixed = replace(
        after, classic=replace(after.classic, accepted=sync_answer_of(after, owned, version))
    )
    change.put_member(fixed)
    member_id = fixed.member_id
    now = change.now_ms
    change.schedule((SESSION, member_id), now + req.session_timeout_ms)
    change.schedule((CLASSIC_MEMBER_DEADLINE, member_id), now + req.rebalance_timeout_ms)
    answer: JoinGroupResponse | Parked = JoinGroupResponse(
        generation_id=fixed.member_epoch,
        protocol_type=PROTOCOL_TYPE,
        protocol_name=first.name,
        member_id=member_id,
    )
    return change.result(answer)


def _joined(change: GroupChange, req: JoinGroupRequest, principal: str | None) -> Member:
    """A new classic member at the assignment epoch (its arrival bumps the group epoch)."""
    if change.member_count() >= change.defaults.max_group_size:
        raise GroupMaxSizeReached(
            f"group {req.group_id!r} has reached its maximum of "
            f"{change.defaults.max_group_size} members (--max-group-size)."
        )
    epoch = change.target.assignment_epoch
    member = Member(
        member_id=req.member_id,
        member_epoch=epoch,
        url=req.protocols[0].metadata.url,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        assignors=assignors_of(req.protocols),
        principal=principal or "",
        stable_since_epoch=epoch,
        classic=ClassicMemberInfo(req.protocols, req.session_timeout_ms),
    )
    _check_covered(change, member, req.group_id)
    change.put_member(member)
    change.event(
        EventType.MEMBER_JOINED,
        member.member_id,
        instance_id=None,
        url=member.url,
        assignors=[a.name for a in member.assignors],
        group_protocol=GroupType.CLASSIC.value,
        protocols=[p.name for p in req.protocols],
        session_timeout_ms=req.session_timeout_ms,
    )
    change.bump_epoch("member joined", member_id=member.member_id)
    change.reselect_assignor()
    return member


def _rejoined(
    change: GroupChange, member: Member, req: JoinGroupRequest, principal: str | None
) -> Member:
    """An existing classic member's JoinGroup: its protocols, url and timeouts as sent; a
    change of protocol list bumps the group epoch (a url change does not)."""
    info = member.classic
    assert info is not None
    protocols_changed = info.protocol_names() != tuple(p.name for p in req.protocols)
    updated = replace(
        member,
        url=req.protocols[0].metadata.url,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        assignors=assignors_of(req.protocols),
        classic=replace(info, protocols=req.protocols, session_timeout_ms=req.session_timeout_ms),
    )
    if principal and not member.principal:
        updated = replace(updated, principal=principal)
    if protocols_changed:
        _check_covered(change, updated, req.group_id)
    if updated != member:
        change.put_member(updated)
    if protocols_changed:
        change.bump_epoch("member protocols changed", member_id=member.member_id)
        change.reselect_assignor()
    return updated


def _check_covered(change: GroupChange, member: Member, group_id: str) -> None:
    """INCONSISTENT_GROUP_PROTOCOL unless a connect-protocol member (or none yet) can compute
    for the group with this member in it."""
    selection = select_with(change.profiles(extra=member))
    if isinstance(selection, NoSelection):
        raise InconsistentGroupProtocol(
            f"member {member.member_id!r} cannot join group {group_id!r} with the protocols "
            f"{list(member.classic.protocol_names()) if member.classic else []}: "
            f"{selection.for_member()}."
        )


def _check_bound(principal: str | None, bound_to: str, member_id: str) -> None:
    if principal is not None and bound_to and bound_to != principal:
        raise GroupAuthorizationFailed(
            f"member id {member_id!r} belongs to another principal; join with an empty member id."
        )


# --- SyncGroup -------------------------------------------------------------------------------


def translated_sync(
    change: GroupChange, req: SyncGroupRequest, principal: str | None
) -> Result[SyncGroupResponse | Parked]:
    """A classic member's SyncGroup in a connect group: the answer its JoinGroup fixed."""
    member = _classic_member(change.member(req.member_id), req.member_id, req.group_id)
    _check_bound(principal, member.principal, req.member_id)
    if req.generation_id != member.member_epoch:
        raise IllegalGeneration(
            f"generation {req.generation_id} is not your member epoch ({member.member_epoch}); "
            "rejoin."
        )
    info = member.classic
    assert info is not None
    name = info.protocols[0].name
    if req.protocol_type is not None and req.protocol_type != PROTOCOL_TYPE:
        raise InconsistentGroupProtocol(f"the group's protocol type is {PROTOCOL_TYPE!r}.")
    if req.protocol_name is not None and req.protocol_name != name:
        raise InconsistentGroupProtocol(
            f"your JoinGroup was answered protocol {name!r}, not {req.protocol_name!r}."
        )
    change.schedule((SESSION, member.member_id), change.now_ms + info.session_timeout_ms)
    accepted = info.accepted
    if (
        (
            member.member_epoch < change.target.assignment_epoch
            and member.state is not MemberState.UNREVOKED
        )
        or accepted is None
        or accepted.generation != member.member_epoch
    ):
        raise RebalanceInProgress(REJOIN)
    change.cancel((CLASSIC_MEMBER_DEADLINE, member.member_id))
    answer = SyncGroupResponse(
        protocol_type=PROTOCOL_TYPE,
        protocol_name=name,
        lifecycle_revision=member.lifecycle_revision,
        assignment=ConnectWorkerAssignment(
            version=accepted.version,
            assignment=accepted.assignment,
            revoked=accepted.revoked,
            delay=0,
            tokens=member.tokens,
        ),
    )
    result: Result[SyncGroupResponse | Parked] = Result([], answer, list(change.timers))
    return result


# --- Heartbeat -------------------------------------------------------------------------------


def rejoin_needed(change: GroupChange, member: Member) -> bool:
    """Kafka's three conditions: behind the assignment epoch, UNREVOKED, or UNRELEASED with all
    it waits for free. O(what it waits for)."""
    if member.member_epoch < change.target.assignment_epoch:
        return True
    if member.state is MemberState.UNREVOKED:
        return True
    if member.state is MemberState.UNRELEASED:
        waiting = change.target.of(member.member_id).resources - member.assigned
        return change.free_for(member.member_id, waiting) == waiting
    return False


def translated_heartbeat(
    state: GroupState,
    req: ClassicHeartbeatRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    principal: str | None,
) -> Result[ClassicHeartbeatResponse]:
    """A classic member's Heartbeat in a connect group: never a record; its session renewed,
    and REBALANCE_IN_PROGRESS (its join deadline armed by the first) when it must rejoin."""
    change = GroupChange(state, req.group_id, now_ms, defaults)
    member = _classic_member(state.members.get(req.member_id), req.member_id, req.group_id)
    _check_bound(principal, member.principal, req.member_id)
    if req.generation_id != member.member_epoch:
        raise IllegalGeneration(
            f"generation {req.generation_id} is not your member epoch ({member.member_epoch}); "
            "rejoin."
        )
    assert member.classic is not None
    timers: list[TimerOp] = [
        ScheduleTimer((SESSION, member.member_id), now_ms + member.classic.session_timeout_ms)
    ]
    if rejoin_needed(change, member):
        timers.append(
            ScheduleTimer(
                (CLASSIC_MEMBER_DEADLINE, member.member_id),
                now_ms + member.rebalance_timeout_ms,
                unless_armed=True,
            )
        )
        response = ClassicHeartbeatResponse(
            ErrorCode.REBALANCE_IN_PROGRESS, REJOIN, member.lifecycle_revision
        )
        return Result([], response, timers)
    return Result(
        [], ClassicHeartbeatResponse(lifecycle_revision=member.lifecycle_revision), timers
    )


# --- LeaveGroup ------------------------------------------------------------------------------


def translated_leave(
    change: GroupChange, req: LeaveGroupRequest, principal: str | None
) -> Result[LeaveGroupResponse]:
    """Each listed classic member of the caller's leaves (no hold: it stopped its work)."""
    outcomes: list[LeftMember] = []
    first_removed: str | None = None
    for leaving in req.members:
        member_id = leaving.member_id
        member = change.member(member_id)
        if member is None or member.classic is None:
            outcomes.append(
                LeftMember(member_id, ErrorCode.UNKNOWN_MEMBER_ID, "no such classic member.")
            )
            continue
        if principal is not None and member.principal and member.principal != principal:
            outcomes.append(
                LeftMember(
                    member_id,
                    ErrorCode.GROUP_AUTHORIZATION_FAILED,
                    "a member leaves only for itself (this id belongs to another principal).",
                )
            )
            continue
        change.remove_member(member_id)
        _cancel_member_timers(change, member_id)
        change.event(
            EventType.MEMBER_LEFT,
            member_id,
            static=False,
            released=member.owned.payload(),
            reason=leaving.reason,
        )
        first_removed = first_removed or member_id
        outcomes.append(LeftMember(member_id))
    if first_removed is not None:
        change.bump_epoch("member left", member_id=first_removed)
        change.reselect_assignor()
    return change.result(LeaveGroupResponse(members=tuple(outcomes)))


# --- the deadline ----------------------------------------------------------------------------


def deadline_missed(change: GroupChange, member_id: str) -> None:
    """Its SyncGroup or JoinGroup did not come in time: removed as a revocation timeout removes
    a member, its work held until its agent has surely stopped it."""
    member = change.member(member_id)
    if member is None or member.classic is None:
        return
    until = change.now_ms + session_ms(change, member)
    change.remove_member(member_id)
    change.add_hold(member_id, member.owned, until, member.principal, member.instance_id)
    if member.owned:
        change.schedule((HOLD, member_id), until)
    _cancel_member_timers(change, member_id)
    change.event(
        EventType.MEMBER_FENCED,
        member_id,
        request_epoch=member.member_epoch,
        member_epoch=member.member_epoch,
        held=member.owned.payload(),
        held_until_ms=until,
        reason="missed its classic join or sync deadline",
    )
    change.bump_epoch("member missed its classic deadline", member_id=member_id)
    change.reselect_assignor()


def _cancel_member_timers(change: GroupChange, member_id: str) -> None:
    change.cancel((SESSION, member_id))
    change.cancel((REVOCATION, member_id))
    change.cancel((CLASSIC_MEMBER_DEADLINE, member_id))


def _classic_member(member: Member | None, member_id: str, group_id: str) -> Member:
    if member is None or member.classic is None:
        raise UnknownMemberId(
            f"member {member_id!r} is not a classic member of group {group_id!r}; join with an "
            "empty member id."
        )
    return member
