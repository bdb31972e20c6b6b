"""Client-side proto <-> value conversion for the agent: heartbeat requests out, responses in,
PrepareAssignment answers into the assignor's `GroupView`, its result into an install request.

The server side's converters (`coordinator_svc.grpc_api.convert`) go the other way; the shared
pieces (resource sets, assignor entries) are reused from there.
"""

from __future__ import annotations

from typing import Any

from connect.group.v1 import coordinator_pb2

from coordinator_svc.core.errors import ErrorCode
from coordinator_svc.core.messages import AssignmentMessage, HeartbeatRequest, HeartbeatResponse
from coordinator_svc.grpc_api.convert import assignor_to, resources_from, resources_to

from .assignor import AssignmentResult, GroupView, MemberView


def heartbeat_request(req: HeartbeatRequest) -> Any:
    out = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch
    )
    if req.instance_id is not None:
        out.instance_id = req.instance_id
    if req.rebalance_timeout_ms is not None:
        out.rebalance_timeout_ms = req.rebalance_timeout_ms
    if req.server_assignor is not None:
        out.server_assignor = req.server_assignor
    if req.client_assignors is not None:
        out.client_assignors.SetInParent()
        out.client_assignors.assignors.extend(assignor_to(a) for a in req.client_assignors)
    if req.owned is not None:
        out.connectors_and_tasks.SetInParent()
        resources_to(req.owned, out.connectors_and_tasks)
    if req.url is not None:
        out.url = req.url
    return out


def error_code(value: int) -> ErrorCode:
    """A wire error code as the enum; codes this client does not know are UNKNOWN_SERVER_ERROR."""
    try:
        return ErrorCode(value)
    except ValueError:
        return ErrorCode.UNKNOWN_SERVER_ERROR


def heartbeat_response(msg: Any) -> HeartbeatResponse:
    assignment = None
    if msg.HasField("assignment"):
        a = msg.assignment
        assignment = AssignmentMessage(
            resources_from(a.connectors_and_tasks), a.version, bytes(a.metadata), a.error
        )
    return HeartbeatResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        member_epoch=msg.member_epoch,
        heartbeat_interval_ms=msg.heartbeat_interval_ms,
        session_timeout_ms=msg.session_timeout_ms,
        assignment=assignment,
    )


def group_view(msg: Any) -> GroupView:
    """A PrepareAssignment answer (error_code NONE) as the assignor's input."""
    return GroupView(
        group_epoch=msg.group_epoch,
        assignor_name=msg.assignor_name,
        assignor_version=msg.assignor_version,
        members=tuple(
            MemberView(
                member_id=m.member_id,
                instance_id=m.instance_id if m.HasField("instance_id") else None,
                url=m.url,
                member_epoch=m.member_epoch,
                reason=m.assignor.reason,
                version=m.assignor.version,
                metadata=bytes(m.assignor.metadata),
                owned=resources_from(m.connectors_and_tasks),
            )
            for m in msg.members
        ),
        catalogue={c.name: c.task_count for c in msg.catalogue},
        assignment_epoch=msg.assignment_epoch,
        target={t.member_id: resources_from(t.connectors_and_tasks) for t in msg.target_assignment},
        assignor_state=bytes(msg.assignor_state),
        configs=dict(msg.group_configs),
        coordinator_time_ms=msg.coordinator_time_ms,
        scheduled_rebalance_at_ms=(
            msg.scheduled_rebalance_at_ms if msg.HasField("scheduled_rebalance_at_ms") else None
        ),
    )


def install_request(
    group_id: str,
    member_id: str,
    member_epoch: int,
    group_epoch: int,
    result: AssignmentResult,
    version: int,
) -> Any:
    out = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=member_epoch,
        group_epoch=group_epoch,
        error=result.error,
        error_message=result.error_message,
        assignor_state=result.assignor_state,
        scheduled_rebalance_delay_ms=result.scheduled_rebalance_delay_ms,
    )
    for target_member, resources in sorted(result.members.items()):
        entry = out.members.add(member_id=target_member, version=version)
        entry.connectors_and_tasks.SetInParent()
        resources_to(resources, entry.connectors_and_tasks)
    return out
