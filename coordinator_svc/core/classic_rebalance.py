"""The classic group's rebalance (DESIGN 3.19): entering PREPARING_REBALANCE, the join barrier with
the initial delay, completing the join phase into a new generation (leader, protocol vote, the
answers to the parked JoinGroups), and removing a member with or without a hold.

Behaviour as Kafka's GroupMetadataManager documents it (`prepareRebalance`,
`maybeCompleteJoinElseSchedule`, `tryCompleteInitialRebalanceElseSchedule`,
`completeClassicGroupJoin`; ClassicGroup `selectProtocol`, `maybeElectNewJoinedLeader`), with
this coordinator's Departures: the generation is persisted at completion, before any answer;
the leader is the previous one if it rejoined, else the earliest to join this phase, among
`assignor.principals`; the vote's ties go to the lowest name; members that did not rejoin are
removed with a hold (DESIGN 3.13). Every function works on a `GroupChange` of a classic group
and changes it through its writes (records, timers, wakeups, the round).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from connect_protocol.classic_messages import (
    PROTOCOL_TYPE,
    JoinGroupMember,
    JoinGroupResponse,
    SyncGroupResponse,
)
from connect_protocol.configs import SCHEDULED_REBALANCE_MAX_DELAY
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import ConnectorInfo
from connect_protocol.resources import EMPTY, ResourceSet, union

from .change import GroupChange
from .classic_model import ClassicGroupMeta, ClassicState
from .model import Connector, Member
from .records import EventType
from .results import (
    CLASSIC_JOIN,
    CLASSIC_SYNC,
    HOLD,
    REVOCATION,
    SESSION,
    WAKE_JOIN,
    WAKE_SYNC,
)

_NO_CONFIG: MappingProxyType[str, str] = MappingProxyType({})

#: Why a group found PREPARING_REBALANCE or COMPLETING_REBALANCE at load rebalances again.
TAKEOVER_REASON = "coordinator takeover"

REBALANCING = (
    "the group is rebalancing: send JoinGroup again with your member id to join the next "
    "generation."
)


# --- the classic part of the group's metadata ---------------------------------------------


def classic_meta(change: GroupChange) -> ClassicGroupMeta:
    """The group's classic metadata as this change leaves it."""
    return change.meta.classic or ClassicGroupMeta()


def set_classic(change: GroupChange, **fields: Any) -> None:
    change.set_meta(classic=replace(classic_meta(change), **fields))


def max_rebalance_timeout(change: GroupChange) -> int:
    """The group's rebalance timeout: the largest of its members' (Kafka's ClassicGroup
    `rebalanceTimeoutMs`). O(members): asked once per phase."""
    return max((m.rebalance_timeout_ms for m in change.members().values()), default=0)


def _arm_join(change: GroupChange, deadline_ms: int) -> None:
    change.set_round(join_deadline_ms=deadline_ms)
    change.schedule((CLASSIC_JOIN, ""), deadline_ms)


# --- entering the join phase ----------------------------------------------------------------


def prepare_rebalance(
    change: GroupChange, reason: str, member_id: str | None = None, **details: Any
) -> None:
    """Start a rebalance: parked SyncGroups answered REBALANCE_IN_PROGRESS (wakeups), the sync
    deadline cancelled, state PREPARING_REBALANCE, CLASSIC_REBALANCE_STARTED (`reason`,
    `generation`, `from_state`, `details`; `member_id` the trigger), then from EMPTY the
    initial delay (`classic_initial_rebalance_delay_ms`), else the barrier completed at once or
    armed at the largest member rebalance timeout (timer CLASSIC_JOIN). Does nothing more than
    record the reason when the group is already PREPARING_REBALANCE (Kafka's ClassicGroup
    `canRebalance`), and nothing at all for an EMPTY group without members."""
    from_state = classic_meta(change).state
    if from_state is ClassicState.PREPARING_REBALANCE:
        change.set_round(reason=reason)
        return
    if from_state is ClassicState.EMPTY and not change.has_members():
        return
    for parked in sorted(change.round.parked_sync()):
        change.wake(WAKE_SYNC, parked, rebalance_in_progress_sync())
    change.cancel((CLASSIC_SYNC, ""))
    change.clear_round()
    set_classic(change, state=ClassicState.PREPARING_REBALANCE)
    change.set_round(
        reason=reason,
        started_at_ms=change.now_ms,
        new_member_added=False,
        leader_unavailable_reason="",
        sync_deadline_ms=0,
    )
    change.event(
        EventType.CLASSIC_REBALANCE_STARTED,
        member_id,
        reason=reason,
        generation=change.group_epoch,
        from_state=from_state.value,
        **details,
    )
    rebalance_ms = max_rebalance_timeout(change)
    if from_state is ClassicState.EMPTY:
        # GroupMetadataManager `prepareRebalance` from EMPTY: the initial delay first, then
        # steps of at most the delay while members keep arriving, up to the rebalance timeout.
        delay = change.defaults.classic_initial_rebalance_delay_ms
        change.set_round(initial=True, initial_remaining_ms=max(rebalance_ms - delay, 0))
        _arm_join(change, change.now_ms + delay)
        return
    change.set_round(initial=False, initial_remaining_ms=0)
    _arm_join(change, change.now_ms + rebalance_ms)
    maybe_complete_join(change)


def all_joined(change: GroupChange) -> bool:
    """Every member has rejoined and no MEMBER_ID_REQUIRED id is outstanding (Kafka's
    ClassicGroup `hasAllMembersJoined`). O(what this change touched)."""
    round_ = change.round
    return round_.pending_count() == 0 and round_.joined_count() >= change.member_count()


def maybe_complete_join(change: GroupChange) -> None:
    """Complete the join phase if every member and every pending id has joined (and the
    initial delay is not running); otherwise leave the barrier armed."""
    if classic_meta(change).state is not ClassicState.PREPARING_REBALANCE:
        return
    if change.round.initial or not all_joined(change):
        return
    complete_join(change)


def initial_delay_step(change: GroupChange) -> None:
    """The initial delay's timer fired (GroupMetadataManager
    `tryCompleteInitialRebalanceElseSchedule`): if a member joined meanwhile and time is left,
    wait another step of at most the delay; else the join phase completes."""
    round_ = change.round
    remaining = round_.initial_remaining_ms
    if round_.new_member_added and remaining > 0:
        step = min(change.defaults.classic_initial_rebalance_delay_ms, remaining)
        change.set_round(new_member_added=False, initial_remaining_ms=remaining - step)
        _arm_join(change, change.now_ms + step)
        return
    change.set_round(initial=False, initial_remaining_ms=0, new_member_added=False)
    complete_join(change)


# --- completing it --------------------------------------------------------------------------


def complete_join(change: GroupChange) -> None:
    """End the join phase: members that did not rejoin removed with a hold (MEMBER_FENCED,
    reason join_timeout), the leader elected (the previous one if it rejoined, else the
    earliest to join, among `assignor.principals`), the protocol voted (ties to the lowest
    name), the generation (group epoch) bumped and persisted before any answer,
    CLASSIC_JOIN_COMPLETED, COMPLETING_REBALANCE with everyone awaiting sync (timer
    CLASSIC_SYNC), and each joined member's parked JoinGroup answered (wakeups). With no
    member left: a new generation with no protocol, state EMPTY."""
    joined = change.round.joined()
    members = change.members()
    in_order = sorted(joined, key=joined.__getitem__)
    if members and not in_order:
        # Nobody rejoined: the phase is extended, nobody removed (GroupMetadataManagerTest
        # testCompleteJoinPhaseNoMembersRejoinedExtendsJoinPhase).
        _arm_join(change, change.now_ms + max_rebalance_timeout(change))
        return
    leader = _elect_leader(change, in_order, members)
    if in_order and leader is None:
        return  # stays PREPARING_REBALANCE, re-armed, with the reason shown
    _record_takeover_start(change)
    removed = sorted(m for m in members if m not in joined)
    for member_id in removed:
        remove_member(
            change,
            members[member_id],
            hold=True,
            event=EventType.MEMBER_FENCED,
            reason="join_timeout",
        )
    generation = change.group_epoch + 1
    change.set_meta(group_epoch=generation)
    change.set_target(replace(change.target, assignment_epoch=generation), ())
    change.cancel((CLASSIC_JOIN, ""))
    change.clear_round()
    change.set_round(
        initial=False,
        initial_remaining_ms=0,
        new_member_added=False,
        leader_unavailable_reason="",
        join_deadline_ms=0,
        takeover_from="",
    )
    if not in_order:
        set_classic(change, state=ClassicState.EMPTY, protocol_name=None, leader_id=None)
        change.set_round(sync_deadline_ms=0)
        change.event(
            EventType.CLASSIC_JOIN_COMPLETED,
            None,
            generation=generation,
            leader=None,
            protocol=None,
            members=[],
            removed=removed,
            withheld=EMPTY.payload(),
        )
        return
    protocol = vote(members[m] for m in in_order)
    set_classic(
        change, state=ClassicState.COMPLETING_REBALANCE, protocol_name=protocol, leader_id=leader
    )
    sync_ms = 0
    for member_id in in_order:
        member = members[member_id]
        info = member.classic
        assert info is not None, "a classic group has classic members only"
        change.put_member(
            replace(
                member,
                member_epoch=generation,
                previous_epoch=member.member_epoch,
                classic=replace(info, last_joined_generation=generation),
            )
        )
        change.schedule((SESSION, member_id), change.now_ms + info.session_timeout_ms)
        sync_ms = max(sync_ms, member.rebalance_timeout_ms)
    change.set_sync_sets(awaiting=in_order)
    change.set_round(sync_deadline_ms=change.now_ms + sync_ms)
    change.schedule((CLASSIC_SYNC, ""), change.now_ms + sync_ms)
    _, withheld = shown_catalogue(change)
    change.event(
        EventType.CLASSIC_JOIN_COMPLETED,
        leader,
        generation=generation,
        leader=leader,
        protocol=protocol,
        members=in_order,
        removed=removed,
        withheld=withheld.payload(),
    )
    for member_id in in_order:
        change.wake(WAKE_JOIN, member_id, join_answer(change, member_id))


def _record_takeover_start(change: GroupChange) -> None:
    """A join phase this process started by loading the group (`classic_after_load`: the load
    writes nothing) is recorded when it completes, as the rebalance's CLASSIC_REBALANCE_STARTED
    at the generation it follows (reason `coordinator takeover`, `from_state` the state loaded),
    so that the audit names why the generation began. A group loaded in PREPARING_REBALANCE
    already has its previous owner's event at that generation; the findings take the first."""
    loaded_in = change.round.get("takeover_from")
    if not loaded_in:
        return
    change.event(
        EventType.CLASSIC_REBALANCE_STARTED,
        None,
        reason=TAKEOVER_REASON,
        generation=change.group_epoch,
        from_state=loaded_in,
    )


def _elect_leader(
    change: GroupChange, in_order: list[str], members: dict[str, Member]
) -> str | None:
    """The previous leader if it rejoined, else the earliest to rejoin; only members of
    `assignor.principals` qualify (DESIGN 3.4). None when no one qualifies: the phase is
    re-armed and the reason recorded."""
    if not in_order:
        return None
    allowed = change.assignor_principals()
    eligible = [m for m in in_order if allowed is None or members[m].principal in allowed]
    if not eligible:
        reason = (
            "no member that rejoined belongs to assignor.principals "
            f"({', '.join(sorted(allowed or ()))}); waiting for one to join"
        )
        change.set_round(leader_unavailable_reason=reason)
        _arm_join(change, change.now_ms + max_rebalance_timeout(change))
        return None
    previous = classic_meta(change).leader_id
    return previous if previous in eligible else eligible[0]


def vote(members: Iterable[Member]) -> str:
    """Kafka's ClassicGroup `selectProtocol`: the candidates are the protocols every member
    supports; each member votes for the first candidate it lists; most votes wins, ties to
    the lowest name (Departure: Kafka's tie follows hash-map order)."""
    listed = [m.classic.protocol_names() for m in members if m.classic is not None]
    candidates = set(listed[0]).intersection(*listed[1:]) if listed else set()
    if not candidates:
        raise AssertionError("joins are refused unless a protocol is shared by every member")
    votes = Counter(next(n for n in names if n in candidates) for names in listed)
    return min(votes, key=lambda name: (-votes[name], name))


def shown_catalogue(change: GroupChange) -> tuple[tuple[Connector, ...], ResourceSet]:
    """What the leader is shown: the catalogue's connectors (names, task counts) in name order,
    and the resources withheld from it because a hold keeps them (DESIGN 3.13, 3.19)."""
    connectors = tuple(sorted(change.catalogue().values(), key=lambda c: c.name))
    holds = change.meta.holds
    if not holds:
        return connectors, EMPTY
    return connectors, change.catalogue_resources() & union(h.resources for h in holds)


def join_answer(change: GroupChange, member_id: str) -> JoinGroupResponse:
    """The JoinGroup answer of the current generation for `member_id`: the leader's also
    carries every member's metadata for the chosen protocol (by member id), the catalogue it
    may assign (names and task counts, never configs), what a hold withholds, the group
    configurations a leader uses and the coordinator's clock."""
    meta = classic_meta(change)
    protocol = meta.protocol_name or ""
    answer = JoinGroupResponse(
        generation_id=change.group_epoch,
        protocol_type=PROTOCOL_TYPE,
        protocol_name=protocol,
        leader=meta.leader_id or "",
        member_id=member_id,
    )
    if member_id != meta.leader_id:
        return answer
    generation = sorted(
        (m for m in change.members().values() if m.member_epoch == change.group_epoch),
        key=lambda m: m.member_id,
    )
    shown: list[JoinGroupMember] = []
    for m in generation:
        chosen = None if m.classic is None else m.classic.protocol(protocol)
        if chosen is not None:
            shown.append(JoinGroupMember(m.member_id, chosen.metadata))
    connectors, withheld = shown_catalogue(change)
    return replace(
        answer,
        members=tuple(shown),
        catalogue=tuple(
            ConnectorInfo(c.name, c.effective_task_count, _NO_CONFIG) for c in connectors
        ),
        withheld=withheld,
        group_configs={
            SCHEDULED_REBALANCE_MAX_DELAY.name: str(change.config(SCHEDULED_REBALANCE_MAX_DELAY))
        },
        coordinator_time_ms=change.now_ms,
    )


def rebalance_in_progress_sync() -> SyncGroupResponse:
    return SyncGroupResponse(ErrorCode.REBALANCE_IN_PROGRESS, REBALANCING)


def unknown_member_join(member_id: str) -> JoinGroupResponse:
    return JoinGroupResponse(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} was removed from the group; rejoin with an empty member id.",
        member_id=member_id,
    )


# --- removing members -----------------------------------------------------------------------


def remove_member(
    change: GroupChange,
    member: Member,
    *,
    hold: bool,
    event: EventType,
    **payload: Any,
) -> None:
    """Remove a classic member: its parked calls answered UNKNOWN_MEMBER_ID, its timers
    cancelled, it leaves the round; with `hold`, what it owns goes to no one until its own
    session timeout has passed (DESIGN 3.13: the hold starts at removal, no earlier than the
    last answer sent to it). `event` is recorded with `payload` (and `held`,
    `held_until_ms` when held)."""
    member_id = member.member_id
    change.remove_member(member_id)
    change.cancel((SESSION, member_id))
    change.cancel((REVOCATION, member_id))
    round_ = change.round
    if round_.has_joined(member_id):
        round_.unjoin(member_id)
        change.wake(WAKE_JOIN, member_id, unknown_member_join(member_id))
    if round_.is_parked(member_id):
        change.set_sync_sets(unparked=[member_id])
        change.wake(
            WAKE_SYNC,
            member_id,
            SyncGroupResponse(ErrorCode.UNKNOWN_MEMBER_ID, "you were removed from the group."),
        )
    if round_.is_awaiting_sync(member_id):
        change.set_sync_sets(synced=[member_id])
    if hold:
        session = member.classic.session_timeout_ms if member.classic else 0
        until = change.now_ms + session
        change.add_hold(member_id, member.owned, until, member.principal)
        if member.owned:
            change.schedule((HOLD, member_id), until)
        payload = {**payload, "held": member.owned.payload(), "held_until_ms": until}
    change.event(event, member_id, **payload)


def after_removal(change: GroupChange, reason: str, member_id: str | None) -> None:
    """What a removal starts: in PREPARING_REBALANCE the barrier may now be complete; in
    COMPLETING_REBALANCE or STABLE a new rebalance (GroupMetadataManager
    `removeMemberAndUpdateClassicGroup`)."""
    if classic_meta(change).state is ClassicState.PREPARING_REBALANCE:
        maybe_complete_join(change)
    else:
        prepare_rebalance(change, reason, member_id)
