"""Classic SyncGroup (DESIGN 3.19; GroupMetadataManagerTest names per test): followers parked
until the leader's assignments, validated and refused three ways, tokens per grant, the sync
deadline for a follower and for the leader, ILLEGAL_GENERATION and REBALANCE_IN_PROGRESS."""

from __future__ import annotations

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import ResourceSet
from coordinator_svc.core.classic_model import ClassicState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import CLASSIC_SYNC, Parked

from .classic_harness import REBALANCE_MS, SESSION_MS, ClassicHarness, given, rs


def completing(*names: str) -> ClassicHarness:
    """Connectors A (1 task) and B (1 task); `names` joined, COMPLETING_REBALANCE."""
    h = ClassicHarness()
    h.put_connector("A", 1)
    h.put_connector("B", 1)
    for name in names:
        h.new_member(name)
    h.sleep(REBALANCE_MS)
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    return h


def test_a_follower_parks_until_the_leader_syncs_then_gets_its_share_with_tokens() -> None:
    """GroupMetadataManagerTest testSyncGroupLeaderAfterFollower."""
    h = completing("w1", "w2")
    assert h.leader == "w1"
    assert h.sync("w2") == Parked("sync", "w2")
    leader = h.sync("w1", {"w1": given(rs("A", "A-0")), "w2": given(rs("B", "B-0"))})
    assert not isinstance(leader, Parked) and leader.error_code == ErrorCode.NONE
    assert h.classic_state is ClassicState.STABLE
    follower = h.sync_answer("w2")
    assert follower.assignment is not None
    assert follower.assignment.assignment == rs("B", "B-0")
    assert follower.assignment.leader == "w1" and follower.assignment.leader_url == "http://w1"
    assert follower.assignment.error == 0 and follower.assignment.config_offset == 0
    # One token per member grant, each above every earlier one (DESIGN 3.18).
    assert leader.assignment is not None
    w1_tokens = set(leader.assignment.tokens.values())
    w2_tokens = set(follower.assignment.tokens.values())
    assert len(w1_tokens) == 1 and len(w2_tokens) == 1 and w1_tokens != w2_tokens
    assert h.state is not None and h.state.meta.last_fencing_token == max(w1_tokens | w2_tokens)
    assert h.held("w1") == rs("A", "A-0") and h.held("w2") == rs("B", "B-0")
    delivered = {e.member_id for e in h.last_events(EventType.ASSIGNMENT_DELIVERED)}
    assert delivered == {"w1", "w2"}
    assert h.deadline((CLASSIC_SYNC, "")) is None  # everyone synced


def test_a_follower_syncing_after_the_leader_is_answered_from_the_accepted_assignment() -> None:
    """GroupMetadataManagerTest testSyncGroupFollowerAfterLeader; a retry writes nothing."""
    h = completing("w1", "w2")
    h.sync("w1", {"w2": given(rs("B", "B-0"))})
    answer = h.sync("w2")
    assert not isinstance(answer, Parked) and answer.assignment is not None
    assert answer.assignment.assignment == rs("B", "B-0")
    assert [e.member_id for e in h.last_events(EventType.ASSIGNMENT_DELIVERED)] == ["w2"]
    assert h.sync("w2") == answer
    assert h.records_of_last_call == []


def test_a_sync_of_another_generation_is_illegal_generation() -> None:
    """GroupMetadataManagerTest testSyncGroupFromIllegalGeneration."""
    h = completing("w1", "w2")
    answer = h.sync("w2", generation=h.generation - 1)
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.ILLEGAL_GENERATION
    assert h.records_of_last_call == []


def test_a_sync_while_preparing_is_rebalance_in_progress_and_parked_syncs_are_answered_so() -> None:
    h = completing("w1", "w2")
    assert h.sync("w2") == Parked("sync", "w2")
    h.new_member("w3")  # a new member: PREPARING
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.sync_answer("w2").error_code == ErrorCode.REBALANCE_IN_PROGRESS
    answer = h.sync("w1", {"w1": given(rs("A"))})
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS


def refused_with(h: ClassicHarness, assignments: dict[str, ResourceSet], reason: str) -> None:
    """The leader's assignments are refused: ASSIGNMENT_REFUSED naming `reason`, the leader
    and the parked follower answered REBALANCE_IN_PROGRESS, a new rebalance, nothing held."""
    generation = h.generation
    h.sync("w2")
    answer = h.sync("w1", {m: given(a) for m, a in assignments.items()})
    assert not isinstance(answer, Parked)
    assert answer.error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert h.sync_answer("w2").error_code == ErrorCode.REBALANCE_IN_PROGRESS
    (refusal,) = h.last_events(EventType.ASSIGNMENT_REFUSED)
    assert reason in refusal.payload["reason"] and refusal.payload["generation"] == generation
    assert h.classic_state is ClassicState.PREPARING_REBALANCE
    assert h.last_events(EventType.CLASSIC_REBALANCE_STARTED)[0].payload["reason"] == (
        "assignment refused"
    )


def test_a_resource_given_to_two_members_is_refused() -> None:
    h = completing("w1", "w2")
    refused_with(h, {"w1": rs("A", "A-0"), "w2": rs("A")}, "given to two members")
    assert not h.held("w1") and not h.held("w2")


def test_a_resource_another_member_still_holds_is_refused() -> None:
    h = completing("w1", "w2")
    h.sync_all({"w2": rs("B", "B-0")})
    # A new generation: w2 keeps B (its allocation says so); the leader gives B to itself.
    h.join("w1", allocation=rs())
    h.join("w2", allocation=rs("B", "B-0"))
    assert h.classic_state is ClassicState.COMPLETING_REBALANCE
    refused_with(h, {"w1": rs("B-0")}, "another member still owns")
    assert h.held("w2") == rs("B", "B-0") and not h.held("w1")


def test_a_resource_pending_revocation_at_another_member_is_refused() -> None:
    h = completing("w1", "w2")
    h.sync_all({"w2": rs("B", "B-0")})
    h.join("w1", allocation=rs())
    h.join("w2", allocation=rs("B", "B-0"))
    h.sync("w2")
    h.sync("w1", {"w2": given(revoked=rs("B-0"))})
    assert h.member("w2").pending_revocation == rs("B-0")
    h.join("w1", allocation=rs())  # the leader rejoins before w2 released B-0
    h.join("w2", allocation=rs("B", "B-0"))
    refused_with(h, {"w1": rs("B-0")}, "another member still owns")


def test_a_resource_outside_the_catalogue_shown_is_refused() -> None:
    h = completing("w1", "w2")
    refused_with(h, {"w1": rs("Z", "Z-0")}, "outside the catalogue")
    (refusal,) = h.logged_events(EventType.ASSIGNMENT_REFUSED)
    assert refusal.payload["resources"] == ["Z", "Z-0"]


def test_a_withheld_resource_is_outside_the_catalogue_shown() -> None:
    h = completing("w1", "w2", "w3")
    h.sync_all({"w3": rs("B", "B-0")})
    h.join("w1", allocation=rs())
    h.join("w2", allocation=rs())
    h.sleep(REBALANCE_MS)  # w3 never rejoins: removed with a hold on B, B-0
    assert h.join_answer("w1").withheld == rs("B", "B-0")
    refused_with(h, {"w2": rs("B-0")}, "outside the catalogue")


def test_a_follower_that_never_syncs_is_removed_with_a_hold_and_a_rebalance_starts() -> None:
    """GroupMetadataManagerTest testRebalanceTimesOutWhenSyncRequestIsNotReceivedFromFollowers."""
    h = completing("w1", "w2", "w3")
    h.sync_all({"w3": rs("B", "B-0")})  # w2 and w3 synced, w1 leader synced
    h.join("w1", allocation=rs())
    h.join("w2", allocation=rs())
    h.join("w3", allocation=rs("B", "B-0"))
    generation = h.generation
    h.sync("w1", {"w1": given(rs("A"))})
    h.sync("w2")
    h.run_for(REBALANCE_MS, "w1", "w2")  # w3 never syncs (it heartbeats neither)
    assert not h.has_member("w3")
    (fenced,) = h.logged_events(EventType.MEMBER_FENCED)
    assert fenced.payload["reason"] == "sync_timeout" and fenced.group_epoch == generation
    assert h.state is not None and h.state.meta.holds[0].resources == rs("B", "B-0")
    assert h.state.meta.holds[0].until_ms == fenced.at_ms + SESSION_MS
    assert h.classic_state is ClassicState.PREPARING_REBALANCE


def test_a_leader_that_never_syncs_leaves_the_parked_follower_rebalance_in_progress() -> None:
    """GroupMetadataManagerTest testRebalanceTimesOutWhenSyncRequestIsNotReceivedFromLeaders."""
    h = completing("w1", "w2")
    assert h.sync("w2") == Parked("sync", "w2")
    h.sleep(REBALANCE_MS)
    assert h.sync_answer("w2").error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert not h.has_member("w1") and h.has_member("w2")
    assert h.classic_state is ClassicState.PREPARING_REBALANCE


def test_the_sync_deadline_does_nothing_once_everyone_synced() -> None:
    """GroupMetadataManagerTest testRebalanceDoesNotTimeOutWhenAllSyncAreReceived; a stale
    sync timer fired late does nothing either."""
    h = completing("w1", "w2")
    h.sync_all({})
    before = h.dump()
    h.fire((CLASSIC_SYNC, ""))
    assert h.dump() == before and h.records_of_last_call == []
