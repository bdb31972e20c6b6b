"""Classic JoinGroup (DESIGN 3.19; Kafka's GroupMetadataManagerTest names cited per test):
MEMBER_ID_REQUIRED ids bound to the principal and their lapse, request validation (no static
members, session bounds, protocols), and an existing member's JoinGroup per state."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from connect_protocol.errors import ErrorCode
from coordinator_svc.core.classic_model import ClassicState, GroupType
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import CLASSIC_PENDING, SESSION, Parked

from .classic_harness import EAGER, NEW_MEMBER_MS, SESSION_MS, ClassicHarness, given, rs


def test_an_empty_member_id_gets_member_id_required_with_an_id_bound_to_the_caller() -> None:
    h = ClassicHarness()
    first = h.join("", new_id="w1", principal="User:a")
    assert not isinstance(first, Parked)
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED and first.member_id == "w1"
    assert h.state is not None and h.state.meta.group_type is GroupType.CLASSIC
    assert h.classic_state is ClassicState.EMPTY and not h.state.members
    assert h.deadline((CLASSIC_PENDING, "w1")) == h.now_ms + SESSION_MS
    # Another principal cannot use the id (KIP-394 ids are bound to who asked, DESIGN 3.14).
    stolen = h.join("w1", principal="User:b")
    assert not isinstance(stolen, Parked)
    assert stolen.error_code == ErrorCode.GROUP_AUTHORIZATION_FAILED
    assert not h.state.members
    # The caller's JoinGroup with it makes it a member, parked until the phase completes.
    assert h.join("w1", principal="User:a") == Parked("join", "w1")
    assert h.member("w1").principal == "User:a"
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.deadline((CLASSIC_PENDING, "w1")) is None
    assert h.deadline((SESSION, "w1")) == h.now_ms + NEW_MEMBER_MS  # testNewMemberJoinExpiration
    (joined,) = h.logged_events(EventType.MEMBER_JOINED)
    assert joined.payload["group_protocol"] == "classic"
    assert joined.payload["protocols"] == ["sessioned", "compatible", "default"]


def test_a_pending_id_lapses_at_its_session_timeout_and_is_then_unknown() -> None:
    """GroupMetadataManagerTest testHeartbeatExpirationShouldRemovePendingMember."""
    h = ClassicHarness()
    h.join("", new_id="p1", session_ms=400)
    h.sleep(399)
    assert h.state is not None and h.state.round is not None
    assert "p1" in h.state.round.pending_ids
    h.sleep(1)
    assert "p1" not in h.state.round.pending_ids
    late = h.join("p1")
    assert not isinstance(late, Parked) and late.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert not h.state.members


def test_a_member_id_in_a_group_that_does_not_exist_is_unknown_and_creates_nothing() -> None:
    h = ClassicHarness()
    answer = h.join("w1")
    assert not isinstance(answer, Parked) and answer.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.state is None


@pytest.mark.parametrize("call", ["join", "sync", "heartbeat", "leave"])
def test_an_instance_id_is_refused_on_every_classic_call(call: str) -> None:
    h = ClassicHarness()
    h.form(["w1"])
    before = h.dump()
    if call == "join":
        answer = h.join("w1", instance_id="i-1")
    elif call == "sync":
        answer = h.sync("w1", instance_id="i-1")
    elif call == "heartbeat":
        answer = h.hb("w1", instance_id="i-1")
    else:
        answer = h.leave_group("w1", instance_id="i-1")
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.INVALID_REQUEST
    assert "GroupInstanceId" in answer.error_message
    assert h.records_of_last_call == [] and h.dump() == before


@pytest.mark.parametrize("session_ms", [99, 10_001])
def test_a_session_timeout_outside_the_bounds_is_invalid_session_timeout(session_ms: int) -> None:
    """GroupCoordinatorServiceTest testJoinGroupInvalidSessionTimeout."""
    h = ClassicHarness()
    answer = h.join("", new_id="w1", session_ms=session_ms)
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.INVALID_SESSION_TIMEOUT
    assert h.state is None


def test_unknown_protocols_and_wrong_versions_are_inconsistent_group_protocol() -> None:
    h = ClassicHarness()
    unknown = (ClassicProtocol("range", ConnectWorkerMetadata(0)),)
    wrong_version = (ClassicProtocol("compatible", ConnectWorkerMetadata(2)),)
    for listed in (unknown, wrong_version):
        answer = h.join("", new_id="w1", protocol_list=listed)
        assert not isinstance(answer, Parked)
        assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL, answer
    assert h.state is None


def test_a_member_sharing_no_protocol_with_the_group_is_refused() -> None:
    """GroupMetadataManagerTest testJoinGroupSecondJoinInconsistentProtocol."""
    h = ClassicHarness()
    h.form(["w1"], kind="default")
    only_sessioned = (ClassicProtocol("sessioned", ConnectWorkerMetadata(2)),)
    h.join("", new_id="w2", protocol_list=only_sessioned)
    answer = h.join("w2", protocol_list=only_sessioned)
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert not h.has_member("w2") and h.classic_state is ClassicState.STABLE
    # A worker listing `default` too is welcome (the eager member votes for it).
    assert isinstance(h.join("w2", kind="sessioned"), Parked)


def test_a_follower_rejoining_stable_unchanged_gets_the_current_generation_at_once() -> None:
    """GroupMetadataManagerTest testJoinGroupExistingMemberDoesNotTriggerRebalanceInStableState."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1", "w2"], {"w2": rs("A", "A-0")})
    generation = h.generation
    answer = h.join("w2", allocation=rs("A", "A-0"))
    # Its metadata changed (it now runs A): a rebalance.
    assert answer == Parked("join", "w2") and h.classic_state is ClassicState.PREPARING_REBALANCE
    h.join("w1", allocation=rs())
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    h.sync_all({})
    again = h.join("w2", allocation=rs("A", "A-0"))
    assert not isinstance(again, Parked)
    assert again.error_code == ErrorCode.NONE and again.generation_id == generation + 1
    assert again.leader == "w1" and again.members == ()
    assert h.classic_state is ClassicState.STABLE


def test_a_follower_rejoining_stable_after_releasing_its_work_starts_a_rebalance() -> None:
    """An eager follower (a worker that fenced itself while its SyncGroup was in flight, say)
    rejoins a STABLE group with unchanged metadata: its JoinGroup releases everything it held
    (version 0, DESIGN 3.19), so answering the current generation would let its SyncGroup be
    answered with the accepted share the coordinator no longer counts as its own: the worker
    would run work nobody holds. A rebalance starts instead (the released work is placed by
    the next generation). Found by bench/run-rebalance's classic-eager runs."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.form(["w1", "w2"], {"w1": rs("A"), "w2": rs("A-0")}, kind=EAGER)
    assert h.held("w2") == rs("A-0")
    answer = h.join("w2", kind=EAGER)
    assert answer == Parked("join", "w2")
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.held("w2") == rs()
    (started,) = h.last_events(EventType.CLASSIC_REBALANCE_STARTED)
    assert started.payload["reason"] == "member released its assignment"


def test_the_leader_rejoining_stable_starts_a_rebalance() -> None:
    """GroupMetadataManagerTest testJoinGroupAsExistingLeaderTriggersRebalanceInStableState."""
    h = ClassicHarness()
    h.form(["w1", "w2"])
    assert h.leader == "w1"
    assert h.join("w1", allocation=rs()) == Parked("join", "w1")
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    (started,) = h.last_events(EventType.CLASSIC_REBALANCE_STARTED)
    assert started.payload["reason"] == "leader rejoined" and started.member_id == "w1"


def test_a_rejoin_in_completing_with_unchanged_metadata_gets_the_generation_again() -> None:
    """A JoinGroup answer lost in COMPLETING_REBALANCE: asked again, answered again."""
    h = ClassicHarness()
    for name in ("w1", "w2"):
        h.new_member(name)
    h.sleep(500)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    answer = h.join("w1")
    assert not isinstance(answer, Parked)
    assert answer == replace(h.join_answer("w1"), coordinator_time_ms=h.now_ms)
    assert [m.member_id for m in answer.members] == ["w1", "w2"]
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE


def test_max_group_size_counts_members_and_pending_ids() -> None:
    from .classic_harness import CLASSIC_DEFAULTS

    h = ClassicHarness(defaults=replace(CLASSIC_DEFAULTS, max_group_size=2))
    h.new_member("w1")
    h.join("", new_id="p2")
    full = h.join("", new_id="p3")
    assert not isinstance(full, Parked) and full.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert isinstance(h.join("p2"), Parked)


def test_a_revocation_never_delivered_is_not_kept_pending_when_the_member_rejoins() -> None:
    """The leader's accepted assignment revokes A-0 from w2, but a new rebalance starts (a
    catalogue change) before w2's SyncGroup collects that answer: w2 was never told, still
    runs A-0 and reports it in its JoinGroup. The coordinator must count A-0 as w2's again,
    not as a revocation pending forever (no REVOCATION_REQUESTED was ever sent, so no bound
    runs and no later leader revokes it again: the group would stay STABLE with A-0 run by a
    worker and held by nobody). Found by the classic churn test under load."""
    h = ClassicHarness()
    h.put_connector("A", 2)
    h.form(["w1", "w2"], {"w1": rs("A"), "w2": rs("A-0", "A-1")})
    h.put_connector("B", 1)  # a rebalance: both rejoin with what they run
    h.rejoin_all()
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    leader = h.leader
    assert leader == "w1"
    h.sync("w1", {"w1": given(rs("B")), "w2": given(revoked=rs("A-0"))})
    assert h.classic_state is ClassicState.STABLE
    assert h.member("w2").pending_revocation == rs("A-0")  # accepted, not yet delivered
    h.put_connector("C", 1)  # the next rebalance, before w2's SyncGroup
    assert isinstance(h.join("w2", allocation=rs("A-0", "A-1")), Parked)
    w2 = h.member("w2")
    assert w2.pending_revocation == rs()
    assert w2.assigned == rs("A-0", "A-1")
    assert not [e for e in h.logged_events(EventType.REVOCATION_REQUESTED) if e.member_id == "w2"]
