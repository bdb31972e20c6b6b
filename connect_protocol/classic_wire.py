"""The classic protocol's wire (DESIGN 3.19): protobuf (`connect.group.v1.classic_pb2`) <->
`classic_messages` values, both directions for every message, so the coordinator and the agent's
classic mode share one conversion. Resource sets and fencing tokens go through `wire` (its caches
for large sets included)."""

from __future__ import annotations

from collections.abc import Iterable

from connect.group.v1 import classic_pb2

from .classic_messages import (
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
)
from .messages import ConnectorInfo
from .wire import error_code, resources_from, resources_to, tokens_from, tokens_to, wire_code

# --- the embedded protocol ----------------------------------------------------------------


def metadata_to(
    value: ConnectWorkerMetadata, out: classic_pb2.ConnectWorkerMetadata | None = None
) -> classic_pb2.ConnectWorkerMetadata:
    msg = out if out is not None else classic_pb2.ConnectWorkerMetadata()
    msg.version = value.version
    msg.url = value.url
    msg.config_offset = value.config_offset
    if value.allocation is not None:
        msg.allocation.SetInParent()
        resources_to(value.allocation, msg.allocation)
    return msg


def metadata_from(msg: classic_pb2.ConnectWorkerMetadata) -> ConnectWorkerMetadata:
    return ConnectWorkerMetadata(
        version=msg.version,
        url=msg.url,
        config_offset=msg.config_offset,
        allocation=resources_from(msg.allocation) if msg.HasField("allocation") else None,
    )


def assignment_to(
    value: ConnectWorkerAssignment, out: classic_pb2.ConnectWorkerAssignment | None = None
) -> classic_pb2.ConnectWorkerAssignment:
    """`value` as a message; `assignment` is always present (possibly empty), `revoked` only
    when not None."""
    msg = out if out is not None else classic_pb2.ConnectWorkerAssignment()
    msg.version = value.version
    msg.error = value.error
    msg.leader = value.leader
    msg.leader_url = value.leader_url
    msg.config_offset = value.config_offset
    msg.assignment.SetInParent()
    resources_to(value.assignment, msg.assignment)
    if value.revoked is not None:
        msg.revoked.SetInParent()
        resources_to(value.revoked, msg.revoked)
    msg.delay = value.delay
    if value.tokens:
        tokens_to(value.tokens, msg)
    return msg


def assignment_from(msg: classic_pb2.ConnectWorkerAssignment) -> ConnectWorkerAssignment:
    return ConnectWorkerAssignment(
        version=msg.version,
        error=msg.error,
        leader=msg.leader,
        leader_url=msg.leader_url,
        config_offset=msg.config_offset,
        assignment=resources_from(msg.assignment),
        revoked=resources_from(msg.revoked) if msg.HasField("revoked") else None,
        delay=msg.delay,
        tokens=tokens_from(msg.fencing_tokens),
    )


def _optional(msg: object, name: str) -> str | None:
    return getattr(msg, name) if msg.HasField(name) else None  # type: ignore[attr-defined]


# --- JoinGroup ----------------------------------------------------------------------------


def join_request_to_wire(req: JoinGroupRequest) -> classic_pb2.JoinGroupRequest:
    out = classic_pb2.JoinGroupRequest(
        group_id=req.group_id,
        session_timeout_ms=req.session_timeout_ms,
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        member_id=req.member_id,
        protocol_type=req.protocol_type,
    )
    if req.group_instance_id is not None:
        out.group_instance_id = req.group_instance_id
    for p in req.protocols:
        entry = out.protocols.add(name=p.name)
        metadata_to(p.metadata, entry.metadata)
        entry.metadata.SetInParent()
    if req.reason is not None:
        out.reason = req.reason
    return out


def join_request_from_wire(msg: classic_pb2.JoinGroupRequest) -> JoinGroupRequest:
    return JoinGroupRequest(
        group_id=msg.group_id,
        session_timeout_ms=msg.session_timeout_ms,
        rebalance_timeout_ms=msg.rebalance_timeout_ms,
        member_id=msg.member_id,
        group_instance_id=_optional(msg, "group_instance_id"),
        protocol_type=msg.protocol_type,
        protocols=tuple(ClassicProtocol(p.name, metadata_from(p.metadata)) for p in msg.protocols),
        reason=_optional(msg, "reason"),
    )


def _catalogue_to(catalogue: Iterable[ConnectorInfo], out: classic_pb2.JoinGroupResponse) -> None:
    for c in catalogue:  # names and task counts only: a leader is never shown configs
        out.catalogue.add(name=c.name, task_count=c.task_count)


def join_response_to_wire(resp: JoinGroupResponse) -> classic_pb2.JoinGroupResponse:
    out = classic_pb2.JoinGroupResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        generation_id=resp.generation_id,
        protocol_type=resp.protocol_type,
        protocol_name=resp.protocol_name,
        leader=resp.leader,
        skip_assignment=resp.skip_assignment,
        member_id=resp.member_id,
        coordinator_time_ms=resp.coordinator_time_ms,
    )
    for m in resp.members:
        entry = out.members.add(member_id=m.member_id)
        if m.group_instance_id is not None:
            entry.group_instance_id = m.group_instance_id
        metadata_to(m.metadata, entry.metadata)
        entry.metadata.SetInParent()
    _catalogue_to(resp.catalogue, out)
    if resp.withheld:
        resources_to(resp.withheld, out.withheld)
    out.group_configs.update(resp.group_configs)
    return out


def join_response_from_wire(msg: classic_pb2.JoinGroupResponse) -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        generation_id=msg.generation_id,
        protocol_type=msg.protocol_type,
        protocol_name=msg.protocol_name,
        leader=msg.leader,
        member_id=msg.member_id,
        members=tuple(
            JoinGroupMember(
                m.member_id, metadata_from(m.metadata), _optional(m, "group_instance_id")
            )
            for m in msg.members
        ),
        catalogue=tuple(ConnectorInfo(c.name, c.task_count, {}) for c in msg.catalogue),
        withheld=resources_from(msg.withheld),
        group_configs=dict(msg.group_configs),
        coordinator_time_ms=msg.coordinator_time_ms,
        skip_assignment=msg.skip_assignment,
        throttle_time_ms=msg.throttle_time_ms,
    )


# --- SyncGroup ----------------------------------------------------------------------------


def sync_request_to_wire(req: SyncGroupRequest) -> classic_pb2.SyncGroupRequest:
    out = classic_pb2.SyncGroupRequest(
        group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id
    )
    if req.group_instance_id is not None:
        out.group_instance_id = req.group_instance_id
    if req.protocol_type is not None:
        out.protocol_type = req.protocol_type
    if req.protocol_name is not None:
        out.protocol_name = req.protocol_name
    for a in req.assignments:
        entry = out.assignments.add(member_id=a.member_id)
        assignment_to(a.assignment, entry.assignment)
    return out


def sync_request_from_wire(msg: classic_pb2.SyncGroupRequest) -> SyncGroupRequest:
    return SyncGroupRequest(
        group_id=msg.group_id,
        generation_id=msg.generation_id,
        member_id=msg.member_id,
        group_instance_id=_optional(msg, "group_instance_id"),
        protocol_type=_optional(msg, "protocol_type"),
        protocol_name=_optional(msg, "protocol_name"),
        assignments=tuple(
            SyncGroupAssignment(a.member_id, assignment_from(a.assignment)) for a in msg.assignments
        ),
    )


def sync_response_to_wire(resp: SyncGroupResponse) -> classic_pb2.SyncGroupResponse:
    out = classic_pb2.SyncGroupResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        protocol_type=resp.protocol_type,
        protocol_name=resp.protocol_name,
        lifecycle_revision=resp.lifecycle_revision,
    )
    if resp.assignment is not None:
        assignment_to(resp.assignment, out.assignment)
    return out


def sync_response_from_wire(msg: classic_pb2.SyncGroupResponse) -> SyncGroupResponse:
    return SyncGroupResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        protocol_type=msg.protocol_type,
        protocol_name=msg.protocol_name,
        assignment=assignment_from(msg.assignment) if msg.HasField("assignment") else None,
        lifecycle_revision=msg.lifecycle_revision,
        throttle_time_ms=msg.throttle_time_ms,
    )


# --- Heartbeat ----------------------------------------------------------------------------


def heartbeat_request_to_wire(req: ClassicHeartbeatRequest) -> classic_pb2.HeartbeatRequest:
    out = classic_pb2.HeartbeatRequest(
        group_id=req.group_id, generation_id=req.generation_id, member_id=req.member_id
    )
    if req.group_instance_id is not None:
        out.group_instance_id = req.group_instance_id
    return out


def heartbeat_request_from_wire(msg: classic_pb2.HeartbeatRequest) -> ClassicHeartbeatRequest:
    return ClassicHeartbeatRequest(
        group_id=msg.group_id,
        generation_id=msg.generation_id,
        member_id=msg.member_id,
        group_instance_id=_optional(msg, "group_instance_id"),
    )


def heartbeat_response_to_wire(resp: ClassicHeartbeatResponse) -> classic_pb2.HeartbeatResponse:
    return classic_pb2.HeartbeatResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        lifecycle_revision=resp.lifecycle_revision,
    )


def heartbeat_response_from_wire(msg: classic_pb2.HeartbeatResponse) -> ClassicHeartbeatResponse:
    return ClassicHeartbeatResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        lifecycle_revision=msg.lifecycle_revision,
        throttle_time_ms=msg.throttle_time_ms,
    )


# --- LeaveGroup ---------------------------------------------------------------------------


def leave_request_to_wire(req: LeaveGroupRequest) -> classic_pb2.LeaveGroupRequest:
    out = classic_pb2.LeaveGroupRequest(group_id=req.group_id)
    for m in req.members:
        entry = out.members.add(member_id=m.member_id)
        if m.group_instance_id is not None:
            entry.group_instance_id = m.group_instance_id
        if m.reason is not None:
            entry.reason = m.reason
    return out


def leave_request_from_wire(msg: classic_pb2.LeaveGroupRequest) -> LeaveGroupRequest:
    return LeaveGroupRequest(
        group_id=msg.group_id,
        members=tuple(
            LeavingMember(m.member_id, _optional(m, "group_instance_id"), _optional(m, "reason"))
            for m in msg.members
        ),
    )


def leave_response_to_wire(resp: LeaveGroupResponse) -> classic_pb2.LeaveGroupResponse:
    out = classic_pb2.LeaveGroupResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
    )
    for m in resp.members:
        entry = out.members.add(
            member_id=m.member_id, error_code=wire_code(m.error_code), error_message=m.error_message
        )
        if m.group_instance_id is not None:
            entry.group_instance_id = m.group_instance_id
    return out


def leave_response_from_wire(msg: classic_pb2.LeaveGroupResponse) -> LeaveGroupResponse:
    return LeaveGroupResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        members=tuple(
            LeftMember(
                m.member_id,
                error_code(m.error_code),
                m.error_message,
                _optional(m, "group_instance_id"),
            )
            for m in msg.members
        ),
        throttle_time_ms=msg.throttle_time_ms,
    )
