"""A classic group's timers (DESIGN 3.19, plan 3.7) and what a new owner arms after loading one.

Each expiry re-checks that it still applies (a late or superseded timer does nothing, or
re-arms itself when it fired early):
- CLASSIC_JOIN: a step of the initial delay, or the join barrier's deadline (GroupMetadataManager
  `tryCompleteInitialRebalanceElseSchedule`, `completeClassicGroupJoin`).
- CLASSIC_SYNC: members that never sent their SyncGroup removed with a hold and a new rebalance
  (`expirePendingSync`; GroupMetadataManagerTest
  `testRebalanceTimesOutWhenSyncRequestIsNotReceivedFromFollowers`, `...FromLeaders`).
- CLASSIC_PENDING: a MEMBER_ID_REQUIRED id lapses (`removePendingMemberAndUpdateClassicGroup`;
  `testJoinGroupCompletionWhenPendingMemberTimesOut`).
- SESSION: a member silent for its own session timeout removed without a hold, unless its
  JoinGroup or SyncGroup is parked and it is not new (ClassicGroupMember `hasSatisfiedHeartbeat`;
  `testNewMemberJoinExpiration`, `testClassicGroupMemberSessionTimeout`).
- REVOCATION: the revocation bound (DESIGN 3.19): removal with a hold, a new rebalance.
- HOLD: the hold ends; its resources are shown to the next leader after a new rebalance.
"""

from __future__ import annotations

from dataclasses import replace

from .change import GroupChange
from .classic_model import ClassicState, RoundDelta
from .classic_rebalance import (
    TAKEOVER_REASON,
    after_removal,
    classic_meta,
    complete_join,
    initial_delay_step,
    maybe_complete_join,
    prepare_rebalance,
    remove_member,
)
from .model import GroupConfigDefaults, GroupState, MemberState
from .records import ClassicRoundRecord, EventType, GroupMetaRecord, Record
from .results import (
    CLASSIC_JOIN,
    CLASSIC_PENDING,
    CLASSIC_SYNC,
    HOLD,
    REVOCATION,
    SESSION,
    Result,
    ScheduleTimer,
    TimerKey,
)


def on_classic_timer(
    state: GroupState, key: TimerKey, now_ms: int, defaults: GroupConfigDefaults
) -> Result[None]:
    """A timer of a classic group fired; its records, timers and wakeups."""
    kind, member_id = key
    change = GroupChange(state, state.group_id, now_ms, defaults)
    if kind == CLASSIC_JOIN:
        _join_deadline(change)
    elif kind == CLASSIC_SYNC:
        _sync_deadline(change)
    elif kind == CLASSIC_PENDING:
        _pending_lapsed(change, member_id)
    elif kind == SESSION:
        _session_expired(change, member_id)
    elif kind == REVOCATION:
        _revocation_timed_out(change, member_id)
    elif kind == HOLD:
        _hold_ended(change, member_id)
    return change.result(None)


def _due(change: GroupChange, key: TimerKey, deadline_ms: int) -> bool:
    """Whether a timer whose current deadline is `deadline_ms` is due; an early (stale) one
    is re-armed at it."""
    if change.now_ms < deadline_ms:
        change.schedule(key, deadline_ms)
        return False
    return True


def _join_deadline(change: GroupChange) -> None:
    if classic_meta(change).state is not ClassicState.PREPARING_REBALANCE:
        return
    if not _due(change, (CLASSIC_JOIN, ""), int(change.round.get("join_deadline_ms"))):
        return
    if change.round.initial:
        initial_delay_step(change)
    else:
        complete_join(change)


def _sync_deadline(change: GroupChange) -> None:
    state = classic_meta(change).state
    if state not in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE):
        return
    deadline = int(change.round.get("sync_deadline_ms"))
    if deadline == 0 or not _due(change, (CLASSIC_SYNC, ""), deadline):
        return
    change.set_round(sync_deadline_ms=0)
    missed = [m for m in sorted(change.round.awaiting_sync()) if change.member(m) is not None]
    for member_id in missed:
        member = change.member(member_id)
        assert member is not None
        remove_member(
            change, member, hold=True, event=EventType.MEMBER_FENCED, reason="sync_timeout"
        )
    if missed:
        prepare_rebalance(change, "sync timeout", missed[0], missed=missed)


def _pending_lapsed(change: GroupChange, pending_id: str) -> None:
    pending = change.round.pending(pending_id)
    if pending is None or not _due(change, (CLASSIC_PENDING, pending_id), pending.expires_at_ms):
        return
    change.drop_pending_id(pending_id)
    maybe_complete_join(change)


def _session_expired(change: GroupChange, member_id: str) -> None:
    member = change.member(member_id)
    if member is None or member.classic is None:
        return
    info, round_ = member.classic, change.round
    waiting = round_.has_joined(member_id) or round_.is_parked(member_id)
    if waiting and info.last_joined_generation > 0:
        change.schedule((SESSION, member_id), change.now_ms + info.session_timeout_ms)
        return
    remove_member(
        change,
        member,
        hold=False,
        event=EventType.MEMBER_SESSION_EXPIRED,
        static_left=False,
        released=member.owned.payload(),
    )
    after_removal(change, "member session expired", member_id)


def _revocation_timed_out(change: GroupChange, member_id: str) -> None:
    member = change.member(member_id)
    if member is None or member.classic is None or not member.pending_revocation:
        return
    remove_member(
        change,
        member,
        hold=True,
        event=EventType.REVOCATION_TIMED_OUT,
        unrevoked=member.pending_revocation.payload(),
    )
    after_removal(change, "member revocation timed out", member_id)


def _hold_ended(change: GroupChange, member_id: str) -> None:
    hold = change.release_hold(member_id)
    if hold is None:
        return
    if change.now_ms < hold.until_ms:  # a stale timer: keep the hold and re-arm
        change.add_hold(hold.member_id, hold.resources, hold.until_ms, hold.principal)
        change.schedule((HOLD, member_id), hold.until_ms)
        return
    change.event(EventType.HOLD_RELEASED, member_id, released=hold.resources.payload())
    if change.has_members():
        prepare_rebalance(change, "hold ended", None, held_member=member_id)


def classic_after_load(
    state: GroupState, now_ms: int, defaults: GroupConfigDefaults
) -> tuple[list[Record], list[ScheduleTimer]]:
    """What a new owner does with a classic group it loaded (DESIGN 3.19 "Takeover"): records
    to apply in memory (a group found PREPARING_REBALANCE or COMPLETING_REBALANCE is
    PREPARING_REBALANCE again, its barrier at the largest member rebalance timeout from now:
    the next generation follows the persisted one), and the timers to arm: sessions from now,
    revocation bounds for members with pending revocations, holds as persisted."""
    records: list[Record] = []
    timers: list[ScheduleTimer] = []
    classic = state.meta.classic
    if classic is not None and classic.state in (
        ClassicState.PREPARING_REBALANCE,
        ClassicState.COMPLETING_REBALANCE,
    ):
        preparing = replace(classic, state=ClassicState.PREPARING_REBALANCE)
        records.append(GroupMetaRecord(replace(state.meta, classic=preparing), False))
        rebalance_ms = max((m.rebalance_timeout_ms for m in state.members.values()), default=0)
        deadline = now_ms + rebalance_ms
        delta = RoundDelta(
            cleared=True,
            scalars={
                "reason": TAKEOVER_REASON,
                "started_at_ms": now_ms,
                "initial": False,
                "initial_remaining_ms": 0,
                "new_member_added": False,
                "leader_unavailable_reason": "",
                "join_deadline_ms": deadline,
                "sync_deadline_ms": 0,
                "takeover_from": classic.state.value,
            },
        )
        records.append(ClassicRoundRecord(state.group_id, delta))
        timers.append(ScheduleTimer((CLASSIC_JOIN, ""), deadline))
    for member in state.members.values():
        session = member.classic.session_timeout_ms if member.classic else 0
        timers.append(ScheduleTimer((SESSION, member.member_id), now_ms + session))
        if member.state is MemberState.UNREVOKED:
            timers.append(
                ScheduleTimer((REVOCATION, member.member_id), now_ms + member.rebalance_timeout_ms)
            )
    for hold in state.meta.holds:
        timers.append(ScheduleTimer((HOLD, hold.member_id), hold.until_ms))
    return records, timers
