"""The classic protocol's values survive the wire (connect_protocol/classic_wire.py): every request
and response, through protobuf bytes and back, is the value it was, absent fields staying absent
and empty ones empty (DESIGN 3.19: the embedded protocol is typed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from connect.group.v1 import classic_pb2
from hypothesis import given
from hypothesis import strategies as st

from connect_protocol import classic_wire as cw
from connect_protocol.classic_messages import (
    PROTOCOL_TYPE,
    PROTOCOL_VERSIONS,
    ClassicHeartbeatRequest,
    ClassicHeartbeatResponse,
    ClassicProtocol,
    ConnectWorkerAssignment,
    ConnectWorkerMetadata,
    JoinGroupMember,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    LeavingMember,
    LeftMember,
    SyncGroupAssignment,
    SyncGroupRequest,
    SyncGroupResponse,
    protocol_version,
)
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import ConnectorInfo
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens

V = TypeVar("V")

ids = st.text(max_size=20)
names = st.text(min_size=1, max_size=12)
int32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
int64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
codes = st.sampled_from(list(ErrorCode))
optional_text = st.none() | st.text(max_size=20)
resource_sets = st.builds(
    ResourceSet.of,
    st.sets(names, max_size=4),
    st.sets(st.builds(TaskId, names, st.integers(0, 500)), max_size=12),
)
token_maps = st.builds(
    FencingTokens,
    st.dictionaries(
        st.one_of(names, st.builds(TaskId, names, st.integers(0, 500))),
        st.integers(1, 2**62),
        max_size=8,
    ),
)
metadata = st.builds(
    ConnectWorkerMetadata,
    version=st.integers(0, 2),
    url=st.text(max_size=30),
    config_offset=int64,
    allocation=st.none() | resource_sets,
)
assignments = st.builds(
    ConnectWorkerAssignment,
    version=st.integers(0, 2),
    error=int32,
    leader=ids,
    leader_url=st.text(max_size=30),
    config_offset=int64,
    assignment=resource_sets,
    revoked=st.none() | resource_sets,
    delay=int32,
    tokens=token_maps,
)


def round_trip(
    value: V, to_wire: Callable[[V], Any], from_wire: Callable[[Any], V], message: type[Any]
) -> V:
    return from_wire(message.FromString(to_wire(value).SerializeToString()))


@given(
    st.builds(
        JoinGroupRequest,
        group_id=ids,
        session_timeout_ms=int32,
        rebalance_timeout_ms=int32,
        member_id=ids,
        group_instance_id=optional_text,
        protocol_type=st.text(max_size=10),
        protocols=st.lists(st.builds(ClassicProtocol, names, metadata), max_size=3).map(tuple),
        reason=optional_text,
    )
)
def test_join_group_request_round_trips(value: JoinGroupRequest) -> None:
    back = round_trip(
        value, cw.join_request_to_wire, cw.join_request_from_wire, classic_pb2.JoinGroupRequest
    )
    assert back == value


@given(
    st.builds(
        JoinGroupResponse,
        error_code=codes,
        error_message=st.text(max_size=20),
        generation_id=int32,
        protocol_type=st.text(max_size=10),
        protocol_name=st.text(max_size=10),
        leader=ids,
        member_id=ids,
        members=st.lists(st.builds(JoinGroupMember, ids, metadata, optional_text), max_size=4).map(
            tuple
        ),
        catalogue=st.lists(
            st.builds(ConnectorInfo, names, st.integers(0, 1000), st.just({})), max_size=4
        ).map(tuple),
        withheld=resource_sets,
        group_configs=st.dictionaries(names, st.text(max_size=10), max_size=3),
        coordinator_time_ms=int64,
        skip_assignment=st.booleans(),
        throttle_time_ms=int32,
    )
)
def test_join_group_response_round_trips(value: JoinGroupResponse) -> None:
    back = round_trip(
        value, cw.join_response_to_wire, cw.join_response_from_wire, classic_pb2.JoinGroupResponse
    )
    assert back == value


@given(
    st.builds(
        SyncGroupRequest,
        group_id=ids,
        generation_id=int32,
        member_id=ids,
        group_instance_id=optional_text,
        protocol_type=optional_text,
        protocol_name=optional_text,
        assignments=st.lists(st.builds(SyncGroupAssignment, ids, assignments), max_size=4).map(
            tuple
        ),
    )
)
def test_sync_group_request_round_trips(value: SyncGroupRequest) -> None:
    back = round_trip(
        value, cw.sync_request_to_wire, cw.sync_request_from_wire, classic_pb2.SyncGroupRequest
    )
    assert back == value


@given(
    st.builds(
        SyncGroupResponse,
        error_code=codes,
        error_message=st.text(max_size=20),
        protocol_type=st.text(max_size=10),
        protocol_name=st.text(max_size=10),
        assignment=st.none() | assignments,
        lifecycle_revision=int64,
        throttle_time_ms=int32,
    )
)
def test_sync_group_response_round_trips(value: SyncGroupResponse) -> None:
    back = round_trip(
        value, cw.sync_response_to_wire, cw.sync_response_from_wire, classic_pb2.SyncGroupResponse
    )
    assert back == value


@given(st.builds(ClassicHeartbeatRequest, ids, int32, ids, optional_text))
def test_heartbeat_request_round_trips(value: ClassicHeartbeatRequest) -> None:
    back = round_trip(
        value,
        cw.heartbeat_request_to_wire,
        cw.heartbeat_request_from_wire,
        classic_pb2.HeartbeatRequest,
    )
    assert back == value


@given(st.builds(ClassicHeartbeatResponse, codes, st.text(max_size=20), int64, int32))
def test_heartbeat_response_round_trips(value: ClassicHeartbeatResponse) -> None:
    back = round_trip(
        value,
        cw.heartbeat_response_to_wire,
        cw.heartbeat_response_from_wire,
        classic_pb2.HeartbeatResponse,
    )
    assert back == value


@given(
    st.builds(
        LeaveGroupRequest,
        ids,
        st.lists(st.builds(LeavingMember, ids, optional_text, optional_text), max_size=4).map(
            tuple
        ),
    )
)
def test_leave_group_request_round_trips(value: LeaveGroupRequest) -> None:
    back = round_trip(
        value, cw.leave_request_to_wire, cw.leave_request_from_wire, classic_pb2.LeaveGroupRequest
    )
    assert back == value


@given(
    st.builds(
        LeaveGroupResponse,
        codes,
        st.text(max_size=20),
        st.lists(
            st.builds(LeftMember, ids, codes, st.text(max_size=20), optional_text), max_size=4
        ).map(tuple),
        int32,
    )
)
def test_leave_group_response_round_trips(value: LeaveGroupResponse) -> None:
    back = round_trip(
        value,
        cw.leave_response_to_wire,
        cw.leave_response_from_wire,
        classic_pb2.LeaveGroupResponse,
    )
    assert back == value


def test_version_0_metadata_has_no_allocation_on_the_wire_and_an_empty_one_is_kept() -> None:
    eager = cw.metadata_to(ConnectWorkerMetadata(version=0, url="http://w1"))
    assert not eager.HasField("allocation")
    cooperative = cw.metadata_to(ConnectWorkerMetadata(version=1, allocation=EMPTY))
    assert cooperative.HasField("allocation")
    decoded = cw.metadata_from(
        classic_pb2.ConnectWorkerMetadata.FromString(cooperative.SerializeToString())
    )
    assert decoded.allocation == EMPTY


def test_an_assignment_always_carries_its_set_and_revoked_only_when_given() -> None:
    eager = cw.assignment_to(ConnectWorkerAssignment(version=0))
    assert eager.HasField("assignment") and not eager.HasField("revoked")
    cooperative = cw.assignment_to(ConnectWorkerAssignment(version=1, revoked=EMPTY))
    assert cooperative.HasField("revoked")


def test_a_code_the_client_does_not_know_reads_as_unknown_server_error() -> None:
    msg = classic_pb2.HeartbeatResponse()
    msg.error_code = 4242  # type: ignore[assignment]
    back = cw.heartbeat_response_from_wire(
        classic_pb2.HeartbeatResponse.FromString(msg.SerializeToString())
    )
    assert back.error_code is ErrorCode.UNKNOWN_SERVER_ERROR


def test_connects_protocol_names_and_versions() -> None:
    assert PROTOCOL_TYPE == "connect"
    assert dict(PROTOCOL_VERSIONS) == {"default": 0, "compatible": 1, "sessioned": 2}
    assert protocol_version("sessioned") == 2
    assert protocol_version("cooperative") is None
