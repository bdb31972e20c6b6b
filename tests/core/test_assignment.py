"""ConnectGroupPrepareAssignment and ConnectGroupInstallAssignment (seed 000; DESIGN 3.5-3.10)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    ConnectorInfo,
    InstallRequest,
    MemberTarget,
    PreparedMemberInfo,
    PrepareRequest,
)
from connect_protocol.resources import EMPTY
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.model import GroupStatus, MemberState
from coordinator_svc.core.records import EventType
from coordinator_svc.core.results import ASSIGNOR, SCHEDULED_REBALANCE
from tests.core.harness import (
    ALL,
    BACKOFF_MS,
    COMPATIBLE,
    DEFAULTS,
    GROUP,
    MAX_DELAY_MS,
    SESSIONED,
    W1_SHARE,
    W2_SHARE,
    GroupHarness,
    catalogue_group,
    rs,
    stable_group,
)


def assert_install_refused(
    h: GroupHarness, install: Callable[[], object], code: ErrorCode, *fragments: str
) -> None:
    before = h.dump()
    response = install()
    assert getattr(response, "error_code", None) == code, response
    message = str(getattr(response, "error_message", ""))
    for fragment in fragments:
        assert fragment in message, message
    assert h.records_of_last_call == []
    assert h.dump() == before


# --- checks 1-4, shared by Prepare and Install -----------------------------------------------


def test_prepare_for_a_group_that_does_not_exist_is_group_id_not_found() -> None:
    h = GroupHarness()

    response = h.prepare("w1", member_epoch=1)

    assert response.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.state is None


def test_install_for_a_group_that_does_not_exist_is_group_id_not_found() -> None:
    h = GroupHarness()

    response = h.install("w1", {}, group_epoch=2, member_epoch=1)

    assert response.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert h.state is None


def test_prepare_by_an_unknown_member_is_unknown_member_id() -> None:
    h = stable_group()

    assert_install_refused(
        h, lambda: h.prepare("w9", member_epoch=5), ErrorCode.UNKNOWN_MEMBER_ID, "'w9'"
    )


def test_install_by_an_unknown_member_is_unknown_member_id() -> None:
    h = stable_group()

    assert_install_refused(
        h,
        lambda: h.install("w9", {}, group_epoch=5, member_epoch=5),
        ErrorCode.UNKNOWN_MEMBER_ID,
    )


@pytest.mark.parametrize("epoch", [4, 6])
def test_prepare_with_a_wrong_member_epoch_is_fenced_without_removing_the_member(
    epoch: int,
) -> None:
    h = stable_group()

    assert_install_refused(
        h,
        lambda: h.prepare("w1", member_epoch=epoch),
        ErrorCode.FENCED_MEMBER_EPOCH,
        f"member epoch {epoch} does not match the coordinator's 5",
    )
    assert h.has_member("w1")


def test_install_with_a_wrong_member_epoch_is_fenced_without_removing_the_member() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL}, member_epoch=4),
        ErrorCode.FENCED_MEMBER_EPOCH,
    )
    assert h.has_member("w1")


def test_prepare_by_a_member_that_is_not_the_assignor_member_is_unknown_member_id() -> None:
    h = stable_group()

    assert_install_refused(
        h, lambda: h.prepare("w2"), ErrorCode.UNKNOWN_MEMBER_ID, "not the group's assignor", "w1"
    )


def test_install_by_a_member_that_is_not_the_assignor_member_is_unknown_member_id() -> None:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")

    assert_install_refused(
        h,
        lambda: h.install("w2", {"w1": ALL}),
        ErrorCode.UNKNOWN_MEMBER_ID,
        "abandon the computation",
    )


# --- what Prepare returns (DESIGN 3.5) ----------------------------------------------------------


def test_prepare_returns_everything_the_assignor_needs() -> None:
    h = catalogue_group()
    h.put_connector("A", 2, {"k": "v"})
    h.alter_configs({"session.timeout.ms": "2000"})
    w1_assignors = (replace(SESSIONED[0], reason=1, metadata=b"w1-meta"), SESSIONED[1])
    h.join("w1", assignors=w1_assignors, url="http://w1")
    h.join("w2", instance_id="i2", assignors=COMPATIBLE)
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE}, assignor_state=b"blob", delay_ms=0)
    h.ack("w1")
    h.ack("w2")
    h.put_connector("C", 1)
    h.sleep(1234)
    h.ack("w1")
    h.ack("w2")

    prepared = h.prepare("w1")

    assert prepared.error_code == ErrorCode.NONE
    assert prepared.group_epoch == h.group_epoch == 6
    assert (prepared.assignor_name, prepared.assignor_version) == ("incremental_cooperative", 1)
    assert prepared.members == (
        PreparedMemberInfo("w1", 5, None, "http://w1", w1_assignors[0], W1_SHARE),
        PreparedMemberInfo("w2", 5, "i2", "", COMPATIBLE[0], W2_SHARE),
    )
    assert prepared.catalogue == (
        ConnectorInfo("A", 2, {}),  # never the config: it carries secrets (issue 16)
        ConnectorInfo("B", 1, {}),
        ConnectorInfo("C", 1, {}),
    )
    assert prepared.assignment_epoch == 5
    assert prepared.target == (MemberTarget("w1", W1_SHARE), MemberTarget("w2", W2_SHARE))
    assert prepared.assignor_state == b"blob"
    assert prepared.group_configs == {  # what assignors read: not the coordinator's own
        **{
            k: v
            for k, v in DEFAULTS.as_map().items()
            if k
            not in (
                "assignor.principals",
                "group.protocol.migration.policy",
                "restart.failed.max.attempts",
                "restart.failed.backoff.ms",
            )
        },
        "session.timeout.ms": "2000",
    }
    assert prepared.coordinator_time_ms == h.now_ms
    assert prepared.scheduled_rebalance_at_ms is None


def test_prepare_records_what_the_install_will_be_validated_against_once() -> None:
    h = stable_group()
    h.join("w3")

    h.prepare("w1")
    assert h.state is not None and h.state.meta.prepared is not None
    assert h.state.meta.prepared.group_epoch == 6
    assert h.state.meta.prepared.member_ids == {"w1", "w2", "w3"}
    assert h.state.meta.prepared.catalogue == ALL

    h.prepare("w1")
    assert h.records_of_last_call == []


# --- Install validation (DESIGN 3.6, 3.9) -----------------------------------------------------


def three_members_prepared() -> GroupHarness:
    h = stable_group()
    h.join("w3")
    h.prepare("w1")
    assert h.group_epoch == 6
    return h


def test_an_install_naming_a_member_not_in_the_group_is_invalid() -> None:
    h = three_members_prepared()

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL, "w9": EMPTY}),
        ErrorCode.INVALID_ASSIGNMENT,
        "member 'w9' was not in the group at epoch 6.",
    )


def test_an_install_assigning_a_resource_not_in_the_catalogue_is_invalid() -> None:
    h = three_members_prepared()

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL | rs("Z", "A-7")}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[Z, A-7] assigned to 'w1' are not in the catalogue of epoch 6.",
    )


def test_an_install_assigning_a_resource_twice_is_invalid() -> None:
    h = three_members_prepared()

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL, "w3": rs("A-1")}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[A-1] assigned more than once.",
    )


def test_an_install_leaving_resources_unassigned_without_a_delay_is_invalid() -> None:
    h = three_members_prepared()

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": W1_SHARE, "w2": rs("B")}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[B-0] left unassigned without a scheduled rebalance delay",
    )


def test_a_refusal_names_at_most_twenty_resources_and_counts_the_rest() -> None:
    """An install that leaves 5,000 tasks unassigned is answered with a message of bounded size
    (it named every one of them, which at 100,000 tasks made a megabyte-long answer)."""
    h = stable_group()
    h.put_connector("big", 5_000)
    h.join("w3")
    h.prepare("w1")
    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[big, big-0, big-1, big-2,",
        "big-18, ... 5,001 in all] left unassigned without a scheduled rebalance delay",
    )
    message = h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE}).error_message
    assert len(message) < 500, message


def test_an_install_may_leave_resources_unassigned_when_it_declares_a_delay() -> None:
    h = three_members_prepared()

    response = h.install("w1", {"w1": W1_SHARE, "w2": rs("B")}, delay_ms=700)

    assert response.error_code == ErrorCode.NONE
    assert h.assignment_epoch == 6
    assert h.target_of("w2") == rs("B")
    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms == h.now_ms + 700
    assert h.deadline((SCHEDULED_REBALANCE, "")) == h.now_ms + 700
    assert EventType.SCHEDULED_REBALANCE_SET in h.events_of_last_call()


def test_an_install_without_a_prepare_is_invalid() -> None:
    h = stable_group()
    h.join("w3")

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL}, group_epoch=6),
        ErrorCode.INVALID_ASSIGNMENT,
        "without a PrepareAssignment",
    )


def test_an_install_older_than_the_last_prepare_is_invalid_and_names_both_epochs() -> None:
    h = three_members_prepared()
    h.join("w4")
    h.prepare("w1")

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL}, group_epoch=6),
        ErrorCode.INVALID_ASSIGNMENT,
        "install for group epoch 6, but the last PrepareAssignment returned epoch 7.",
    )


def test_an_install_for_an_epoch_that_already_has_a_target_is_invalid_and_names_both_epochs() -> (
    None
):
    h = three_members_prepared()
    h.install("w1", {"w1": ALL})

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE}, group_epoch=6),
        ErrorCode.INVALID_ASSIGNMENT,
        "install for group epoch 6, but epoch 6 already has a target installed.",
    )
    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL}, group_epoch=4),
        ErrorCode.INVALID_ASSIGNMENT,
        "install for group epoch 4, but epoch 6 already has a target installed.",
    )


def test_an_install_for_a_future_epoch_is_invalid_and_names_both_epochs() -> None:
    h = three_members_prepared()

    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL}, group_epoch=7),
        ErrorCode.INVALID_ASSIGNMENT,
        "install for group epoch 7, but the group is at epoch 6.",
    )


def test_a_refused_install_keeps_the_previous_target_and_the_request_open() -> None:
    h = three_members_prepared()
    target = h.dump()["target"]

    h.install("w1", {"w1": ALL, "w3": rs("A")})

    assert h.dump()["target"] == target
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert h.install("w1", {"w1": ALL}).error_code == ErrorCode.NONE


# --- a successful install ------------------------------------------------------------------


def test_an_install_replaces_the_target_and_stops_the_compute_requests() -> None:
    h = three_members_prepared()
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT

    response = h.install(
        "w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")}, assignor_state=b"s1"
    )

    assert response.error_code == ErrorCode.NONE
    assert h.assignment_epoch == h.group_epoch == 6
    assert h.target_of("w3") == rs("A-1")
    assert h.state is not None
    assert h.state.target.assignor_state == b"s1"
    assert h.state.meta.compute_requested_epoch is None
    assert h.state.meta.prepared is None
    assert h.deadline((ASSIGNOR, "")) is None
    assert h.keepalive("w1").error_code == ErrorCode.NONE
    assert h.status() is GroupStatus.RECONCILING


def test_the_install_event_lists_the_resources_that_changed_owner() -> None:
    h = three_members_prepared()

    h.install("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")})

    [installed] = h.last_events(EventType.TARGET_INSTALLED)
    assert installed.payload["moves"] == [{"resource": "A-1", "from": "w1", "to": "w3"}]


def test_the_assignor_state_blob_round_trips_to_the_next_prepare() -> None:
    h = three_members_prepared()
    blob = bytes(range(256))
    h.install("w1", {"w1": ALL}, assignor_state=blob)
    h.join("w4")

    prepared = h.prepare("w1")

    assert prepared.assignor_state == blob


def test_an_install_race_with_a_member_that_left_is_accepted_and_a_new_computation_asked() -> None:
    h = three_members_prepared()
    h.leave("w3")
    assert h.group_epoch == 7

    response = h.install("w1", {"w1": W1_SHARE, "w2": rs("B"), "w3": rs("B-0")})

    assert response.error_code == ErrorCode.NONE
    assert h.assignment_epoch == 6
    assert h.state is not None
    assert "w3" not in h.state.target.members
    assert h.target_of("w2") == rs("B")
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    assert "group epoch 7" in h.keepalive("w1").error_message
    assert h.status() is GroupStatus.ASSIGNING


def test_an_install_race_with_a_member_that_joined_gives_it_nothing() -> None:
    h = three_members_prepared()
    h.join("w4")

    response = h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})

    assert response.error_code == ErrorCode.NONE
    assert h.target_of("w4") == EMPTY
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_an_install_race_with_a_deleted_connector_drops_its_resources() -> None:
    h = three_members_prepared()
    h.delete_connector("B")

    response = h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE})

    assert response.error_code == ErrorCode.NONE
    assert h.target_of("w2") == EMPTY


def test_members_keep_reconciling_toward_the_last_target_while_a_new_one_is_computed() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")})
    h.join("w4")

    h.keepalive("w1")
    h.heartbeat("w1", 5, owned=rs("A", "A-0"))
    h.keepalive("w3")

    assert h.member("w3").assigned == rs("A-1")
    assert h.member("w3").member_epoch == 6


# --- assignment errors (DESIGN 3.10) -----------------------------------------------------------


def test_an_assignment_error_keeps_the_previous_target_and_is_visible() -> None:
    h = three_members_prepared()
    target = h.dump()["target"]

    response = h.install("w1", {}, error=3, error_message="boom")

    assert response.error_code == ErrorCode.NONE
    assert h.dump()["target"] == target
    assert h.state is not None
    assert h.state.meta.last_assignment_error == 3
    assert h.state.meta.last_assignment_error_message == "boom"
    assert EventType.ASSIGNOR_FAILED in h.events_of_last_call()


def test_after_an_assignment_error_another_member_is_asked_after_a_backoff() -> None:
    h = three_members_prepared()

    h.install("w1", {}, error=3, error_message="boom")

    assert h.state is not None
    assert h.state.meta.assignor_member_id == "w2"
    assert h.keepalive("w2").error_code == ErrorCode.NONE  # still backing off
    h.sleep(BACKOFF_MS)
    assert h.keepalive("w1").error_code == ErrorCode.NONE
    assert h.keepalive("w2").error_code == ErrorCode.COMPUTE_ASSIGNMENT
    h.compute("w2", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})
    assert h.state.meta.last_assignment_error == 0
    assert h.state.meta.excluded_assignors == frozenset()


def test_after_an_assignment_error_the_only_qualifying_member_is_asked_again() -> None:
    h = catalogue_group()
    h.join("w1")
    h.prepare("w1")

    h.install("w1", {}, error=1)

    assert h.keepalive("w1").error_code == ErrorCode.NONE
    h.sleep(BACKOFF_MS)
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_an_assignment_error_for_an_epoch_that_already_has_a_target_is_invalid() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": ALL})

    assert_install_refused(
        h,
        lambda: h.install("w1", {}, group_epoch=6, error=2),
        ErrorCode.INVALID_ASSIGNMENT,
    )


# --- scheduled rebalances (DESIGN 3.7, 3.9) ---------------------------------------------------


def test_a_scheduled_rebalance_set_by_an_install_fires_by_timer_and_bumps_the_epoch() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": W1_SHARE, "w3": EMPTY, "w2": EMPTY}, delay_ms=400)

    h.run_for(399, "w1", "w2", "w3", step_ms=50)
    assert h.group_epoch == 6
    h.run_for(1, "w1", "w2", "w3")

    assert h.group_epoch == 7
    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms is None
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_a_scheduled_rebalance_fires_also_when_the_assignor_member_is_gone() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY}, delay_ms=400)
    h.leave("w1")
    h.prepare("w2")
    h.install("w2", {"w2": EMPTY, "w3": EMPTY}, delay_ms=400)

    h.run_for(400, "w2", "w3")

    assert h.group_epoch == 8
    assert h.keepalive("w2").error_code == ErrorCode.COMPUTE_ASSIGNMENT


def test_the_scheduled_delay_is_capped_by_the_groups_maximum() -> None:
    h = three_members_prepared()

    h.install("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY}, delay_ms=MAX_DELAY_MS * 10)

    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms == h.now_ms + MAX_DELAY_MS


def test_an_install_without_a_delay_clears_a_pending_scheduled_rebalance() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY}, delay_ms=400)
    h.join("w4")

    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY, "w4": EMPTY})

    assert h.state is not None
    assert h.state.target.scheduled_rebalance_at_ms is None
    assert h.deadline((SCHEDULED_REBALANCE, "")) is None
    h.run_for(1000, "w1", "w2", "w3", "w4")
    assert h.group_epoch == 7


def test_an_install_with_a_new_delay_replaces_the_pending_one() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY}, delay_ms=400)
    h.join("w4")

    h.compute("w1", {"w1": W1_SHARE, "w2": EMPTY, "w3": EMPTY, "w4": EMPTY}, delay_ms=900)

    assert h.deadline((SCHEDULED_REBALANCE, "")) == h.now_ms + 900


def test_a_member_can_still_trigger_a_rebalance_through_its_reason_field() -> None:
    h = three_members_prepared()
    h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})

    h.heartbeat("w1", h.member("w1").member_epoch, assignors=(replace(SESSIONED[0], reason=2),))

    assert h.group_epoch == 7
    assert h.keepalive("w1").error_code == ErrorCode.COMPUTE_ASSIGNMENT


# --- the handlers are pure --------------------------------------------------------------------


def test_prepare_and_install_do_not_touch_the_state_they_are_given() -> None:
    h = three_members_prepared()
    state = h.state
    before = h.dump()
    epoch = h.member("w1").member_epoch

    prepare_assignment(state, PrepareRequest(GROUP, "w1", epoch), h.now_ms, DEFAULTS)
    install_assignment(
        state,
        InstallRequest(GROUP, "w1", epoch, 6, members=(MemberTarget("w1", ALL),)),
        h.now_ms,
        DEFAULTS,
    )

    assert h.dump() == before


def test_an_install_moves_the_members_whose_share_it_does_not_change_to_its_epoch() -> None:
    h = three_members_prepared()

    h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": EMPTY})

    # Every share is what its member runs: all are moved at once, in the install's own
    # records, and are still known to have been told their assignment at 5 (DESIGN 3.21).
    for member_id in ("w1", "w2"):
        assert h.member(member_id).state is MemberState.STABLE
        assert h.member(member_id).member_epoch == 6
        assert h.member(member_id).stable_since_epoch == 5
    assert h.member("w3").member_epoch == 6
    [installed] = h.last_events(EventType.TARGET_INSTALLED)
    assert installed.payload["moved_members"] == ["w1", "w2", "w3"]


@pytest.mark.parametrize("threshold", [0, 1_000_000])
def test_an_install_is_refused_alike_by_connector_and_on_whole_sets(
    threshold: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shares are checked by connector when one is large, as whole sets when all are small:
    the same refusals either way."""
    from connect_protocol import resources
    from coordinator_svc.core import assignment

    monkeypatch.setattr(resources, "BY_CONNECTOR_FROM", threshold)
    monkeypatch.setattr(assignment, "BY_CONNECTOR_FROM", threshold)
    h = three_members_prepared()
    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL, "w3": rs("A-1")}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[A-1] assigned more than once.",
    )
    assert_install_refused(
        h,
        lambda: h.install("w1", {"w1": ALL | rs("Z", "A-7")}),
        ErrorCode.INVALID_ASSIGNMENT,
        "[Z, A-7] assigned to 'w1' are not in the catalogue of epoch 6.",
    )
