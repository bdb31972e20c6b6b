"""The classic join barrier (DESIGN 3.19; GroupMetadataManagerTest names per test): completing
when everyone is in, timing out with the silent members removed under a hold, pending ids
holding it, the initial delay, the protocol vote and the leader election."""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.classic_messages import ClassicProtocol, ConnectWorkerMetadata
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import CLASSIC_JOIN, HOLD, Parked

from .classic_harness import (
    CLASSIC_DEFAULTS,
    DELAY_MS,
    REBALANCE_MS,
    SESSION_MS,
    ClassicHarness,
    rs,
)


def stable_pair() -> ClassicHarness:
    """w1 (leader) runs A and A-0, w2 runs B and B-0: STABLE."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.put_connector("B", 1)
    h.form(["w1", "w2"], {"w1": rs("A", "A-0"), "w2": rs("B", "B-0")})
    return h


def test_the_barrier_completes_at_once_when_every_member_has_joined() -> None:
    """GroupMetadataManagerTest testJoinGroupCompletionWhenPendingMemberJoins (no pending)."""
    h = stable_pair()
    generation = h.generation
    assert isinstance(h.new_member("w3"), Parked)
    h.join("w1", allocation=rs("A", "A-0"))
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    answer = h.join("w2", allocation=rs("B", "B-0"))
    # The last one in completes the phase: its own answer comes back at once.
    assert not isinstance(answer, Parked) and answer.generation_id == generation + 1
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert h.generation == generation + 1
    assert h.join_answer("w1").generation_id == generation + 1
    assert h.join_answer("w3").leader == "w1"
    assert h.deadline((CLASSIC_JOIN, "")) is None
    (completed,) = h.last_events(EventType.CLASSIC_JOIN_COMPLETED)
    assert completed.group_epoch == generation + 1
    assert completed.payload["members"] == ["w3", "w1", "w2"] and completed.payload["removed"] == []


def test_the_barrier_times_out_and_removes_the_silent_member_with_a_hold() -> None:
    """GroupMetadataManagerTest testCompleteJoinRemoveNotYetRejoinedDynamicMembers."""
    h = stable_pair()
    generation = h.generation
    h.new_member("w3")
    h.join("w1", allocation=rs("A", "A-0"))
    h.sleep(REBALANCE_MS - 1)
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.run_for(1)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert not h.has_member("w2")
    (fenced,) = h.logged_events(EventType.MEMBER_FENCED)
    assert fenced.member_id == "w2" and fenced.payload["reason"] == "join_timeout"
    assert fenced.group_epoch == generation  # before the bump: its loss is the next row's
    hold = h.state.meta.holds[0] if h.state else None
    assert hold is not None and hold.resources == rs("B", "B-0")
    assert hold.until_ms == h.now_ms + SESSION_MS
    assert h.deadline((HOLD, "w2")) == hold.until_ms
    assert h.join_answer("w1").withheld == rs("B", "B-0")


def test_a_phase_nobody_rejoined_is_extended_not_emptied() -> None:
    """GroupMetadataManagerTest testCompleteJoinPhaseNoMembersRejoinedExtendsJoinPhase."""
    h = stable_pair()
    h.leave_group("w2")  # a rebalance; w1 does not rejoin in time
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.sleep(REBALANCE_MS)
    assert h.classic_state is ClassicState.PREPARING_REBALANCE and h.has_member("w1")
    assert h.deadline((CLASSIC_JOIN, "")) == h.now_ms + REBALANCE_MS


def test_a_pending_id_holds_the_barrier_until_it_joins() -> None:
    """GroupMetadataManagerTest testJoinGroupCompletionWhenPendingMemberJoins."""
    h = stable_pair()
    h.join("w1", allocation=rs("A", "A-0"))  # the leader rejoins: PREPARING
    h.join("", new_id="p3")
    h.join("w2", allocation=rs("B", "B-0"))
    assert h.classic_state is ClassicState.PREPARING_REBALANCE  # p3 is still out
    answer = h.join("p3")
    assert not isinstance(answer, Parked)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert h.has_member("p3")


def test_a_pending_id_that_lapses_releases_the_barrier() -> None:
    """GroupMetadataManagerTest testJoinGroupCompletionWhenPendingMemberTimesOut."""
    h = stable_pair()
    h.join("w1", allocation=rs("A", "A-0"))
    h.join("", new_id="p3", session_ms=200)
    h.join("w2", allocation=rs("B", "B-0"))
    h.sleep(199)
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.sleep(1)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert not h.has_member("p3")


def test_the_initial_delay_runs_its_course_even_with_everyone_in() -> None:
    """GroupMetadataManagerTest
    testDelayInitialRebalanceByGroupInitialRebalanceDelayOnEmptyGroup."""
    h = ClassicHarness()
    assert isinstance(h.new_member("w1"), Parked)
    assert h.deadline((CLASSIC_JOIN, "")) == DELAY_MS
    h.sleep(DELAY_MS - 1)
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    h.sleep(1)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    assert h.join_answer("w1").leader == "w1"


def test_the_initial_delay_is_extended_per_new_member_up_to_the_rebalance_timeout() -> None:
    """GroupMetadataManagerTest testResetRebalanceDelayWhenNewMemberJoinsGroupDuringInitialRebalance
    and testDelayRebalanceUptoRebalanceTimeout: steps of the delay while members keep coming,
    never past the rebalance timeout."""
    h = ClassicHarness(defaults=replace(CLASSIC_DEFAULTS, classic_initial_rebalance_delay_ms=200))
    h.new_member("w0")  # rebalance timeout 500: delay 200, then at most 300 more
    arrivals = 1
    while h.classic_state is ClassicState.PREPARING_REBALANCE and h.now_ms < 1_000:
        h.sleep(150)
        if h.classic_state is ClassicState.PREPARING_REBALANCE:
            h.new_member(f"w{arrivals}")
            arrivals += 1
    # Completed at 200 + 200 + 100 = 500 = the rebalance timeout, though members kept coming.
    completed = h.logged_events(EventType.CLASSIC_JOIN_COMPLETED)[0]
    assert completed.at_ms == REBALANCE_MS
    assert len(completed.payload["members"]) == arrivals


def test_the_vote_takes_the_most_votes_and_breaks_a_tie_by_the_lowest_name() -> None:
    """ClassicGroupTest testSelectProtocol (Departure: the tie goes to the lowest name)."""

    def listing(*names: str) -> tuple[ClassicProtocol, ...]:
        versions = {"default": 0, "compatible": 1, "sessioned": 2}
        return tuple(ClassicProtocol(n, ConnectWorkerMetadata(versions[n])) for n in names)

    tie = ClassicHarness()
    tie.new_member("w1", protocol_list=listing("default", "compatible"))
    tie.new_member("w2", protocol_list=listing("compatible", "default"))
    tie.sleep(REBALANCE_MS)
    assert tie.protocol == "compatible"  # one vote each: the lowest name

    most = ClassicHarness()
    most.new_member("w1", protocol_list=listing("sessioned", "compatible", "default"))
    most.new_member("w2", protocol_list=listing("default", "compatible"))
    most.new_member("w3", protocol_list=listing("default", "sessioned", "compatible"))
    most.sleep(REBALANCE_MS)
    # Candidates: compatible and default (sessioned is not w2's); w1 votes compatible.
    assert most.protocol == "default"


def test_the_previous_leader_stays_leader_if_it_rejoined_even_late() -> None:
    """ClassicGroupTest testMaybeElectNewJoinedLeaderChooseExisting."""
    h = stable_pair()
    h.new_member("w3")
    h.join("w2", allocation=rs("B", "B-0"))
    h.join("w1", allocation=rs("A", "A-0"))  # joined last
    assert h.leader == "w1"


def test_a_leader_that_did_not_rejoin_is_replaced_by_the_earliest_joiner() -> None:
    """ClassicGroupTest testElectNewJoinedLeader (Departure: earliest joiner, not map order)."""
    h = stable_pair()
    h.new_member("w3")
    h.join("w2", allocation=rs("B", "B-0"))
    h.sleep(REBALANCE_MS)  # w1 never rejoins
    assert not h.has_member("w1")
    assert h.leader == "w3"
    assert h.join_answer("w3").members and not h.join_answer("w2").members


def test_assignor_principals_restricts_the_leader() -> None:
    h = ClassicHarness(defaults=replace(CLASSIC_DEFAULTS, assignor_principals="User:lead"))
    h.new_member("w1", principal="User:worker")
    h.new_member("w2", principal="User:lead")
    h.sleep(REBALANCE_MS)
    assert h.leader == "w2"


def test_no_member_of_assignor_principals_keeps_the_group_preparing_with_the_reason() -> None:
    h = ClassicHarness(defaults=replace(CLASSIC_DEFAULTS, assignor_principals="User:lead"))
    h.new_member("w1", principal="User:worker")
    h.sleep(DELAY_MS)
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.state is not None and h.state.round is not None
    assert "assignor.principals" in h.state.round.leader_unavailable_reason
    assert h.deadline((CLASSIC_JOIN, "")) == h.now_ms + REBALANCE_MS
    assert h.generation == 1  # no generation without a leader
    # One of them joins: everyone is in, the phase completes with it as leader.
    answer = h.new_member("w2", principal="User:lead")
    assert not isinstance(answer, Parked) and answer.leader == "w2"
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE and h.leader == "w2"
    assert h.state.round.leader_unavailable_reason == ""
