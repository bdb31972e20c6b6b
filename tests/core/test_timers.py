"""Timer expiries (DESIGN 3.7, 3.10, 3.13) and re-arming timers after a load."""

from __future__ import annotations

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY
from coordinator_svc.core.model import GroupStatus, MemberState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import (
    ASSIGNOR,
    HOLD,
    REVOCATION,
    SCHEDULED_REBALANCE,
    SESSION,
    ScheduleTimer,
    TimerKey,
)
from coordinator_svc.core.timers import timers_after_load
from tests.core.harness import (
    ALL,
    DEFAULTS,
    INTERVAL_MS,
    REBALANCE_MS,
    SESSION_MS,
    W1_SHARE,
    W2_SHARE,
    GroupHarness,
    ok,
    rs,
    stable_group,
)

# --- session timeouts ------------------------------------------------------------------------


def test_a_silent_member_is_removed_when_its_session_expires_and_the_epoch_bumps() -> None:
    h = stable_group()
    last_heartbeat = h.now_ms

    h.run_for(SESSION_MS - 1, "w1", step_ms=50)
    assert h.has_member("w2")
    h.run_for(1, "w1")

    assert not h.has_member("w2")
    assert h.fired[-1] == (SESSION, "w2")
    assert h.now_ms == last_heartbeat + SESSION_MS
    assert h.group_epoch == 6
    assert h.state is not None
    assert h.state.meta.holds == ()  # released at once: the agent fenced itself before
    [expired] = h.logged_events(EventType.MEMBER_SESSION_EXPIRED)
    assert expired.member_id == "w2"


def test_a_member_that_keeps_heartbeating_never_expires() -> None:
    h = stable_group()

    h.run_for(10 * SESSION_MS, "w1", "w2")

    assert h.has_member("w1") and h.has_member("w2")
    assert h.group_epoch == 5


def test_when_the_assignor_members_session_expires_another_member_computes() -> None:
    h = stable_group()

    h.run_for(SESSION_MS, "w2")

    assert not h.has_member("w1")
    assert h.state is not None and h.state.meta.assignor_member_id == "w2"
    assert h.keepalive("w2").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_an_expired_members_resources_can_be_given_at_once() -> None:
    h = stable_group()
    h.run_for(SESSION_MS, "w1")
    h.compute("w1", {"w1": ALL})

    response = h.ack("w1")

    assert response.assignment is not None and response.assignment.resources == ALL
    assert h.status() is GroupStatus.STABLE


def test_the_last_members_expiry_leaves_an_empty_group_whose_target_follows_the_epoch() -> None:
    h = stable_group()

    h.sleep(SESSION_MS)

    assert h.state is not None
    assert h.state.members == {}
    assert h.group_epoch == h.assignment_epoch == 7
    assert h.status() is GroupStatus.EMPTY
    assert h.state.meta.assignor_member_id is None


# --- revocation timeouts ---------------------------------------------------------------------


def revoking_group() -> GroupHarness:
    """w3 joined; the target moves A-1 from w1 to w3; w1 was told to revoke A-1 at time t."""
    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")})
    h.keepalive("w1")
    assert h.member("w1").state is MemberState.UNREVOKED
    assert h.deadline((REVOCATION, "w1")) == h.now_ms + REBALANCE_MS
    return h


def test_a_member_that_does_not_revoke_in_time_is_removed_and_its_resources_held() -> None:
    h = revoking_group()
    asked_at = h.now_ms

    h.run_for(REBALANCE_MS, "w1", "w2", "w3", step_ms=50)

    assert not h.has_member("w1")
    assert h.fired[-1] == (REVOCATION, "w1")
    assert h.group_epoch == 7
    assert h.state is not None
    [hold] = h.state.meta.holds
    assert hold.member_id == "w1"
    assert hold.resources == W1_SHARE  # what it still ran: its share plus the unrevoked A-1
    assert hold.until_ms == asked_at + REBALANCE_MS + SESSION_MS
    assert h.deadline((HOLD, "w1")) == hold.until_ms
    assert h.deadline((SESSION, "w1")) is None
    [timed_out] = h.logged_events(EventType.REVOCATION_TIMED_OUT)
    assert timed_out.member_id == "w1"


def test_resources_held_after_a_revocation_timeout_are_given_only_once_the_hold_ends() -> None:
    h = revoking_group()
    h.run_for(REBALANCE_MS, "w2", "w3", step_ms=50)
    assert h.state is not None
    until = h.state.meta.holds[0].until_ms
    h.compute("w2", {"w2": W2_SHARE | rs("A"), "w3": rs("A-0", "A-1")})

    while h.now_ms < until - INTERVAL_MS:
        h.run_for(INTERVAL_MS, "w2", "w3")
        h.ack("w2")
        h.ack("w3")
        assert h.member("w2").assigned == W2_SHARE
        assert h.member("w3").assigned == EMPTY
    h.run_for(until - h.now_ms, "w2", "w3")

    assert h.state.meta.holds == ()
    assert h.member("w2").assigned == W2_SHARE | rs("A")
    assert h.member("w3").assigned == rs("A-0", "A-1")
    assert h.status() is GroupStatus.STABLE


def test_a_revocation_acknowledged_in_time_cancels_the_timeout() -> None:
    h = revoking_group()
    h.sleep(REBALANCE_MS - 1)
    h.heartbeat("w1", 5, owned=rs("A", "A-0"))

    h.run_for(10 * REBALANCE_MS, "w1", "w2", "w3")

    assert h.has_member("w1")
    assert h.member("w1").member_epoch == 6


# --- assignor timeouts -----------------------------------------------------------------------


def test_an_assignor_member_that_does_not_install_in_time_is_replaced() -> None:
    h = stable_group()
    h.join("w3")
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    requested_at = h.now_ms

    h.run_for(REBALANCE_MS, "w1", "w2", "w3", step_ms=50)

    assert (ASSIGNOR, "") in h.fired
    assert h.now_ms == requested_at + REBALANCE_MS
    assert h.state is not None
    assert h.state.meta.assignor_member_id == "w2"
    assert "w1" in h.state.meta.excluded_assignors
    assert h.keepalive("w1").error_code == ErrorCode.NONE
    assert h.keepalive("w2").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("w2", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})
    assert h.state.meta.excluded_assignors == frozenset()


def test_a_lone_assignor_member_that_times_out_is_asked_again() -> None:
    h = stable_group()
    h.leave("w2")
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT

    h.run_for(REBALANCE_MS, "w1")

    assert h.state is not None and h.state.meta.assignor_member_id == "w1"
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert h.state.meta.compute_requested_epoch == 6


# --- stale timers ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        pytest.param((SESSION, "w9"), id="session-of-a-member-that-is-gone"),
        pytest.param((REVOCATION, "w1"), id="revocation-of-a-member-with-nothing-to-revoke"),
        pytest.param((REVOCATION, "w9"), id="revocation-of-a-member-that-is-gone"),
        pytest.param((ASSIGNOR, ""), id="assignor-with-nothing-to-compute"),
        pytest.param((SCHEDULED_REBALANCE, ""), id="scheduled-rebalance-not-pending"),
        pytest.param((HOLD, "w9"), id="hold-already-released"),
    ],
)
def test_a_stale_timer_does_nothing(key: TimerKey) -> None:
    h = stable_group()
    before = h.dump()

    h.fire(key)

    assert h.records_of_last_call == []
    assert h.dump() == before


def test_a_stale_assignor_timer_after_an_install_does_nothing() -> None:
    h = stable_group()
    h.join("w3")
    h.keepalive("w1")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})
    before = h.dump()

    h.fire((ASSIGNOR, ""))

    assert h.records_of_last_call == []
    assert h.dump() == before


def test_a_scheduled_rebalance_timer_firing_early_rearms_itself() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")
    h.install("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY}, delay_ms=400)
    before = h.dump()
    h.timers.pop((SCHEDULED_REBALANCE, ""))

    h.fire((SCHEDULED_REBALANCE, ""))

    assert h.records_of_last_call == []
    assert h.dump() == before
    assert h.deadline((SCHEDULED_REBALANCE, "")) == h.now_ms + 400


def test_a_hold_timer_firing_early_keeps_the_hold_and_rearms_itself() -> None:
    h = stable_group()
    h.heartbeat("w2", 99, owned=W2_SHARE)
    before = h.dump()
    h.sleep(10)

    h.fire((HOLD, "w2"))

    assert h.dump() == before
    assert h.deadline((HOLD, "w2")) == h.now_ms - 10 + SESSION_MS


def test_a_timer_for_a_group_that_was_never_created_does_nothing() -> None:
    h = GroupHarness()

    h.fire((SESSION, "w1"))

    assert h.state is None


# --- timers after a load ---------------------------------------------------------------------


def test_timers_after_load_rearm_sessions_revocations_the_assignor_delays_and_holds() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")
    h.install("w1", {"w1": rs("A", "A-0"), "w2": rs("B"), "w3": rs("A-1")}, delay_ms=MAX_DELAY)
    h.keepalive("w1")  # w1 is told to revoke A-1: UNREVOKED
    h.heartbeat("w2", 99, owned=W2_SHARE)  # fenced: B, B-0 held
    h.keepalive("w1")  # COMPUTE_ASSIGNMENT requested
    assert h.state is not None
    scheduled_at = h.state.target.scheduled_rebalance_at_ms
    hold_until = h.state.meta.holds[0].until_ms
    loaded_at = h.now_ms + 5_000

    timers = timers_after_load(h.state, loaded_at, DEFAULTS)

    assert sorted(timers, key=lambda t: t.key) == sorted(
        [
            ScheduleTimer((SESSION, "w1"), loaded_at + SESSION_MS),
            ScheduleTimer((SESSION, "w3"), loaded_at + SESSION_MS),
            ScheduleTimer((REVOCATION, "w1"), loaded_at + REBALANCE_MS),
            ScheduleTimer((ASSIGNOR, ""), loaded_at + REBALANCE_MS),
            ScheduleTimer((SCHEDULED_REBALANCE, ""), scheduled_at or -1),
            ScheduleTimer((HOLD, "w2"), hold_until),
        ],
        key=lambda t: t.key,
    )


def test_timers_after_load_use_the_groups_own_session_timeout() -> None:
    h = stable_group()
    h.alter_configs({"session.timeout.ms": "7000"})
    assert h.state is not None

    timers = timers_after_load(h.state, 100, DEFAULTS)

    assert set(timers) == {
        ScheduleTimer((SESSION, "w1"), 7_100),
        ScheduleTimer((SESSION, "w2"), 7_100),
    }


def test_timers_after_load_of_a_quiet_group_are_only_sessions() -> None:
    h = stable_group()
    assert h.state is not None

    timers = timers_after_load(h.state, 0, DEFAULTS)

    assert {t.key for t in timers} == {(SESSION, "w1"), (SESSION, "w2")}


MAX_DELAY = 2_000


# --- lowering session.timeout.ms ------------------------------------------------------------


def test_lowering_the_session_timeout_keeps_the_old_one_for_expiry_until_everyone_knows() -> None:
    """Members fence themselves by the timeout their last answer told them: after it is lowered,
    a member whose answers are lost still runs its work for the old timeout, so the coordinator
    must not expire it (and hand its work on) any sooner, until the old timeout has passed."""
    h = stable_group()
    lowered = SESSION_MS // 4
    lowered_at = h.now_ms
    ok(h.alter_configs({"session.timeout.ms": str(lowered)}))
    assert h.state is not None
    assert (h.state.meta.session_floor_ms, h.state.meta.session_floor_until_ms) == (
        SESSION_MS,
        lowered_at + SESSION_MS,
    )

    answer = h.keepalive("w2")  # its answer is lost: w2 still believes SESSION_MS
    assert answer.session_timeout_ms == lowered
    assert h.deadline((SESSION, "w2")) == h.now_ms + SESSION_MS
    h.run_for(SESSION_MS - 1, "w1", step_ms=lowered // 4)
    assert h.has_member("w2"), "expired before w2 can have fenced itself"
    h.run_for(1, "w1")
    assert not h.has_member("w2")

    # Once the old timeout has passed everyone has heard the new one (or stopped): it applies.
    h.keepalive("w1")
    assert h.deadline((SESSION, "w1")) == h.now_ms + lowered


def test_raising_the_session_timeout_applies_at_once() -> None:
    h = stable_group()
    ok(h.alter_configs({"session.timeout.ms": str(SESSION_MS * 2)}))
    assert h.state is not None and h.state.meta.session_floor_ms == 0
    h.keepalive("w1")
    assert h.deadline((SESSION, "w1")) == h.now_ms + 2 * SESSION_MS


def test_a_member_fenced_after_the_timeout_was_lowered_is_held_for_the_old_one() -> None:
    h = stable_group()
    ok(h.alter_configs({"session.timeout.ms": str(SESSION_MS // 4)}))
    owned = h.member("w2").owned
    resp = h.heartbeat("w2", h.member("w2").member_epoch + 7)  # a bad epoch: fenced
    assert resp.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert h.state is not None
    [hold] = h.state.meta.holds
    assert (hold.member_id, hold.resources, hold.until_ms) == ("w2", owned, h.now_ms + SESSION_MS)


def test_timers_after_load_use_the_old_timeout_while_it_may_still_be_believed() -> None:
    h = stable_group()
    ok(h.alter_configs({"session.timeout.ms": str(SESSION_MS // 4)}))
    assert h.state is not None
    timers = timers_after_load(h.state, h.now_ms, DEFAULTS)
    assert ScheduleTimer((SESSION, "w1"), h.now_ms + SESSION_MS) in timers
    later = h.now_ms + SESSION_MS
    assert ScheduleTimer((SESSION, "w1"), later + SESSION_MS // 4) in timers_after_load(
        h.state, later, DEFAULTS
    )
