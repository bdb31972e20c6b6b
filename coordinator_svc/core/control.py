"""The operator's control of running connectors (DESIGN 3.20 "Target states", "Restarts"):
Pause-, Resume- and StopConnector (KIP-875's target states), RestartConnector (KIP-745's
RestartRequest), and the automatic restarts of resources reported FAILED.

Target states. PAUSED keeps everything assigned and counted: no epoch bump, the holders'
revisions rise so they fetch the new state. STOPPED keeps the connector assigned and its
`task_count` for resume, while its tasks leave (its effective task count is 0). The group epoch
bumps exactly when the effective task count changes: entering or leaving STOPPED here, a
`task_count` change while not STOPPED in PutConnector (`admin.put_connector`).

Restarts. Each selected resource's persisted restart count rises, its status reads RESTARTING
and its holder's revision rises; the holder restarts a resource it keeps when the count exceeds
the last one it acted on, and a grant records the count, so a move satisfies the request and a
resent answer repeats nothing. Nothing moves.

Automatic restarts (`auto_restarts` arms them from a FAILED report; `on_auto_restart_timer`
here fires them): the timer restarts the resource only if the report still counts (the same
holder under the same grant: a release, a move or a hold cancels it) and the connector is
STARTED (pausing or stopping cancels it at once; deleting drops its status).

Costs: a target-state change O(the connector's tasks) (its holders through the owner index); a
restart O(the resources selected); a timer O(1)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from connect_protocol.errors import CoordinatorError, GroupIdNotFound, InvalidRequest
from connect_protocol.lifecycle_messages import (
    PlannedRestart,
    RestartRequest,
    RestartResponse,
    TargetState,
    TargetStateRequest,
    TargetStateResponse,
)

from .admin import catalogue_changed, who
from .auto_restarts import auto_restart_key, resource_of_key
from .change import GroupChange
from .lifecycle import raised, tell_holders
from .model import (
    CONNECTOR_TASK,
    Connector,
    GroupConfigDefaults,
    GroupState,
    ResourceStatus,
    StatusState,
)
from .records import EventType
from .results import Result, TimerKey, refused
from .status import drop_task_statuses, holder_of, key_of, resource_of, view_of
from .validation import validate_restart, validate_target_state

#: Restart reasons, as CONNECTOR_RESTART_REQUESTED events name them.
MANUAL = "manual"
AUTO = "auto"


def _known_connector(state: GroupState | None, group_id: str, name: str) -> Connector:
    if state is None:
        raise GroupIdNotFound(f"group {group_id!r} does not exist.")
    connector = state.catalogue.get(name)
    if connector is None:
        raise InvalidRequest(f"connector {name!r} is not in the catalogue of group {group_id!r}.")
    return connector


# --- target states ---------------------------------------------------------------------------


def set_target_state(
    state: GroupState | None,
    req: TargetStateRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[TargetStateResponse]:
    """Pause-, Resume- or StopConnector (`req.target`). A connector already in the target
    state is answered changed=false and nothing is written."""
    try:
        if not validated:
            validate_target_state(req)
        before = _known_connector(state, req.group_id, req.connector)
    except CoordinatorError as error:
        return refused(TargetStateResponse, error)
    assert state is not None
    if before.target_state is req.target:
        return Result(
            [],
            TargetStateResponse(
                group_epoch=state.group_epoch, previous_target_state=before.target_state
            ),
        )
    change = GroupChange(state, req.group_id, now_ms, defaults)
    after = replace(before, target_state=req.target)
    change.put_connector(after)
    told = tell_holders(change, before)
    cancelled = 0 if req.target is TargetState.STARTED else _cancel_auto_restarts(change, before)
    if after.target_state is TargetState.STOPPED:
        drop_task_statuses(change, req.connector, 0)  # its tasks leave the group
    change.event(
        EventType.CONNECTOR_TARGET_STATE_CHANGED,
        connector=req.connector,
        target_state=req.target.value,
        previous_target_state=before.target_state.value,
        holders_told=told,
        auto_restarts_cancelled=cancelled,
        **who(req.caller, principal),
    )
    stopped = (
        before.target_state is TargetState.STOPPED,
        after.target_state is TargetState.STOPPED,
    )
    rebalance = False
    if stopped[0] != stopped[1]:  # the effective task count changed (DESIGN 3.20)
        reason = "connector stopped" if stopped[1] else "connector resumed from stopped"
        rebalance = catalogue_changed(change, reason, req.connector)
    return change.result(
        TargetStateResponse(
            group_epoch=change.group_epoch,
            previous_target_state=before.target_state,
            changed=True,
            rebalance_triggered=rebalance,
            holders_told=told,
        )
    )


def _cancel_auto_restarts(change: GroupChange, connector: Connector) -> int:
    """Drop every pending automatic restart of the connector's resources (it was paused or
    stopped). O(its stored statuses). Returns how many were pending."""
    state = change.state
    assert state is not None
    cancelled = 0
    for task, status in sorted(state.statuses.get(connector.name, {}).items()):
        if status.auto_restart_at_ms is not None:
            change.put_status(connector.name, task, replace(status, auto_restart_at_ms=None))
            change.cancel(auto_restart_key(connector.name, task))
            cancelled += 1
    return cancelled


# --- restarts ----------------------------------------------------------------------------------


def restart_connector(
    state: GroupState | None,
    req: RestartRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[RestartResponse]:
    """RestartConnector: selects as Connect's RestartRequest (the connector and, with
    include_tasks, its tasks, or the one task named; only_failed skips what does not read
    FAILED) and requests each one's restart. O(the resources looked at)."""
    try:
        if not validated:
            validate_restart(req)
        connector = _known_connector(state, req.group_id, req.connector)
        if connector.target_state is TargetState.STOPPED:
            raise InvalidRequest(
                f"connector {req.connector!r} is STOPPED: nothing of it runs to restart; "
                "resume it first."
            )
        if req.task is not None and not 0 <= req.task < connector.task_count:
            raise InvalidRequest(
                f"connector {req.connector!r} has {connector.task_count} tasks: task {req.task} "
                "does not exist."
            )
    except CoordinatorError as error:
        return refused(RestartResponse, error)
    assert state is not None
    if req.task is not None:
        selected = [req.task]
    else:
        selected = [CONNECTOR_TASK] + (
            list(range(connector.task_count)) if req.include_tasks else []
        )
    if req.only_failed:
        selected = [
            t for t in selected if view_of(state, req.connector, t).state is StatusState.FAILED
        ]
    change = GroupChange(state, req.group_id, now_ms, defaults)
    plan = [request_restart(change, req.connector, task) for task in selected]
    raise_revisions(change, plan)
    if plan:
        change.event(
            EventType.CONNECTOR_RESTART_REQUESTED,
            connector=req.connector,
            reason=MANUAL,
            include_tasks=req.include_tasks,
            only_failed=req.only_failed,
            restarts=[_planned_payload(p) for p in plan],
            **_task_field(req.task),
            **who(req.caller, principal),
        )
    return change.result(RestartResponse(restarts=tuple(plan), group_epoch=change.group_epoch))


def request_restart(
    change: GroupChange, connector: str, task: int, auto: bool = False
) -> PlannedRestart:
    """Raise the resource's restart count and make it read RESTARTING (under its holder's
    grant, so the holder's next report replaces it). An automatic restart also counts an
    attempt. Revisions are raised by `raise_revisions`, once per holder. O(1)."""
    state = change.state
    assert state is not None
    resource = resource_of(connector, task)
    stored = change.resource_status(connector, task)
    holder = holder_of(state, connector, task)
    token = 0
    if holder is not None:
        token = holder.tokens.get(resource) or (
            stored.token if stored is not None and stored.member_id == holder.member_id else 0
        )
    count = (0 if stored is None else stored.restart_count) + 1
    attempts = 0 if stored is None else stored.auto_attempts
    change.put_status(
        connector,
        task,
        ResourceStatus(
            state=StatusState.RESTARTING,
            member_id="" if holder is None else holder.member_id,
            token=token,
            reported_at_ms=change.now_ms,
            restart_count=count,
            auto_attempts=attempts + 1 if auto else attempts,
        ),
    )
    if stored is not None and stored.auto_restart_at_ms is not None:
        change.cancel(auto_restart_key(connector, task))  # superseded by this restart
    return PlannedRestart(resource, count, "" if holder is None else holder.member_id)


def raise_revisions(change: GroupChange, plan: list[PlannedRestart]) -> None:
    """Raise the revision of each member holding a restarted resource, once each."""
    for member_id in sorted({p.worker_id for p in plan if p.worker_id}):
        member = change.member(member_id)
        if member is not None:
            change.put_member(raised(member))


def _task_field(task: int | None) -> dict[str, Any]:
    return {} if task is None else {"task": task}


def _planned_payload(p: PlannedRestart) -> dict[str, Any]:
    connector, task = key_of(p.resource)
    out: dict[str, Any] = {"connector": connector}
    if task != CONNECTOR_TASK:
        out["task"] = task
    out["restart_count"] = p.restart_count
    out["worker_id"] = p.worker_id
    return out


# --- automatic restarts ---------------------------------------------------------------------


def on_auto_restart_timer(change: GroupChange, key: TimerKey) -> None:
    """A resource's automatic restart is due: restart it if it still applies, else cancel it
    (its holder released it, it moved or is held, or its connector is no longer STARTED)."""
    state = change.state
    assert state is not None
    connector, task = resource_of_key(key)
    stored = state.resource_status(connector, task)
    if stored is None or stored.auto_restart_at_ms is None:
        return
    if change.now_ms < stored.auto_restart_at_ms:  # a stale timer: re-arm
        change.schedule(key, stored.auto_restart_at_ms)
        return
    if view_of(state, connector, task).next_restart_at_ms is None:  # it no longer applies
        change.put_status(connector, task, replace(stored, auto_restart_at_ms=None))
        return
    planned = request_restart(change, connector, task, auto=True)
    raise_revisions(change, [planned])
    change.event(
        EventType.CONNECTOR_RESTART_REQUESTED,
        connector=connector,
        reason=AUTO,
        attempt=stored.auto_attempts + 1,
        restarts=[_planned_payload(planned)],
        **_task_field(None if task == CONNECTOR_TASK else task),
    )
