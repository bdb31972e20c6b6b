"""Classic Heartbeat, LeaveGroup and session expiry (DESIGN 3.19; GroupMetadataManagerTest names
per test)."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import SESSION, Parked

from .classic_harness import NEW_MEMBER_MS, REBALANCE_MS, SESSION_MS, ClassicHarness, rs


def stable(*names: str) -> ClassicHarness:
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(names, {names[-1]: rs("A", "A-0")})
    return h


def test_a_steady_heartbeat_writes_nothing_and_re_arms_the_session() -> None:
    h = stable("w1", "w2")
    h.sleep(300)
    answer = h.hb("w2")
    assert answer.error_code == ErrorCode.NONE
    assert h.records_of_last_call == []
    assert h.deadline((SESSION, "w2")) == h.now_ms + SESSION_MS


def test_a_heartbeat_while_preparing_is_rebalance_in_progress() -> None:
    """GroupMetadataManagerTest testHeartbeatDuringPreparingRebalance."""
    h = stable("w1", "w2")
    h.new_member("w3")
    answer = h.hb("w2")
    assert answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.records_of_last_call == []
    assert h.deadline((SESSION, "w2")) == h.now_ms + SESSION_MS


def test_a_heartbeat_while_completing_is_none() -> None:
    """GroupMetadataManagerTest testHeartbeatDuringCompletingRebalance."""
    h = ClassicHarness()
    h.new_member("w1")
    h.sleep(REBALANCE_MS)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert h.hb("w1").error_code == ErrorCode.NONE


def test_a_heartbeat_of_another_generation_is_illegal_generation() -> None:
    """GroupMetadataManagerTest testHeartbeatIllegalGeneration."""
    h = stable("w1", "w2")
    assert h.hb("w2", generation=h.generation - 1).error_code == ErrorCode.ILLEGAL_GENERATION
    assert h.hb("w2", generation=h.generation + 1).error_code == ErrorCode.ILLEGAL_GENERATION


def test_a_heartbeat_from_an_unknown_member_or_a_pending_id_or_an_empty_group_is_unknown() -> None:
    """GroupMetadataManagerTest testHeartbeatUnknownGroup, testHeartbeatEmptyGroup."""
    h = ClassicHarness()
    assert h.hb("w1").error_code == ErrorCode.UNKNOWN_MEMBER_ID  # no group
    h.join("", new_id="p1")
    assert h.hb("p1").error_code == ErrorCode.UNKNOWN_MEMBER_ID  # pending, not a member
    assert h.classic_state is ClassicState.EMPTY
    h2 = stable("w1", "w2")
    assert h2.hb("w9").error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_heartbeat_from_another_principal_is_refused() -> None:
    h = ClassicHarness()
    h.new_member("w1", principal="User:a")
    assert h.hb("w1", principal="User:b").error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED


def test_leave_group_removes_the_callers_member_without_a_hold_and_rebalances() -> None:
    """GroupMetadataManagerTest testValidLeaveGroup (Departure: own members only)."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.new_member("w1", principal="User:a")
    h.new_member("w2", principal="User:b")
    h.sleep(REBALANCE_MS)
    h.sync_all({"w2": rs("A", "A-0")})
    other = h.leave_group("w2", principal="User:a")
    assert other.members[0].error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert h.has_member("w2") and h.classic_state is ClassicState.STABLE
    own = h.leave_group("w2", principal="User:b")
    assert own.error_code == ErrorCode.NONE and own.members[0].error_code == ErrorCode.NONE
    assert not h.has_member("w2")
    assert h.state is not None and h.state.meta.holds == ()
    (left,) = h.last_events(EventType.MEMBER_LEFT)
    assert left.payload["released"] == rs("A", "A-0").to_json()
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    unknown = h.leave_group("w9")
    assert unknown.members[0].error_code == ErrorCode.UNKNOWN_MEMBER_ID


def test_a_pending_id_may_leave_and_releases_the_barrier() -> None:
    """GroupMetadataManagerTest testPendingMembersLeaveGroup."""
    h = stable("w1", "w2")
    h.join("w1", allocation=rs())
    h.join("", new_id="p3")
    h.join("w2", allocation=rs("A", "A-0"))
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.leave_group("p3")
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE


def test_the_last_member_leaving_empties_the_group_with_a_new_generation() -> None:
    """ClassicGroupState: PREPARING_REBALANCE -> EMPTY when all left; the generation moves on
    (GroupMetadataManagerTest testGenerationIdIncrementsOnRebalance)."""
    h = stable("w1")
    generation = h.generation
    h.leave_group("w1")
    assert h.classic_state is ClassicState.EMPTY
    assert h.generation == generation + 1 and h.protocol is None and h.leader is None


def test_a_silent_member_expires_without_a_hold_and_a_rebalance_starts() -> None:
    """GroupMetadataManagerTest testClassicGroupMemberSessionTimeout."""
    h = stable("w1", "w2")
    h.run_for(SESSION_MS, "w1")
    assert not h.has_member("w2")
    (expired,) = h.logged_events(EventType.MEMBER_SESSION_EXPIRED)
    assert expired.member_id == "w2" and expired.payload["released"] == rs("A", "A-0").to_json()
    assert h.state is not None and h.state.meta.holds == ()
    assert h.classic_state is ClassicState.PREPARING_REBALANCE


def test_a_parked_join_keeps_a_known_member_but_not_a_new_one_past_its_join_timeout() -> None:
    """ClassicGroupMember hasSatisfiedHeartbeat; GroupMetadataManagerTest
    testNewMemberJoinExpiration: a new member's parked JoinGroup keeps it only until the
    new-member join timeout; a known member's keeps it."""
    h = stable("w1", "w2")
    # The leader rejoins and parks (a long rebalance timeout); w2 heartbeats, never rejoins.
    h.join("w1", allocation=rs(), rebalance_ms=5 * SESSION_MS)
    h.run_for(2 * SESSION_MS, "w2")
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.has_member("w1")  # parked, known: its session is re-armed
    assert h.deadline((SESSION, "w1")) == h.fired_at((SESSION, "w1")) + SESSION_MS
    # A new member parked in a phase that has not completed.
    g = ClassicHarness()
    g.new_member("n1")
    g.sleep(10)
    assert g.has_member("n1")
    g.fire((SESSION, "n1"))  # its join timeout (NEW_MEMBER_MS) is what fires
    assert not g.has_member("n1")
    assert g.answers[("join", "n1")].error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert NEW_MEMBER_MS > SESSION_MS


def test_a_parked_join_answered_unknown_member_when_its_member_leaves() -> None:
    h = stable("w1", "w2")
    assert h.join("w1", allocation=rs()) == Parked("join", "w1")
    h.leave_group("w1")
    assert h.answers[("join", "w1")].error_code == ErrorCode.UNKNOWN_MEMBER_ID
