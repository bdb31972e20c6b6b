"""Request validation: one case per rule of each API (seed 000's "Request Validation" lists plus
DESIGN 3.1, 3.12 and 2.1's admin calls). Each answers INVALID_REQUEST with a message naming the
rule, writes nothing, and leaves the group exactly as it was."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    AlterConfigsRequest,
    Assignor,
    DeleteConnectorRequest,
    HeartbeatRequest,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
    PutConnectorRequest,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core.admin import alter_configs, delete_connector, put_connector
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.results import Result
from tests.core.harness import DEFAULTS, GROUP, SESSIONED, GroupHarness, rs

LONG = "x" * 250


@pytest.fixture
def h() -> GroupHarness:
    """A group with a catalogue and one member, w1, that is also the assignor member."""
    h = GroupHarness()
    h.put_connector("A", 2)
    h.join("w1", instance_id="i1")
    h.compute("w1", {"w1": rs("A", "A-0", "A-1")})
    h.ack("w1")
    return h


def assert_rejected(h: GroupHarness, call: Any, rule: str) -> None:
    before = h.dump()
    result: Result[Any] = call(h.state)
    assert result.response.error_code == ErrorCode.INVALID_REQUEST, result.response
    assert rule in result.response.error_message
    assert result.records == []
    assert result.timers == []
    assert h.dump() == before


# --- ConnectGroupHeartbeat -----------------------------------------------------------------------

JOIN = HeartbeatRequest(
    GROUP, "w9", 0, rebalance_timeout_ms=500, client_assignors=SESSIONED, owned=EMPTY
)


def _assignor(**changes: Any) -> tuple[Assignor, ...]:
    return (replace(Assignor("incremental_cooperative", 1, 2, version=2), **changes),)


HEARTBEAT_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-must-be-non-empty"),
    pytest.param({"group_id": LONG}, "GroupId must be at most 249", id="group-id-max-length"),
    pytest.param({"member_id": ""}, "MemberId must be non-empty.", id="member-id-non-empty"),
    pytest.param({"member_id": LONG}, "MemberId must be at most 249", id="member-id-max-length"),
    pytest.param({"member_epoch": -3}, "MemberEpoch must be >= -2.", id="member-epoch-at-least-2"),
    pytest.param(
        {"instance_id": ""},
        "InstanceId, if provided, must be non-empty.",
        id="instance-id-if-provided-non-empty",
    ),
    pytest.param(
        {"member_id": "w1", "member_epoch": -2},
        "MemberEpoch -2 (static leave) is accepted only with an InstanceId.",
        id="epoch-minus-2-only-with-instance-id",
    ),
    pytest.param(
        {"rebalance_timeout_ms": None},
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
        id="join-needs-a-rebalance-timeout",
    ),
    pytest.param(
        {"rebalance_timeout_ms": 0},
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
        id="join-rebalance-timeout-must-be-positive",
    ),
    pytest.param(
        {"rebalance_timeout_ms": -1},
        "RebalanceTimeoutMs must be larger than zero in the first heartbeat request",
        id="join-rebalance-timeout-cannot-be-unchanged",
    ),
    pytest.param(
        {"member_id": "w1", "rebalance_timeout_ms": None},
        "(every epoch-0 heartbeat, join or rejoin)",
        id="rejoin-of-a-known-member-needs-a-rebalance-timeout",
    ),
    pytest.param(
        {"member_id": "w1", "member_epoch": 3, "rebalance_timeout_ms": 0},
        "RebalanceTimeoutMs must be larger than zero, or -1 for unchanged.",
        id="later-rebalance-timeout-zero",
    ),
    pytest.param(
        {"member_id": "w1", "member_epoch": 3, "rebalance_timeout_ms": -5},
        "RebalanceTimeoutMs must be larger than zero, or -1 for unchanged.",
        id="later-rebalance-timeout-negative",
    ),
    pytest.param(
        {"server_assignor": "uniform"},
        "ServerAssignor and ClientAssignors cannot be used together.",
        id="server-and-client-assignors-together",
    ),
    pytest.param(
        {"client_assignors": _assignor(name="")},
        "Assignor.Name must be non-empty.",
        id="assignor-name-non-empty",
    ),
    pytest.param(
        {"client_assignors": _assignor(minimum_version=-2, version=0)},
        "Assignor.MinimumVersion must be >= -1",
        id="assignor-minimum-version-at-least-minus-1",
    ),
    pytest.param(
        {"client_assignors": _assignor(minimum_version=-1, maximum_version=-1, version=-1)},
        "Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion",
        id="assignor-maximum-version-non-negative",
    ),
    pytest.param(
        {"client_assignors": _assignor(minimum_version=3, maximum_version=2, version=2)},
        "Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion",
        id="assignor-maximum-version-at-least-minimum",
    ),
    pytest.param(
        {"client_assignors": _assignor(version=0)},
        "Assignor.Version must be >= Assignor.MinimumVersion and <= Assignor.MaximumVersion",
        id="assignor-version-below-range",
    ),
    pytest.param(
        {"client_assignors": _assignor(version=3)},
        "Assignor.Version must be >= Assignor.MinimumVersion and <= Assignor.MaximumVersion",
        id="assignor-version-above-range",
    ),
    pytest.param(
        {"client_assignors": _assignor(reason=128)},
        "Assignor.Reason must fit an int8",
        id="assignor-reason-fits-int8",
    ),
    pytest.param(
        {"client_assignors": SESSIONED + SESSIONED[:1]},
        "Assignor names must be unique in ClientAssignors.",
        id="assignor-names-unique",
    ),
    pytest.param(
        {"owned": ResourceSet.of([""])},
        "connector names must be non-empty",
        id="owned-connector-names-non-empty",
    ),
    pytest.param(
        {"owned": ResourceSet.of([], [("", 0)])},
        "a task's connector must be non-empty",
        id="owned-task-connector-non-empty",
    ),
    pytest.param(
        {"owned": ResourceSet.of([], [TaskId("A", -1)])},
        "task ids must be >= 0",
        id="owned-task-ids-non-negative",
    ),
]


@pytest.mark.parametrize(("changes", "rule"), HEARTBEAT_CASES)
def test_an_invalid_heartbeat_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    req = replace(JOIN, **changes)
    assert_rejected(h, lambda s: heartbeat(s, req, h.now_ms, DEFAULTS), rule)


@pytest.mark.parametrize(("changes", "rule"), HEARTBEAT_CASES[:3])
def test_an_invalid_heartbeat_does_not_create_the_group(changes: dict[str, Any], rule: str) -> None:
    h = GroupHarness()
    req = replace(JOIN, **changes)
    assert_rejected(h, lambda s: heartbeat(s, req, 0, DEFAULTS), rule)
    assert h.state is None


def test_epoch_minus_2_with_an_instance_id_is_valid(h: GroupHarness) -> None:
    response = h.leave("w1", instance_id="i1")

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == -2


def test_a_later_heartbeat_may_mark_the_rebalance_timeout_unchanged_with_minus_1(
    h: GroupHarness,
) -> None:
    epoch = h.member("w1").member_epoch

    response = h.heartbeat("w1", epoch, rebalance_timeout_ms=-1)

    assert response.error_code == ErrorCode.NONE
    assert h.member("w1").rebalance_timeout_ms == 500


# --- ConnectGroupPrepareAssignment -----------------------------------------------------------

PREPARE_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-non-empty"),
    pytest.param({"member_id": ""}, "MemberId must be non-empty.", id="member-id-non-empty"),
    pytest.param({"member_epoch": -1}, "MemberEpoch must be >= 0.", id="member-epoch-at-least-0"),
]


@pytest.mark.parametrize(("changes", "rule"), PREPARE_CASES)
def test_an_invalid_prepare_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    req = replace(PrepareRequest(GROUP, "w1", h.member("w1").member_epoch), **changes)
    assert_rejected(h, lambda s: prepare_assignment(s, req, h.now_ms, DEFAULTS), rule)


# --- ConnectGroupInstallAssignment -----------------------------------------------------------

INSTALL_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-non-empty"),
    pytest.param({"member_id": ""}, "MemberId must be non-empty.", id="member-id-non-empty"),
    pytest.param({"member_epoch": -1}, "MemberEpoch must be >= 0.", id="member-epoch-at-least-0"),
    pytest.param({"group_epoch": -1}, "GroupEpoch must be >= 0.", id="group-epoch-at-least-0"),
    pytest.param(
        {"scheduled_rebalance_delay_ms": -1},
        "ScheduledRebalanceDelayMs must be >= 0.",
        id="delay-non-negative",
    ),
    pytest.param({"error": 128}, "Error must fit an int8.", id="error-fits-int8-high"),
    pytest.param({"error": -129}, "Error must fit an int8.", id="error-fits-int8-low"),
    pytest.param(
        {"members": (MemberTarget("", rs("A")),)},
        "Members[].MemberId must be non-empty.",
        id="members-member-id-non-empty",
    ),
    pytest.param(
        {"members": (MemberTarget("w1", rs("A")), MemberTarget("w1", rs("A-0")))},
        "member w1 is listed twice in Members.",
        id="members-listed-once",
    ),
    pytest.param(
        {"members": (MemberTarget("w1", ResourceSet.of([], [TaskId("A", -1)])),)},
        "Members[w1].ConnectorsAndTasks: task ids must be >= 0",
        id="members-resources-valid",
    ),
]


@pytest.mark.parametrize(("changes", "rule"), INSTALL_CASES)
def test_an_invalid_install_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    h.put_connector("B", 1)
    h.ack("w1")
    prepared = h.prepare("w1")
    base = InstallRequest(
        GROUP,
        "w1",
        h.member("w1").member_epoch,
        prepared.group_epoch,
        members=(MemberTarget("w1", rs("A", "A-0", "A-1", "B", "B-0")),),
    )
    req = replace(base, **changes)
    assert_rejected(h, lambda s: install_assignment(s, req, h.now_ms, DEFAULTS), rule)


# --- ConnectGroupAdmin -----------------------------------------------------------------------

PUT_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-non-empty"),
    pytest.param({"connector": ""}, "Connector must be non-empty.", id="connector-non-empty"),
    pytest.param({"connector": LONG}, "Connector must be at most 249", id="connector-max-length"),
    pytest.param({"task_count": -1}, "TaskCount must be between 0 and", id="task-count-negative"),
    pytest.param({"task_count": 100_001}, "TaskCount must be between 0 and", id="task-count-max"),
]


@pytest.mark.parametrize(("changes", "rule"), PUT_CASES)
def test_an_invalid_put_connector_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    req = replace(PutConnectorRequest(GROUP, "B", 2), **changes)
    assert_rejected(h, lambda s: put_connector(s, req, h.now_ms, DEFAULTS), rule)


def test_an_invalid_put_connector_does_not_create_the_group() -> None:
    h = GroupHarness()
    req = PutConnectorRequest(GROUP, "A", -1)
    assert_rejected(h, lambda s: put_connector(s, req, 0, DEFAULTS), "TaskCount")
    assert h.state is None


DELETE_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-non-empty"),
    pytest.param({"connector": ""}, "Connector must be non-empty.", id="connector-non-empty"),
    pytest.param(
        {"connector": "Z"},
        "connector 'Z' is not in the catalogue of group 'g'.",
        id="connector-must-exist",
    ),
]


@pytest.mark.parametrize(("changes", "rule"), DELETE_CASES)
def test_an_invalid_delete_connector_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    req = replace(DeleteConnectorRequest(GROUP, "A"), **changes)
    assert_rejected(h, lambda s: delete_connector(s, req, h.now_ms, DEFAULTS), rule)


ALTER_CASES = [
    pytest.param({"group_id": ""}, "GroupId must be non-empty.", id="group-id-non-empty"),
    pytest.param(
        {"set": {"session.timeout": "1000"}},
        "unknown group configuration 'session.timeout'",
        id="set-known-keys-only",
    ),
    pytest.param(
        {"unset": ("bogus",)}, "unknown group configuration 'bogus'", id="unset-known-keys-only"
    ),
    pytest.param(
        {"set": {"session.timeout.ms": "2000"}, "unset": ("session.timeout.ms",)},
        "a configuration cannot be both set and unset.",
        id="not-both-set-and-unset",
    ),
    pytest.param(
        {"set": {"session.timeout.ms": "ten"}},
        "session.timeout.ms must be an integer number of milliseconds, got 'ten'.",
        id="values-are-integers",
    ),
    pytest.param(
        {"set": {"session.timeout.ms": "0"}},
        "session.timeout.ms must be >= 1, got 0.",
        id="session-timeout-positive",
    ),
    pytest.param(
        {"set": {"heartbeat.interval.ms": "0"}},
        "heartbeat.interval.ms must be >= 1, got 0.",
        id="heartbeat-interval-positive",
    ),
    pytest.param(
        {"set": {"rebalance.timeout.ms": "-5"}},
        "rebalance.timeout.ms must be >= 1, got -5.",
        id="rebalance-timeout-positive",
    ),
    pytest.param(
        {"set": {"scheduled.rebalance.max.delay.ms": "-1"}},
        "scheduled.rebalance.max.delay.ms must be >= 0, got -1.",
        id="max-delay-non-negative",
    ),
    pytest.param(
        {"set": {"session.timeout.ms": str(2**31)}},
        "session.timeout.ms must fit an int32",
        id="values-fit-int32",
    ),
    pytest.param(
        {"set": {"session.timeout.ms": "500", "heartbeat.interval.ms": "500"}},
        "heartbeat.interval.ms must be smaller than session.timeout.ms.",
        id="interval-below-session-when-both-set",
    ),
    pytest.param(
        {"set": {"heartbeat.interval.ms": "1000"}},
        "heartbeat.interval.ms (1000) must be smaller than session.timeout.ms (1000).",
        id="interval-below-the-effective-session",
    ),
    pytest.param(
        {"set": {"session.timeout.ms": "50"}},
        "heartbeat.interval.ms (100) must be smaller than session.timeout.ms (50).",
        id="session-above-the-effective-interval",
    ),
]


@pytest.mark.parametrize(("changes", "rule"), ALTER_CASES)
def test_an_invalid_alter_configs_is_rejected_and_changes_nothing(
    h: GroupHarness, changes: dict[str, Any], rule: str
) -> None:
    req = replace(AlterConfigsRequest(GROUP), **changes)
    assert_rejected(h, lambda s: alter_configs(s, req, h.now_ms, DEFAULTS), rule)


def test_an_invalid_alter_configs_does_not_create_the_group() -> None:
    h = GroupHarness()
    req = AlterConfigsRequest(GROUP, {"session.timeout.ms": "0"})
    assert_rejected(h, lambda s: alter_configs(s, req, 0, DEFAULTS), ">= 1")
    assert h.state is None


def test_alter_configs_refuses_an_unset_list_longer_than_the_known_keys() -> None:
    """Issue 23: a request list is bounded before it is looped over: `unset` names each key
    at most once."""
    from connect_protocol.configs import CONFIG_KEYS
    from connect_protocol.errors import InvalidRequest
    from connect_protocol.messages import AlterConfigsRequest
    from coordinator_svc.core.validation import validate_alter_configs

    with pytest.raises(InvalidRequest, match="at most once"):
        validate_alter_configs(AlterConfigsRequest("g", {}, (CONFIG_KEYS[0],) * 100_000))
    with pytest.raises(InvalidRequest, match="at most once"):
        validate_alter_configs(AlterConfigsRequest("g", {}, (CONFIG_KEYS[0], CONFIG_KEYS[0])))
    validate_alter_configs(AlterConfigsRequest("g", {}, tuple(CONFIG_KEYS)))


def test_heartbeat_refuses_more_client_assignors_than_the_limit() -> None:
    from connect_protocol.errors import InvalidRequest
    from connect_protocol.messages import Assignor, HeartbeatRequest
    from coordinator_svc.core.validation import MAX_CLIENT_ASSIGNORS, validate_heartbeat

    many = tuple(Assignor(f"a{i}", 0, 0) for i in range(MAX_CLIENT_ASSIGNORS + 1))
    with pytest.raises(InvalidRequest, match="at most"):
        validate_heartbeat(
            HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1000, client_assignors=many)
        )
