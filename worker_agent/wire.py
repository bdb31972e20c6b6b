"""The agent's proto <-> value conversion for what only the agent reads or sends: PrepareAssignment
requests out and answers into the assignor's `GroupView`, its result into an install request,
FindCoordinator requests. Heartbeats, resource sets and assignors: `connect_protocol.wire`.
"""

from __future__ import annotations

from connect.group.v1 import admin_pb2, coordinator_pb2

from connect_protocol.wire import resources_from, resources_to

from .assignor import AssignmentResult, GroupView, MemberView


def find_coordinator_request(group_id: str) -> admin_pb2.FindCoordinatorRequest:
    return admin_pb2.FindCoordinatorRequest(group_id=group_id)


def prepare_request(
    group_id: str, member_id: str, member_epoch: int
) -> coordinator_pb2.ConnectGroupPrepareAssignmentRequest:
    return coordinator_pb2.ConnectGroupPrepareAssignmentRequest(
        group_id=group_id, member_id=member_id, member_epoch=member_epoch
    )


def group_view(msg: coordinator_pb2.ConnectGroupPrepareAssignmentResponse) -> GroupView:
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
                last_grant_at_ms=m.last_grant_at_ms,
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
) -> coordinator_pb2.ConnectGroupInstallAssignmentRequest:
    out = coordinator_pb2.ConnectGroupInstallAssignmentRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=member_epoch,
        group_epoch=group_epoch,
        error=result.error,
        error_message=result.error_message,
        assignor_state=result.assignor_state,
        scheduled_rebalance_delay_ms=result.scheduled_rebalance_delay_ms,
        lost_work_delay_ms=result.lost_work_delay_ms,
        next_wave_delay_ms=result.next_wave_delay_ms,
    )
    for target_member, resources in sorted(result.members.items()):
        entry = out.members.add(member_id=target_member, version=version)
        entry.connectors_and_tasks.SetInParent()
        resources_to(resources, entry.connectors_and_tasks)
    return out
