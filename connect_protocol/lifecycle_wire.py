"""The connector lifecycle's wire (DESIGN 3.20): protobuf <-> `lifecycle_messages` values, both
directions for ConnectGroupConfigs and ConnectGroupReportStatus, so that the coordinator and the
agent share one conversion. A state or target state the enum does not know reads as None
(validation refuses it) rather than raising."""

from __future__ import annotations

from typing import cast

from connect.group.v1 import common_pb2, coordinator_pb2

from .lifecycle_messages import (
    ConfigsRequest,
    ConfigsResponse,
    EntryResult,
    HeldConnector,
    ReportedState,
    ReportStatusRequest,
    ReportStatusResponse,
    StatusEntry,
    TargetState,
)
from .resources import TaskId
from .tokens import Resource
from .wire import error_code, wire_code

#: ResourceState numbers (common.proto) of the states a holder reports.
REPORTED_STATE_NUMBERS: dict[ReportedState, int] = {
    ReportedState.RUNNING: common_pb2.RUNNING,
    ReportedState.PAUSED: common_pb2.PAUSED,
    ReportedState.FAILED: common_pb2.FAILED,
    ReportedState.STOPPED: common_pb2.STOPPED,
}
_REPORTED_BY_NUMBER = {n: s for s, n in REPORTED_STATE_NUMBERS.items()}

TARGET_STATE_NUMBERS: dict[TargetState, int] = {
    TargetState.STARTED: common_pb2.TARGET_STARTED,
    TargetState.PAUSED: common_pb2.TARGET_PAUSED,
    TargetState.STOPPED: common_pb2.TARGET_STOPPED,
}
_TARGET_BY_NUMBER = {n: s for s, n in TARGET_STATE_NUMBERS.items()}


def resource_of(connector: str, task: int | None) -> Resource:
    return connector if task is None else TaskId(connector, task)


def _task_of(msg: object) -> int | None:
    return msg.task if msg.HasField("task") else None  # type: ignore[attr-defined]


def _set_resource(msg: object, resource: Resource) -> None:
    if isinstance(resource, str):
        msg.connector = resource  # type: ignore[attr-defined]
    else:
        msg.connector = resource.connector  # type: ignore[attr-defined]
        msg.task = resource.task  # type: ignore[attr-defined]


def reported_state_from(number: int) -> ReportedState | None:
    """The reported state of a wire ResourceState; None for UNASSIGNED, RESTARTING or unknown."""
    return _REPORTED_BY_NUMBER.get(number)


# --- ConnectGroupConfigs --------------------------------------------------------------------


def configs_request_to(req: ConfigsRequest) -> coordinator_pb2.ConnectGroupConfigsRequest:
    return coordinator_pb2.ConnectGroupConfigsRequest(
        group_id=req.group_id,
        member_id=req.member_id,
        member_epoch=req.member_epoch,
        known_digests=dict(req.known_digests),
    )


def configs_request_from(msg: coordinator_pb2.ConnectGroupConfigsRequest) -> ConfigsRequest:
    return ConfigsRequest(
        group_id=msg.group_id,
        member_id=msg.member_id,
        member_epoch=msg.member_epoch,
        known_digests=dict(msg.known_digests),
    )


def configs_response_to(resp: ConfigsResponse) -> coordinator_pb2.ConnectGroupConfigsResponse:
    out = coordinator_pb2.ConnectGroupConfigsResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        lifecycle_revision=resp.lifecycle_revision,
    )
    for held in resp.connectors:
        entry = out.connectors.add(
            connector=held.connector,
            config_digest=held.config_digest,
            target_state=cast(common_pb2.TargetState, TARGET_STATE_NUMBERS[held.target_state]),
        )
        if held.config is not None:
            entry.config.SetInParent()
            entry.config.values.update(held.config)
    for resource, count in resp.restart_counts.items():
        _set_resource(out.restart_counts.add(restart_count=count), resource)
    return out


def configs_response_from(msg: coordinator_pb2.ConnectGroupConfigsResponse) -> ConfigsResponse:
    return ConfigsResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        lifecycle_revision=msg.lifecycle_revision,
        connectors=tuple(
            HeldConnector(
                connector=c.connector,
                config_digest=c.config_digest,
                config=dict(c.config.values) if c.HasField("config") else None,
                target_state=_TARGET_BY_NUMBER.get(c.target_state, TargetState.STARTED),
            )
            for c in msg.connectors
        ),
        restart_counts={
            resource_of(r.connector, _task_of(r)): r.restart_count for r in msg.restart_counts
        },
        throttle_time_ms=msg.throttle_time_ms,
    )


# --- ConnectGroupReportStatus ----------------------------------------------------------------


def report_request_to(req: ReportStatusRequest) -> coordinator_pb2.ConnectGroupReportStatusRequest:
    out = coordinator_pb2.ConnectGroupReportStatusRequest(
        group_id=req.group_id, member_id=req.member_id, member_epoch=req.member_epoch
    )
    for e in req.entries:
        entry = out.entries.add(
            fencing_token=e.token,
            state=cast(common_pb2.ResourceState, REPORTED_STATE_NUMBERS[e.state]),
            trace=e.trace,
        )
        _set_resource(entry, e.resource)
    return out


class UnknownReportedState(ValueError):
    """A status entry's state is not one a holder may report."""


def report_request_from(
    msg: coordinator_pb2.ConnectGroupReportStatusRequest,
) -> ReportStatusRequest:
    """Raises UnknownReportedState for an entry whose state a holder may not report."""
    entries = []
    for e in msg.entries:
        state = reported_state_from(e.state)
        resource = resource_of(e.connector, _task_of(e))
        if state is None:
            name = common_pb2.ResourceState.Name(e.state) if e.state in range(6) else e.state
            raise UnknownReportedState(
                f"entry for {resource!r}: state {name} cannot be reported (RUNNING, PAUSED, "
                "FAILED or STOPPED)."
            )
        entries.append(StatusEntry(resource, e.fencing_token, state, e.trace))
    return ReportStatusRequest(
        group_id=msg.group_id,
        member_id=msg.member_id,
        member_epoch=msg.member_epoch,
        entries=tuple(entries),
    )


def report_response_to(
    resp: ReportStatusResponse,
) -> coordinator_pb2.ConnectGroupReportStatusResponse:
    out = coordinator_pb2.ConnectGroupReportStatusResponse(
        throttle_time_ms=resp.throttle_time_ms,
        error_code=wire_code(resp.error_code),
        error_message=resp.error_message,
        lifecycle_revision=resp.lifecycle_revision,
    )
    for r in resp.results:
        _set_resource(
            out.results.add(error_code=wire_code(r.error_code), error_message=r.error_message),
            r.resource,
        )
    return out


def report_response_from(
    msg: coordinator_pb2.ConnectGroupReportStatusResponse,
) -> ReportStatusResponse:
    return ReportStatusResponse(
        error_code=error_code(msg.error_code),
        error_message=msg.error_message,
        lifecycle_revision=msg.lifecycle_revision,
        results=tuple(
            EntryResult(
                resource_of(r.connector, _task_of(r)), error_code(r.error_code), r.error_message
            )
            for r in msg.results
        ),
        throttle_time_ms=msg.throttle_time_ms,
    )
