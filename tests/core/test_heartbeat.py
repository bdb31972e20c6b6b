"""ConnectGroupHeartbeat (seed 000 "Request Handling"; DESIGN 3.2-3.4, 3.11-3.14)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import AssignmentMessage, Assignor, HeartbeatRequest
from connect_protocol.resources import EMPTY
from connect_protocol.tokens import NO_TOKENS
from coordinator_svc.core.model import GroupConfigDefaults, GroupStatus, Member, MemberState
from coordinator_svc.core.records import EventType, MemberRecord
from coordinator_svc.core.results import ASSIGNOR, HOLD, SESSION
from tests.core.harness import (
    ALL,
    COMPATIBLE,
    DEFAULTS,
    EAGER,
    GROUP,
    INTERVAL_MS,
    REBALANCE_MS,
    SESSION_MS,
    SESSIONED,
    W1_SHARE,
    W2_SHARE,
    GroupHarness,
    catalogue_group,
    ok,
    rs,
    stable_group,
)

# --- joining ---------------------------------------------------------------------------------


def untokened(assignment: AssignmentMessage | None) -> AssignmentMessage | None:
    """The assignment without its fencing tokens (tested on their own in test_fencing_tokens)."""
    return None if assignment is None else replace(assignment, tokens=NO_TOKENS)


def test_the_first_join_creates_the_group_with_epochs_starting_at_1() -> None:
    h = GroupHarness()

    response = h.join("w1")

    assert h.state is not None
    # A new group starts at group epoch 1 with an empty target at assignment epoch 1; the
    # join bumps the group epoch to 2 (DESIGN 3.2).
    assert (h.group_epoch, h.assignment_epoch) == (2, 1)
    assert response.member_epoch == 1
    assert untokened(response.assignment) == AssignmentMessage(EMPTY)
    assert h.member("w1") == Member(
        member_id="w1",
        member_epoch=1,
        rebalance_timeout_ms=REBALANCE_MS,
        assignors=SESSIONED,
        stable_since_epoch=1,  # told its (empty) assignment at 1 (DESIGN 3.21)
    )
    assert h.events_of_last_call()[:2] == [EventType.GROUP_CREATED, EventType.MEMBER_JOINED]
    assert h.dump() == h.rebuilt()


def test_no_member_ever_holds_epoch_0() -> None:
    h = catalogue_group()

    response = h.join("w1")

    assert response.member_epoch == h.assignment_epoch == 3
    assert h.member("w1").member_epoch == 3


def test_a_joining_member_is_answered_at_once_with_the_assignment_epoch_and_its_empty_share() -> (
    None
):
    h = stable_group()

    response = h.join("w3")

    assert response.error_code == ErrorCode.NONE  # w1 computes, not w3
    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(EMPTY)
    assert h.group_epoch == 6
    assert h.member("w3").state is MemberState.STABLE


def test_every_response_carries_the_heartbeat_interval_and_the_session_timeout() -> None:
    h = stable_group()

    for response in (h.keepalive("w1"), h.join("w3"), h.keepalive("w2")):
        assert response.heartbeat_interval_ms == INTERVAL_MS
        assert response.session_timeout_ms == SESSION_MS


def test_the_assignor_member_is_sent_compute_assignment_on_every_heartbeat_while_behind() -> None:
    h = GroupHarness()

    first = h.join("w1")
    second = h.keepalive("w1")
    records_of_second = h.records_of_last_call
    third = h.heartbeat("w1", 1, owned=EMPTY)

    for response in (first, second, third):
        assert response.error_code == ErrorCode.COMPUTE_ASSIGNMENT
        assert "group epoch 2" in response.error_message
        # COMPUTE_ASSIGNMENT is a signal: the rest of the response is valid.
        assert response.member_epoch == 1
        assert response.heartbeat_interval_ms == INTERVAL_MS
    assert first.assignment == AssignmentMessage(EMPTY)
    assert records_of_second == []  # asked once; the repeats write nothing
    assert h.state is not None and h.state.meta.compute_requested_epoch == 2
    assert h.deadline((ASSIGNOR, "")) == REBALANCE_MS


def test_compute_assignment_stops_once_the_target_for_the_group_epoch_is_installed() -> None:
    h = GroupHarness()
    h.join("w1")

    h.compute("w1", {"w1": EMPTY})

    assert h.keepalive("w1").error_code == ErrorCode.NONE
    assert h.deadline((ASSIGNOR, "")) is None


def test_compute_assignment_is_sent_only_to_the_assignor_member() -> None:
    h = stable_group()
    h.join("w3")

    assert h.keepalive("w2").error_code == ErrorCode.NONE
    assert h.keepalive("w3").error_code == ErrorCode.NONE
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


# --- what bumps the group epoch (DESIGN 3.3) --------------------------------------------------


def test_a_join_bumps_the_group_epoch() -> None:
    h = stable_group()

    h.join("w3")

    assert h.group_epoch == 6
    assert EventType.GROUP_EPOCH_BUMPED in h.events_of_last_call()


def test_a_leave_removes_the_member_releases_its_resources_and_bumps_the_group_epoch() -> None:
    h = stable_group()

    response = h.leave("w2")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == -1
    assert not h.has_member("w2")
    assert h.group_epoch == 6
    assert h.state is not None
    assert h.state.meta.holds == ()  # a leave releases at once: the agent stopped first
    assert h.deadline((SESSION, "w2")) is None


def test_a_fence_bumps_the_group_epoch() -> None:
    h = stable_group()

    h.heartbeat("w2", 99, owned=W2_SHARE)

    assert h.group_epoch == 6


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"maximum_version": 3}, id="version-range"),
        pytest.param({"reason": 1}, id="reason"),
        pytest.param({"metadata": b"\x01"}, id="metadata"),
    ],
)
def test_a_change_of_a_members_assignor_reason_or_metadata_bumps_the_group_epoch(
    change: dict[str, object],
) -> None:
    h = stable_group()
    changed = (replace(SESSIONED[0], **change), SESSIONED[1])

    response = h.heartbeat("w2", 5, assignors=changed)

    ok(response)
    assert h.group_epoch == 6
    assert h.member("w2").assignors == changed


def test_a_change_of_the_assignor_list_bumps_the_group_epoch() -> None:
    h = stable_group()

    h.heartbeat("w2", 5, assignors=SESSIONED[:1])

    assert h.group_epoch == 6


def test_a_catalogue_change_bumps_the_group_epoch() -> None:
    h = stable_group()

    h.put_connector("C", 1)

    assert h.group_epoch == 6
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_a_new_url_is_stored_but_does_not_bump_the_group_epoch() -> None:
    h = stable_group()

    response = h.heartbeat("w2", 5, url="http://w2:8083")

    assert response.error_code == ErrorCode.NONE
    assert h.group_epoch == 5
    assert h.member("w2").url == "http://w2:8083"
    assert [type(r) for r in h.state_records_of_last_call()] == [MemberRecord]


def test_a_new_rebalance_timeout_is_stored_but_does_not_bump_the_group_epoch() -> None:
    h = stable_group()

    h.heartbeat("w2", 5, rebalance_timeout_ms=900)

    assert h.group_epoch == 5
    assert h.member("w2").rebalance_timeout_ms == 900


def test_resending_the_same_assignors_does_not_bump_the_group_epoch() -> None:
    h = stable_group()

    h.heartbeat("w2", 5, assignors=SESSIONED)

    assert h.group_epoch == 5
    assert h.records_of_last_call == []


# --- rejoining at epoch 0 (DESIGN 3.2) ---------------------------------------------------------


def test_a_rejoin_of_a_known_member_gets_its_epoch_and_whole_assignment_without_a_bump() -> None:
    h = stable_group()
    before = h.member("w2")

    response = h.join("w2")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.group_epoch == 5
    assert h.member("w2") == before
    assert h.records_of_last_call == []


def test_a_rejoin_with_changed_metadata_bumps_the_group_epoch() -> None:
    h = stable_group()
    changed = (replace(SESSIONED[0], metadata=b"m"), SESSIONED[1])

    response = h.join("w2", assignors=changed)

    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.group_epoch == 6


def test_a_rejoin_whose_owned_list_drops_the_pending_revocation_acknowledges_it() -> None:
    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")})
    h.keepalive("w1")
    assert h.member("w1").state is MemberState.UNREVOKED

    response = h.join("w1")

    assert response.member_epoch == 6
    assert untokened(response.assignment) == AssignmentMessage(rs("A", "A-0"))
    assert h.member("w1").state is MemberState.STABLE
    assert h.member("w1").pending_revocation == EMPTY


# --- lost responses and fencing (DESIGN 3.12, 3.13) ---------------------------------------------


def _w2_moved_to_a_new_epoch_with_a_lost_response() -> GroupHarness:
    h = stable_group()
    h.put_connector("C", 0)
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE | rs("C")})
    response = h.ack("w2")  # this response is lost: w2 still believes it is at epoch 5
    assert response.member_epoch == 6
    assert h.member("w2") == replace(
        h.member("w2"), member_epoch=6, previous_epoch=5, assigned=W2_SHARE | rs("C")
    )
    return h


def test_a_retry_with_the_previous_epoch_and_an_owned_subset_is_answered_again() -> None:
    h = _w2_moved_to_a_new_epoch_with_a_lost_response()
    before = h.member("w2")

    response = h.heartbeat("w2", 5, owned=W2_SHARE)

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 6
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE | rs("C"))
    assert h.member("w2") == before
    assert h.records_of_last_call == []


def test_a_retry_with_the_previous_epoch_without_an_owned_list_is_fenced() -> None:
    h = _w2_moved_to_a_new_epoch_with_a_lost_response()

    response = h.heartbeat("w2", 5)

    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w2")


def test_a_retry_with_the_previous_epoch_owning_more_than_it_was_given_is_fenced() -> None:
    h = _w2_moved_to_a_new_epoch_with_a_lost_response()

    response = h.heartbeat("w2", 5, owned=W2_SHARE | rs("A-0"))

    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w2")


@pytest.mark.parametrize("epoch", [4, 6, 99], ids=["older", "newer", "far-future"])
def test_any_other_epoch_mismatch_fences_and_removes_the_member(epoch: int) -> None:
    h = stable_group()

    response = h.heartbeat("w2", epoch, owned=W2_SHARE)

    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert f"member epoch {epoch} does not match the coordinator's 5" in response.error_message
    assert "rejoin with epoch 0" in response.error_message
    assert response.assignment is None
    assert not h.has_member("w2")
    assert EventType.MEMBER_FENCED in h.events_of_last_call()
    assert h.deadline((SESSION, "w2")) is None


def test_a_fenced_members_resources_go_to_nobody_until_a_session_timeout_has_passed() -> None:
    h = stable_group()
    fenced_at = h.now_ms
    h.heartbeat("w2", 4, owned=W2_SHARE)
    assert h.state is not None
    assert h.deadline((HOLD, "w2")) == fenced_at + SESSION_MS
    h.compute("w1", {"w1": ALL})

    h.ack("w1")
    assert h.member("w1").assigned == W1_SHARE
    assert h.member("w1").state is MemberState.UNRELEASED
    h.run_for(SESSION_MS - INTERVAL_MS, "w1")
    h.ack("w1")
    assert h.member("w1").assigned == W1_SHARE, "held resources given before the hold ended"

    h.sleep(INTERVAL_MS)
    assert h.state.meta.holds == ()
    response = h.ack("w1")

    assert untokened(response.assignment) == AssignmentMessage(ALL)
    assert h.member("w1").state is MemberState.STABLE


def test_a_fenced_member_rejoining_at_epoch_0_is_a_new_member() -> None:
    h = stable_group()
    h.heartbeat("w2", 4, owned=W2_SHARE)

    response = h.join("w2")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 5
    assert h.group_epoch == 7


def test_an_unknown_member_id_with_a_positive_epoch_is_unknown_member_id() -> None:
    h = stable_group()
    before = h.dump()

    response = h.heartbeat("w9", 5, owned=EMPTY)

    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert "rejoin with epoch 0" in response.error_message
    assert h.dump() == before
    assert h.records_of_last_call == []


@pytest.mark.parametrize("epoch", [3, -1])
def test_a_heartbeat_for_a_group_that_does_not_exist_is_unknown_member_id(epoch: int) -> None:
    h = GroupHarness()

    response = h.heartbeat("w1", epoch, owned=EMPTY)

    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert "does not exist" in response.error_message
    assert h.state is None


def test_a_leave_of_an_unknown_member_is_unknown_member_id() -> None:
    h = stable_group()
    before = h.dump()

    response = h.leave("w9")

    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.dump() == before


def test_a_join_beyond_the_maximum_group_size_is_refused() -> None:
    h = GroupHarness(defaults=replace(DEFAULTS, max_group_size=2))
    h.join("w1")
    h.join("w2")
    before = h.dump()

    response = h.join("w3")

    assert response.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert h.dump() == before


# --- the assignor member (DESIGN 3.4, 3.10) ----------------------------------------------------


def test_when_the_assignor_member_leaves_another_member_is_asked_to_compute() -> None:
    h = stable_group()
    h.join("w3")
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT

    h.leave("w1")

    assert h.state is not None and h.state.meta.assignor_member_id == "w2"
    assert h.keepalive("w3").error_code == ErrorCode.NONE
    assert h.keepalive("w2").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_a_removal_leaving_no_covering_member_keeps_the_group_assigning_until_members_change() -> (
    None
):
    h = catalogue_group()
    h.join("w1", assignors=(Assignor("x", 1, 3, version=3),))
    h.join("w2", assignors=(Assignor("x", 1, 2, version=2),))
    h.join("w3", assignors=(Assignor("x", 2, 3, version=3),))
    h.compute("w1", {"w1": ALL, "w2": EMPTY, "w3": EMPTY})

    h.leave("w1")

    assert h.state is not None
    assert h.state.meta.assignor_member_id is None
    [unavailable] = h.last_events(EventType.ASSIGNOR_UNAVAILABLE)
    assert "covers every other member" in unavailable.payload["reason"]
    assert h.keepalive("w2").error_code == ErrorCode.NONE
    assert h.keepalive("w3").error_code == ErrorCode.NONE
    assert h.status() is GroupStatus.ASSIGNING

    h.join("w4", assignors=(Assignor("x", 1, 3, version=3),))

    assert h.state.meta.assignor_member_id == "w4"
    assert h.keepalive("w4").error_code == ErrorCode.COMPUTE_ASSIGNMENT


# --- UNSUPPORTED_ASSIGNOR (DESIGN 2.1, 3.4) ----------------------------------------------------


def test_naming_a_server_assignor_is_unsupported_and_leaves_the_group_as_it_was() -> None:
    h = stable_group()
    before = h.dump()

    response = h.send(
        HeartbeatRequest(GROUP, "w3", 0, rebalance_timeout_ms=500, server_assignor="uniform")
    )

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert "'uniform'" in response.error_message
    assert h.dump() == before
    assert h.records_of_last_call == []


def test_naming_a_server_assignor_does_not_create_a_group() -> None:
    h = GroupHarness()

    response = h.send(
        HeartbeatRequest(GROUP, "w1", 0, rebalance_timeout_ms=500, server_assignor="range")
    )

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert h.state is None


def test_a_join_with_no_assignor_in_common_is_unsupported_and_says_why() -> None:
    h = stable_group()
    before = h.dump()

    response = h.join("w3", assignors=(Assignor("other", 0, 0),))

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert "no client assignor is supported by every member" in response.error_message
    assert h.dump() == before


def test_a_join_that_would_leave_no_covering_member_is_unsupported() -> None:
    h = GroupHarness()
    h.join("w1", assignors=(Assignor("x", 1, 3, version=1),))
    before = h.dump()

    response = h.join("w2", assignors=(Assignor("x", 2, 4, version=2),))

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert "covers every other member" in response.error_message
    assert h.dump() == before


def test_a_join_without_client_assignors_is_unsupported() -> None:
    h = GroupHarness()

    response = h.join("w1", assignors=())

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert h.state is None


def test_an_assignor_change_that_breaks_the_selection_is_unsupported_and_changes_nothing() -> None:
    h = stable_group()
    before = h.dump()

    response = h.heartbeat("w2", 5, assignors=(Assignor("other", 0, 0),))

    assert response.error_code == ErrorCode.UNSUPPORTED_ASSIGNOR
    assert h.dump() == before


def test_an_eager_only_worker_joining_switches_the_group_to_eager() -> None:
    h = stable_group()

    h.join("w3", assignors=EAGER)
    prepared = h.prepare("w1")

    assert (prepared.assignor_name, prepared.assignor_version) == ("eager", 0)


# --- static membership (DESIGN 3.14) ---------------------------------------------------------


def static_group() -> GroupHarness:
    """Like stable_group, but w2 is static with instance id i2."""
    h = catalogue_group()
    h.join("w1")
    h.join("w2", instance_id="i2")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE})
    h.ack("w1")
    h.ack("w2")
    assert h.member("w2").assigned == W2_SHARE
    return h


def test_a_static_leave_keeps_the_assignment_without_a_bump_until_the_session_times_out() -> None:
    h = static_group()

    response = h.leave("w2", instance_id="i2")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == -2
    assert h.group_epoch == 5
    assert h.member("w2").state is MemberState.LEFT
    assert h.member("w2").assigned == W2_SHARE

    h.run_for(SESSION_MS - INTERVAL_MS, "w1")
    assert h.member("w2").assigned == W2_SHARE
    assert h.group_epoch == 5

    h.run_for(INTERVAL_MS, "w1")
    assert not h.has_member("w2")
    assert h.group_epoch == 6
    assert h.state is not None and h.state.meta.holds == ()


def test_a_static_members_resources_go_to_nobody_else_while_it_is_away() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")
    h.put_connector("C", 0)
    h.compute("w1", {"w1": ALL | rs("C"), "w2": EMPTY})

    h.ack("w1")

    assert h.member("w1").assigned == W1_SHARE | rs("C")
    assert h.member("w1").state is MemberState.UNRELEASED


def test_a_new_member_id_with_the_same_instance_id_takes_over_without_a_rebalance() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")

    response = h.join("w2b", instance_id="i2")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.group_epoch == 5
    assert not h.has_member("w2")
    assert h.member("w2b").assigned == W2_SHARE
    assert h.member("w2b").state is MemberState.STABLE
    assert h.target_of("w2b") == W2_SHARE
    assert h.target_of("w2") == EMPTY
    assert h.state is not None and h.state.instance_owner == {"i2": "w2b"}
    assert h.deadline((SESSION, "w2")) is None
    assert h.status() is GroupStatus.STABLE
    assert h.dump() == h.rebuilt()


def test_a_takeover_racing_with_a_computation_accepts_its_install_and_asks_for_a_new_one() -> None:
    h = static_group()
    h.join("w3")
    prepared = h.prepare("w1")  # shows w2, about to leave statically
    assert [m.member_id for m in prepared.members] == ["w1", "w2", "w3"]
    h.leave("w2", instance_id="i2")
    h.join("w2b", instance_id="i2")
    assert h.group_epoch == 7  # the takeover moved the epoch for the computation in flight

    # The install is validated against the group the Prepare showed (w2 included)...
    response = h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})

    # ...and accepted; w2's share is dropped and a new computation places it.
    assert response.error_code == ErrorCode.NONE
    assert h.assignment_epoch == 6
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("w1", {"w1": W1_SHARE, "w2b": W2_SHARE, "w3": EMPTY})
    for member_id in ("w1", "w2b", "w3"):
        h.ack(member_id)
        h.ack(member_id)
    assert h.member("w2b").assigned == W2_SHARE
    assert h.status() is GroupStatus.STABLE


def test_a_takeover_after_a_prepare_whose_epoch_is_installed_does_not_bump() -> None:
    h = static_group()
    h.prepare("w1")  # nothing to compute: the epoch already has its target
    h.leave("w2", instance_id="i2")

    h.join("w2b", instance_id="i2")

    assert h.group_epoch == 5


def test_the_same_member_id_rejoining_after_a_static_leave_is_back_without_a_rebalance() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")

    response = h.join("w2", instance_id="i2")

    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.member("w2").state is MemberState.STABLE
    assert h.group_epoch == 5


def test_a_second_live_claimer_of_an_instance_id_gets_unreleased_instance_id() -> None:
    h = static_group()
    before = h.dump()

    response = h.join("w2b", instance_id="i2")

    assert response.error_code == ErrorCode.UNRELEASED_INSTANCE_ID
    assert "'w2'" in response.error_message
    assert h.dump() == before


def test_a_heartbeat_with_an_instance_id_owned_by_another_member_gets_fenced_instance_id() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")
    h.join("w2b", instance_id="i2")
    before = h.dump()

    # The old process of w2 comes back: its instance id now belongs to w2b.
    response = h.heartbeat("w2", 5, instance_id="i2", owned=W2_SHARE)

    assert response.error_code == ErrorCode.FENCED_INSTANCE_ID
    assert "belongs to member 'w2b'" in response.error_message
    assert h.dump() == before


def test_a_live_member_presenting_another_members_instance_id_gets_fenced_instance_id() -> None:
    h = static_group()
    before = h.dump()

    response = h.heartbeat("w1", 5, instance_id="i2", owned=W1_SHARE)

    assert response.error_code == ErrorCode.FENCED_INSTANCE_ID
    assert h.dump() == before


def test_a_known_member_joining_with_a_departed_members_instance_id_is_fenced() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")
    before = h.dump()

    response = h.join("w1", instance_id="i2")

    assert response.error_code == ErrorCode.FENCED_INSTANCE_ID
    assert h.dump() == before


def test_a_successor_takes_over_the_assignor_role_of_the_member_it_replaces() -> None:
    h = catalogue_group()
    h.join("w1", assignors=COMPATIBLE)
    h.join("w2", instance_id="i2")  # the only sessioned member: the only one that covers
    h.compute("w2", {"w1": W1_SHARE, "w2": W2_SHARE})
    h.leave("w2", instance_id="i2")
    assert h.state is not None and h.state.meta.assignor_member_id == "w2"

    h.join("w2b", instance_id="i2")

    assert h.state.meta.assignor_member_id == "w2b"


def test_a_successor_with_other_assignors_takes_over_with_a_rebalance() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")

    h.join("w2b", instance_id="i2", assignors=COMPATIBLE)

    assert h.group_epoch == 6
    assert h.member("w2b").assigned == W2_SHARE


def test_a_member_presenting_another_instance_id_than_its_own_gets_fenced_instance_id() -> None:
    h = static_group()
    before = h.dump()

    response = h.heartbeat("w2", 5, instance_id="i9", owned=W2_SHARE)

    assert response.error_code == ErrorCode.FENCED_INSTANCE_ID
    assert "registered with instance id 'i2'" in response.error_message
    assert h.dump() == before


def test_a_static_member_that_left_is_unknown_at_a_positive_epoch() -> None:
    h = static_group()
    h.leave("w2", instance_id="i2")

    response = h.heartbeat("w2", 5, instance_id="i2", owned=EMPTY)

    assert response.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert h.member("w2").state is MemberState.LEFT


# --- revoke before assign (DESIGN 3.11) --------------------------------------------------------


def test_a_joining_member_reaches_the_new_epoch_holding_nothing_until_others_acknowledge() -> None:
    h = catalogue_group()
    h.join("w1")
    h.compute("w1", {"w1": ALL})
    h.ack("w1")
    h.join("w2")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE})

    response = h.keepalive("w2")
    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(EMPTY)
    assert h.member("w2").state is MemberState.UNRELEASED

    response = h.heartbeat("w1", 4, owned=ALL)
    assert response.member_epoch == 4
    assert untokened(response.assignment) == AssignmentMessage(W1_SHARE)
    assert h.member("w1").pending_revocation == W2_SHARE
    assert h.keepalive("w2").assignment is None
    assert h.member("w2").assigned == EMPTY

    response = h.heartbeat("w1", 4, owned=W1_SHARE)
    assert response.member_epoch == 5
    assert EventType.REVOCATION_ACKNOWLEDGED in h.events_of_last_call()

    response = h.keepalive("w2")
    assert response.member_epoch == 5
    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.status() is GroupStatus.STABLE


def test_a_heartbeat_without_an_owned_list_never_acknowledges_a_revocation() -> None:
    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": rs("A"), "w2": W2_SHARE, "w3": rs("A-0", "A-1")})
    h.keepalive("w1")
    assert h.member("w1").state is MemberState.UNREVOKED

    for _ in range(3):
        h.keepalive("w1")
        assert h.member("w1").state is MemberState.UNREVOKED
        assert h.member("w1").pending_revocation == rs("A-0", "A-1")


def test_the_revocation_timer_runs_from_the_request_to_revoke_until_the_acknowledgement() -> None:
    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": rs("A"), "w2": W2_SHARE, "w3": rs("A-0", "A-1")})

    h.keepalive("w1")
    assert h.deadline(("revocation", "w1")) == h.now_ms + REBALANCE_MS

    h.heartbeat("w1", 5, owned=rs("A"))
    assert h.deadline(("revocation", "w1")) is None


def test_the_assignment_is_resent_while_the_owned_list_differs_from_what_it_was_told() -> None:
    h = stable_group()

    response = h.heartbeat("w2", 5, owned=rs("B"))

    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE)
    assert h.records_of_last_call == []


def test_the_assignment_carries_the_targets_version_and_metadata() -> None:
    h = stable_group()
    h.put_connector("C", 0)
    h.compute(
        "w1",
        {"w1": W1_SHARE, "w2": W2_SHARE | rs("C")},
        metadata={"w2": (2, b"meta-w2")},
    )

    response = h.ack("w2")

    assert untokened(response.assignment) == AssignmentMessage(W2_SHARE | rs("C"), 2, b"meta-w2")


def test_the_same_full_heartbeat_twice_gets_the_same_answer_and_writes_nothing() -> None:
    h = stable_group()
    full = HeartbeatRequest(
        GROUP,
        "w2",
        5,
        instance_id="i2",
        rebalance_timeout_ms=REBALANCE_MS,
        client_assignors=SESSIONED,
        owned=W2_SHARE,
        url="http://w2",
    )
    h.send(full)  # the first one stores the instance id and url

    first = h.send(full)
    first_records = h.records_of_last_call
    dump = h.dump()
    second = h.send(full)

    assert first == second
    assert first_records == h.records_of_last_call == []
    assert h.dump() == dump


def test_a_steady_heartbeat_writes_nothing_and_rearms_the_session() -> None:
    h = stable_group()
    h.sleep(300)

    response = h.ack("w2")

    assert response.error_code == ErrorCode.NONE
    assert response.assignment is None
    assert h.records_of_last_call == []
    assert h.deadline((SESSION, "w2")) == h.now_ms + SESSION_MS


def test_a_member_whose_group_uses_custom_configs_is_told_them() -> None:
    h = stable_group()
    h.alter_configs({"session.timeout.ms": "4000", "heartbeat.interval.ms": "400"})

    response = h.keepalive("w2")

    assert (response.heartbeat_interval_ms, response.session_timeout_ms) == (400, 4000)
    assert h.deadline((SESSION, "w2")) == h.now_ms + 4000


def test_the_defaults_apply_to_a_group_without_configs() -> None:
    defaults = GroupConfigDefaults(session_timeout_ms=45_000, heartbeat_interval_ms=5_000)
    h = GroupHarness(defaults=defaults)

    response = h.join("w1")

    assert (response.heartbeat_interval_ms, response.session_timeout_ms) == (5_000, 45_000)
