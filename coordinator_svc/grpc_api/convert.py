"""Proto <-> core conversion on the server for what only the coordinator reads or sends (Prepare,
Install, the admin calls, describe, list); what both sides exchange is in `connect_protocol.wire`.

DescribeGroups and ListGroups show each group's type; a classic group (DESIGN 3.19) its classic
state, generation, protocol, leader and join round, and each member its protocol."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, cast

from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2
from google.protobuf.message import Message

from connect_protocol.configs import ASSIGNMENT_INTERVAL, HIDDEN_VALUE
from connect_protocol.errors import ErrorCode, InvalidRequest
from connect_protocol.lifecycle_messages import (
    RestartRequest,
    RestartResponse,
    TargetState,
    TargetStateRequest,
    TargetStateResponse,
)
from connect_protocol.lifecycle_wire import TARGET_STATE_NUMBERS
from connect_protocol.messages import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DeleteConnectorRequest,
    DeleteConnectorResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    InstallRequest,
    InstallResponse,
    MemberTarget,
    PrepareRequest,
    PrepareResponse,
    PutConnectorRequest,
    PutConnectorResponse,
    RemoveMemberRequest,
    RemoveMemberResponse,
)
from connect_protocol.resources import ResourceSet
from connect_protocol.wire import (
    assignor_to,
    resources_bytes,
    resources_from,
    resources_to,
    tokens_to,
    wire_code,
)
from connect_protocol.wire_entries import length_delimited

from ..core.acls import AclEntry, Operation, PatternType, Permission, ResourceType
from ..core.classic_model import PROTOCOL_TYPE, ClassicState
from ..core.features import FEATURES
from ..core.model import (
    CONNECTOR_TASK,
    GroupConfigDefaults,
    GroupState,
    Member,
    StatusState,
    next_compute_request_ms,
)
from ..core.status import StatusView
from ..core.validation import MAX_NAME_LENGTH, MAX_PRINCIPAL_LENGTH, validate_text
from ..runtime.groups import ListedGroup
from ..store.features import FeatureChange


def prepare_request(msg: coordinator_pb2.ConnectGroupPrepareAssignmentRequest) -> PrepareRequest:
    return PrepareRequest(msg.group_id, msg.member_id, msg.member_epoch)


def prepare_response(
    resp: PrepareResponse,
) -> coordinator_pb2.ConnectGroupPrepareAssignmentResponse:
    """The answer as a message (`prepare_response_bytes` parsed)."""
    return coordinator_pb2.ConnectGroupPrepareAssignmentResponse.FromString(
        prepare_response_bytes(resp)
    )


_PREPARED_MEMBERS = coordinator_pb2.ConnectGroupPrepareAssignmentResponse.MEMBERS_FIELD_NUMBER
_TARGET_ENTRIES = (
    coordinator_pb2.ConnectGroupPrepareAssignmentResponse.TARGET_ASSIGNMENT_FIELD_NUMBER
)
_PREPARED_OWNED = coordinator_pb2.PreparedMember.CONNECTORS_AND_TASKS_FIELD_NUMBER
_TARGET_RESOURCES = common_pb2.MemberAssignment.CONNECTORS_AND_TASKS_FIELD_NUMBER


def prepare_response_bytes(resp: PrepareResponse) -> bytes:
    """The answer's wire bytes, each member's owned set and target share joined from their
    kept entries (`resources_bytes`) without a protobuf object per task: a 100,000-task
    group's Prepare was built into a message of 200,000 task entries and serialized again
    (issue 24). The fields are those protobuf writes, the repeated ones in order; every set
    is present, an empty one too (`PreparedMember.connectors_and_tasks` is always present)."""
    head = coordinator_pb2.ConnectGroupPrepareAssignmentResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
        assignor_name=resp.assignor_name,
        assignor_version=resp.assignor_version,
        assignment_epoch=resp.assignment_epoch,
        assignor_state=resp.assignor_state,
        coordinator_time_ms=resp.coordinator_time_ms,
    )
    for c in resp.catalogue:
        head.catalogue.add(name=c.name, task_count=c.task_count)  # never the config (secrets)
    head.group_configs.update(resp.group_configs)
    if resp.scheduled_rebalance_at_ms is not None:
        head.scheduled_rebalance_at_ms = resp.scheduled_rebalance_at_ms
    parts = [head.SerializeToString()]
    for m in resp.members:
        pm = coordinator_pb2.PreparedMember(
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            url=m.url,
            assignor=assignor_to(m.assignor),
            last_grant_at_ms=m.last_grant_at_ms,
        )
        if m.instance_id is not None:
            pm.instance_id = m.instance_id
        parts.append(_entry(_PREPARED_MEMBERS, pm, _PREPARED_OWNED, m.owned))
    for t in resp.target:
        entry = common_pb2.MemberAssignment(
            member_id=t.member_id, version=t.version, metadata=t.metadata
        )
        parts.append(_entry(_TARGET_ENTRIES, entry, _TARGET_RESOURCES, t.resources))
    return b"".join(parts)


def _entry(field: int, message: Message, set_field: int, resources: ResourceSet) -> bytes:
    """`message` with `resources` in its ConnectorsAndTasks field `set_field`, as an entry of
    the repeated field `field`."""
    data = message.SerializeToString() + length_delimited(set_field, resources_bytes(resources))
    return length_delimited(field, data)


def install_request(msg: coordinator_pb2.ConnectGroupInstallAssignmentRequest) -> InstallRequest:
    return InstallRequest(
        group_id=msg.group_id,
        member_id=msg.member_id,
        member_epoch=msg.member_epoch,
        group_epoch=msg.group_epoch,
        error=msg.error,
        error_message=msg.error_message,
        members=tuple(
            MemberTarget(
                m.member_id, resources_from(m.connectors_and_tasks), m.version, bytes(m.metadata)
            )
            for m in msg.members
        ),
        assignor_state=bytes(msg.assignor_state),
        scheduled_rebalance_delay_ms=msg.scheduled_rebalance_delay_ms,
        lost_work_delay_ms=msg.lost_work_delay_ms,
        next_wave_delay_ms=msg.next_wave_delay_ms,
    )


def install_response(
    resp: InstallResponse,
) -> coordinator_pb2.ConnectGroupInstallAssignmentResponse:
    return coordinator_pb2.ConnectGroupInstallAssignmentResponse(
        error_code=wire_code(resp.error_code), error_message=resp.error_message
    )


def put_connector_request(msg: admin_pb2.PutConnectorRequest, caller: str) -> PutConnectorRequest:
    return PutConnectorRequest(
        msg.group_id, msg.connector, msg.task_count, dict(msg.config), caller
    )


def delete_connector_request(
    msg: admin_pb2.DeleteConnectorRequest, caller: str
) -> DeleteConnectorRequest:
    return DeleteConnectorRequest(msg.group_id, msg.connector, caller)


def alter_configs_request(
    msg: admin_pb2.AlterGroupConfigsRequest, caller: str
) -> AlterConfigsRequest:
    return AlterConfigsRequest(msg.group_id, dict(msg.set), tuple(msg.unset), caller)


def described_group(
    state: GroupState,
    defaults: GroupConfigDefaults,
    now_ms: int,
    assignor_reason: str,
    assignor_name: str,
    config_values: bool = False,
    statuses: Sequence[StatusView] | None = None,
    into: admin_pb2.DescribedGroup | None = None,
) -> admin_pb2.DescribedGroup:
    """The group as DescribeGroups shows it; connector config values only if `config_values`
    (else every value reads HIDDEN_VALUE; the digest tells configs apart). A classic group has
    no assignor member (its leader computes): `assignor_reason` and `assignor_name` are not
    shown for it; its `classic` block is. Written into `into` (an empty message: an entry of
    the answer, so that a 100,000-task description is not copied into it), if given."""
    classic = state.meta.is_classic
    head = admin_pb2.DescribedGroup(
        group_id=state.group_id,
        group_type=state.meta.group_type.value,
        state=state.display_state(),
        group_epoch=state.group_epoch,
        assignment_epoch=state.assignment_epoch,
        assignor_name="" if classic else assignor_name,
        assignor_member_id=state.meta.assignor_member_id or "",
        assignor_unavailable_reason="" if classic else assignor_reason,
        last_assignment_error=state.meta.last_assignment_error,
        last_assignment_error_message=state.meta.last_assignment_error_message,
        coordinator_time_ms=now_ms,
        assignor_state=state.target.assignor_state,
    )
    out = head
    if into is not None:
        into.MergeFrom(head)
        out = into
    if classic:
        _describe_classic(state, out.classic)
    target = state.target
    if target.scheduled_rebalance_at_ms is not None:
        out.scheduled_rebalance_at_ms = target.scheduled_rebalance_at_ms
    if target.lost_work_rebalance_at_ms is not None:
        out.lost_work_rebalance_at_ms = target.lost_work_rebalance_at_ms
    if target.next_wave_at_ms is not None:
        out.next_wave_at_ms = target.next_wave_at_ms
    meta = state.meta
    if not classic:  # assignment batching is the connect protocol's (DESIGN 3.21)
        next_request = next_compute_request_ms(meta, state.config(ASSIGNMENT_INTERVAL, defaults))
        if next_request is not None:
            out.next_assignment_request_at_ms = next_request
        if meta.compute_requested_epoch is not None:
            out.assignment_requested_epoch = meta.compute_requested_epoch
    for c in sorted(state.catalogue.values(), key=lambda c: c.name):
        config = dict(c.config) if config_values else dict.fromkeys(c.config, HIDDEN_VALUE)
        out.catalogue.add(
            name=c.name,
            task_count=c.task_count,
            config=config,
            config_digest=c.config_digest,
            target_state=cast(common_pb2.TargetState, TARGET_STATE_NUMBERS[c.target_state]),
        )
    out.group_configs.update({**defaults.as_map(), **state.configs})
    for m in sorted(state.members.values(), key=lambda m: m.member_id):
        dm = out.members.add(
            member_id=m.member_id,
            url=m.url,
            member_epoch=m.member_epoch,
            state=m.state.value,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
        )
        if m.instance_id is not None:
            dm.instance_id = m.instance_id
        resources_to(m.assigned, dm.current_assignment)
        resources_to(m.pending_revocation, dm.pending_revocation)
        tokens_to(m.tokens, dm)
        resources_to(state.target.of(m.member_id).resources, dm.target_assignment)
        dm.assignors.extend(assignor_to(a) for a in m.assignors)
        dm.group_protocol = m.group_protocol.value
        if m.classic is not None:
            _describe_classic_member(state, m, dm.classic)
    if statuses is not None:
        add_status = out.statuses.add
        for v in statuses:
            entry = add_status(
                connector=v.connector,
                state=cast(common_pb2.ResourceState, STATUS_NUMBERS[v.state]),
                worker_id=v.worker_id,
                worker_url=v.worker_url,
                trace=v.trace,
                restart_count=v.restart_count,
                fencing_token=v.token,
                reported_at_ms=v.reported_at_ms,
                auto_restart_attempts=v.auto_attempts,
                auto_restarts_exhausted=v.auto_exhausted,
            )
            if v.task != CONNECTOR_TASK:
                entry.task = v.task
            if v.next_restart_at_ms is not None:
                entry.next_restart_at_ms = v.next_restart_at_ms
    return out


def _describe_classic(state: GroupState, out: admin_pb2.ClassicGroupDescription) -> None:
    """A classic group's state, generation (= group epoch), protocol, leader and join round (the
    round is volatile: empty after a takeover until members rejoin). O(round)."""
    classic = state.meta.classic
    out.state = state.display_state()
    out.generation_id = state.group_epoch
    if classic is not None:
        if classic.protocol_name:
            out.protocol_type = PROTOCOL_TYPE
            out.protocol_name = classic.protocol_name
        out.leader_id = classic.leader_id or ""
    rnd = state.round
    if rnd is None:
        return
    out.leader_unavailable_reason = rnd.leader_unavailable_reason
    out.rebalance_reason = rnd.reason
    out.pending_member_ids.extend(sorted(rnd.pending_ids))
    phase = ClassicState.EMPTY if classic is None else classic.state
    if phase is ClassicState.PREPARING_REBALANCE:
        out.members_joined.extend(sorted(rnd.joined, key=lambda m: (rnd.joined[m], m)))
    elif phase in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE):
        out.members_awaiting_sync.extend(sorted(rnd.awaiting_sync))


def _describe_classic_member(
    state: GroupState, member: Member, out: admin_pb2.ClassicMemberDescription
) -> None:
    """A classic member's protocols, session timeout, last joined generation, and whether its
    SyncGroup of the current generation was answered (persisted with its accepted share, so
    true after a takeover too)."""
    info = member.classic
    assert info is not None
    out.protocols.extend(info.protocol_names())
    out.session_timeout_ms = info.session_timeout_ms
    out.last_joined_generation = info.last_joined_generation
    accepted = info.accepted
    out.synced = (
        accepted is not None and accepted.answered and accepted.generation == state.group_epoch
    )


def put_connector_response(resp: PutConnectorResponse) -> admin_pb2.PutConnectorResponse:
    return admin_pb2.PutConnectorResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
        created=resp.created,
        rebalance_triggered=resp.rebalance_triggered,
    )


def delete_connector_response(
    resp: DeleteConnectorResponse,
) -> admin_pb2.DeleteConnectorResponse:
    return admin_pb2.DeleteConnectorResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
    )


def alter_configs_response(resp: AlterConfigsResponse) -> admin_pb2.AlterGroupConfigsResponse:
    out = admin_pb2.AlterGroupConfigsResponse(
        error_code=wire_code(resp.error_code), error_message=resp.error_message
    )
    out.effective_configs.update(resp.effective_configs)
    return out


def listed_groups(page: Sequence[ListedGroup], next_token: str) -> admin_pb2.ListGroupsResponse:
    out = admin_pb2.ListGroupsResponse(next_page_token=next_token)
    for g in page:
        out.groups.add(
            group_id=g.group_id,
            group_type=g.group_type,
            state=g.state,
            group_epoch=g.group_epoch,
            member_count=g.member_count,
            protocol_name=g.protocol_name,
        )
    return out


def found_coordinator(address: str) -> admin_pb2.FindCoordinatorResponse:
    host, _, port = address.rpartition(":")
    return admin_pb2.FindCoordinatorResponse(
        host=host, port=int(port) if port.isdigit() else 0, node_id=address
    )


class _ErrorAnswer(Protocol):
    error_code: common_pb2.ErrorCode
    error_message: str


A = TypeVar("A", bound=_ErrorAnswer)


#: ResourceState numbers (common.proto) of each status.
STATUS_NUMBERS: Mapping[StatusState, int] = {
    StatusState.UNASSIGNED: common_pb2.UNASSIGNED,
    StatusState.RUNNING: common_pb2.RUNNING,
    StatusState.PAUSED: common_pb2.PAUSED,
    StatusState.FAILED: common_pb2.FAILED,
    StatusState.STOPPED: common_pb2.STOPPED,
    StatusState.RESTARTING: common_pb2.RESTARTING,
}


def error_answer(answer: Callable[..., A], code: ErrorCode, message: str, **fields: object) -> A:
    """The one way an error becomes an answer: any response message (or DescribedGroup) with
    its error code and message set, plus `fields` (a heartbeat echoes the member's epoch)."""
    return answer(error_code=wire_code(code), error_message=message, **fields)


def acl_entry(msg: admin_pb2.AclEntry) -> AclEntry:
    """The core's AclEntry from the wire; INVALID_REQUEST naming what is wrong."""
    validate_text(msg.principal, "AclEntry.Principal", MAX_PRINCIPAL_LENGTH)
    validate_text(msg.pattern, "AclEntry.Pattern", MAX_NAME_LENGTH)
    try:
        operation = Operation(msg.operation.upper())
        resource_type = ResourceType(msg.resource_type.upper() or "GROUP")
        pattern_type = PatternType(msg.pattern_type.upper() or "LITERAL")
        permission = Permission(msg.permission.upper() or "ALLOW")
    except ValueError as error:
        raise InvalidRequest(f"AclEntry: {error}.") from error
    return AclEntry(
        principal=msg.principal,
        operation=operation,
        resource_type=resource_type,
        pattern=msg.pattern,
        pattern_type=pattern_type,
        permission=permission,
    )


#: Digits in a ListAcls page token (an entry id, a BIGINT).
_MAX_ACL_TOKEN_DIGITS = 19


def acl_page_token(token: str) -> int:
    """ListAcls' page token: "" (the first page) or the id of the last entry of the previous
    page; INVALID_REQUEST otherwise."""
    if token == "":
        return 0
    if not (token.isascii() and token.isdigit() and len(token) <= _MAX_ACL_TOKEN_DIGITS):
        raise InvalidRequest(
            "page_token must be empty or the next_page_token of a previous ListAcls answer."
        )
    return int(token)


def listed_acls(entries: Iterable[AclEntry], next_page_token: str) -> admin_pb2.ListAclsResponse:
    out = admin_pb2.ListAclsResponse(next_page_token=next_page_token)
    for e in entries:
        out.entries.add(
            principal=e.principal,
            operation=e.operation.value,
            resource_type=e.resource_type.value,
            pattern_type=e.pattern_type.value,
            pattern=e.pattern,
            permission=e.permission.value,
        )
    return out


def described_features(levels: Mapping[str, int]) -> admin_pb2.DescribeFeaturesResponse:
    """Every feature this release knows, by name: its level in force and the levels served."""
    return admin_pb2.DescribeFeaturesResponse(
        features=[
            admin_pb2.DescribedFeature(
                name=name,
                finalized_level=levels[name],
                min_supported_level=feature.min_level,
                max_supported_level=feature.max_level,
            )
            for name, feature in sorted(FEATURES.items())
        ]
    )


def updated_feature(change: FeatureChange) -> admin_pb2.UpdateFeaturesResponse:
    return admin_pb2.UpdateFeaturesResponse(
        previous_level=change.previous_level,
        finalized_level=change.level,
        changed=change.changed,
    )


# --- target states and restarts (DESIGN 3.20) -------------------------------------------------

TargetStateMessage = (
    admin_pb2.PauseConnectorRequest
    | admin_pb2.ResumeConnectorRequest
    | admin_pb2.StopConnectorRequest
)
TargetStateAnswer = (
    admin_pb2.PauseConnectorResponse
    | admin_pb2.ResumeConnectorResponse
    | admin_pb2.StopConnectorResponse
)


def target_state_request(
    msg: TargetStateMessage, target: TargetState, caller: str
) -> TargetStateRequest:
    return TargetStateRequest(msg.group_id, msg.connector, target, caller)


def target_state_response(
    answer: Callable[..., TargetStateAnswer], resp: TargetStateResponse
) -> TargetStateAnswer:
    return answer(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
        previous_target_state=TARGET_STATE_NUMBERS[resp.previous_target_state],
        changed=resp.changed,
        rebalance_triggered=resp.rebalance_triggered,
        holders_told=resp.holders_told,
    )


def restart_request(msg: admin_pb2.RestartConnectorRequest, caller: str) -> RestartRequest:
    return RestartRequest(
        msg.group_id,
        msg.connector,
        msg.task if msg.HasField("task") else None,
        msg.include_tasks,
        msg.only_failed,
        caller,
    )


def restart_response(resp: RestartResponse) -> admin_pb2.RestartConnectorResponse:
    out = admin_pb2.RestartConnectorResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
    )
    for p in resp.restarts:
        entry = out.restarts.add(restart_count=p.restart_count, worker_id=p.worker_id)
        if isinstance(p.resource, str):
            entry.connector = p.resource
        else:
            entry.connector = p.resource.connector
            entry.task = p.resource.task
    return out


def delete_group_request(msg: admin_pb2.DeleteGroupRequest, caller: str) -> DeleteGroupRequest:
    return DeleteGroupRequest(msg.group_id, msg.with_catalogue, caller)


def delete_group_response(resp: DeleteGroupResponse) -> admin_pb2.DeleteGroupResponse:
    return admin_pb2.DeleteGroupResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        group_epoch=resp.group_epoch,
        last_fencing_token=resp.last_fencing_token,
        connectors_deleted=resp.connectors_deleted,
        tasks_deleted=resp.tasks_deleted,
        configs_deleted=resp.configs_deleted,
    )


def remove_member_request(msg: admin_pb2.RemoveMemberRequest, caller: str) -> RemoveMemberRequest:
    return RemoveMemberRequest(msg.group_id, msg.member_id, msg.instance_id, msg.reason, caller)


def remove_member_response(resp: RemoveMemberResponse) -> admin_pb2.RemoveMemberResponse:
    return admin_pb2.RemoveMemberResponse(
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        member_id=resp.member_id,
        group_epoch=resp.group_epoch,
        resources_held=resp.resources_held,
        held_until_ms=resp.held_until_ms,
    )
