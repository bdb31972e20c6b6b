"""Timer expiries (DESIGN 3.7, 3.10, 3.13, 3.20's automatic restarts): each re-checks that it
still applies, so a late or superseded timer does nothing. Also the timers to re-arm after a
group is loaded."""

from __future__ import annotations

from dataclasses import replace

from .auto_restarts import auto_restart_timers
from .change import GroupChange
from .classic_timers import classic_after_load, on_classic_timer
from .control import on_auto_restart_timer
from .conversion import maybe_downgrade
from .mixed_group import deadline_missed
from .model import GroupConfigDefaults, GroupState, MemberState
from .records import EventType
from .results import (
    ASSIGNOR,
    AUTO_RESTART,
    CLASSIC_MEMBER_DEADLINE,
    HOLD,
    REVOCATION,
    SCHEDULED_REBALANCE,
    SESSION,
    Result,
    ScheduleTimer,
    TimerKey,
)


def on_timer(
    state: GroupState, key: TimerKey, now_ms: int, defaults: GroupConfigDefaults
) -> Result[None]:
    if key[0] == AUTO_RESTART:  # groups of either type (DESIGN 3.20)
        change = GroupChange(state, state.group_id, now_ms, defaults)
        on_auto_restart_timer(change, key)
        return Result(change.records(), None, change.timers)
    if state.meta.is_classic:
        return on_classic_timer(state, key, now_ms, defaults)
    kind, member_id = key
    change = GroupChange(state, state.group_id, now_ms, defaults)
    if kind == SESSION:
        _session_expired(change, member_id)
    elif kind == REVOCATION:
        _revocation_timed_out(change, member_id)
    elif kind == ASSIGNOR:
        _assignor_timed_out(change)
    elif kind == SCHEDULED_REBALANCE:
        _scheduled_rebalance(change)
    elif kind == CLASSIC_MEMBER_DEADLINE:
        deadline_missed(change, member_id)
    elif kind == HOLD:
        hold = change.release_hold(member_id)
        if hold is not None and now_ms >= hold.until_ms:
            change.event(EventType.HOLD_RELEASED, member_id, released=hold.resources.payload())
        elif hold is not None:  # not due yet: a stale timer; keep the hold and re-arm
            change.add_hold(
                hold.member_id, hold.resources, hold.until_ms, hold.principal, hold.instance_id
            )
            change.schedule(key, hold.until_ms)
    return Result(change.records(), None, change.timers)


def _session_expired(change: GroupChange, member_id: str) -> None:
    member = change.member(member_id)
    if member is None:
        return
    change.remove_member(member_id)
    change.cancel((REVOCATION, member_id))
    change.event(
        EventType.MEMBER_SESSION_EXPIRED,
        member_id,
        static_left=member.state is MemberState.LEFT,
        released=member.owned.payload(),
    )
    change.bump_epoch("member session expired", member_id=member_id)
    change.reselect_assignor()
    maybe_downgrade(change, "last connect-protocol member's session expired")


def _revocation_timed_out(change: GroupChange, member_id: str) -> None:
    member = change.member(member_id)
    if member is None or member.state is not MemberState.UNREVOKED:
        return
    until = change.now_ms + change.fencing_session_ms()
    change.remove_member(member_id)
    change.add_hold(member_id, member.owned, until, member.principal, member.instance_id)
    change.schedule((HOLD, member_id), until)
    change.cancel((SESSION, member_id))
    change.event(
        EventType.REVOCATION_TIMED_OUT,
        member_id,
        unrevoked=member.pending_revocation.payload(),
        held=member.owned.payload(),
        held_until_ms=until,
    )
    change.bump_epoch("member revocation timed out", member_id=member_id)
    change.reselect_assignor()
    maybe_downgrade(change, "last connect-protocol member's revocation timed out")


def _assignor_timed_out(change: GroupChange) -> None:
    meta = change.meta
    if meta.compute_requested_epoch is None or change.group_epoch <= change.target.assignment_epoch:
        return
    chosen = meta.assignor_member_id
    change.event(
        EventType.ASSIGNOR_TIMED_OUT, chosen, requested_at_epoch=meta.compute_requested_epoch
    )
    excluded = meta.excluded_assignors | ({chosen} if chosen else set())
    change.set_meta(compute_requested_epoch=None, excluded_assignors=frozenset(excluded))
    change.reselect_assignor()


def _scheduled_rebalance(change: GroupChange) -> None:
    target = change.target
    at = target.scheduled_rebalance_at_ms
    if at is None:
        return
    if change.now_ms < at:
        change.schedule((SCHEDULED_REBALANCE, ""), at)
        return
    change.set_target(replace(target, scheduled_rebalance_at_ms=None))
    change.event(EventType.SCHEDULED_REBALANCE_FIRED, scheduled_at_ms=at)
    change.bump_epoch("scheduled rebalance fired")


def timers_after_load(
    state: GroupState, now_ms: int, defaults: GroupConfigDefaults
) -> list[ScheduleTimer]:
    """Timers to arm when a coordinator takes a group over: sessions start afresh (they live only
    in the owner's memory); persisted deadlines keep their time. A classic group's come from
    `classic_after_load` (whose records the loader applies in memory first)."""
    if state.meta.is_classic:
        return classic_after_load(state, now_ms, defaults)[1] + auto_restart_timers(state)
    session = state.fencing_session_ms(now_ms, defaults)
    timers: list[ScheduleTimer] = []
    for m in state.members.values():
        # A classic-protocol member's own session timeout (DESIGN 3.19).
        own = session if m.classic is None else m.classic.session_timeout_ms
        timers.append(ScheduleTimer((SESSION, m.member_id), now_ms + own))
        if m.state is MemberState.UNREVOKED:
            timers.append(ScheduleTimer((REVOCATION, m.member_id), now_ms + m.rebalance_timeout_ms))
    meta = state.meta
    if meta.compute_requested_epoch is not None and meta.assignor_member_id in state.members:
        timeout = state.members[meta.assignor_member_id].rebalance_timeout_ms
        timers.append(ScheduleTimer((ASSIGNOR, ""), now_ms + timeout))
    if state.target.scheduled_rebalance_at_ms is not None:
        timers.append(
            ScheduleTimer((SCHEDULED_REBALANCE, ""), state.target.scheduled_rebalance_at_ms)
        )
    for hold in meta.holds:
        timers.append(ScheduleTimer((HOLD, hold.member_id), hold.until_ms))
    return timers + auto_restart_timers(state)
