"""Resources' statuses (DESIGN 3.20): what holders report through ConnectGroupReportStatus, and
the view derived when read.

A report counts, entry by entry, only for a resource the member holds under the fencing token
of that grant (Connect's status store drops writes of older generations; tokens make the rule
exact); any other entry is NOT_RESOURCE_OWNER and the rest still count. A stored status counts
only while its reporter still holds the resource under that token, so a resource reads as
UNASSIGNED until its current holder has reported under its grant: a rebalance writes no status.
Traces are cut to --status-trace-max-bytes; events carry their digests, never the text.

Costs: a report O(its entries); the view O(the catalogue's resources) (a describe's cost)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connect_protocol.configs import keyed_digest
from connect_protocol.errors import CoordinatorError, ErrorCode
from connect_protocol.lifecycle_messages import (
    EntryResult,
    ReportStatusRequest,
    ReportStatusResponse,
    StatusEntry,
    TargetState,
)
from connect_protocol.resources import TaskId
from connect_protocol.tokens import Resource

from .auto_restarts import with_auto_restart
from .change import GroupChange
from .lifecycle import acting_member
from .model import (
    CONNECTOR_TASK,
    GroupConfigDefaults,
    GroupState,
    Member,
    ResourceStatus,
    StatusState,
)
from .records import EventType
from .results import Result, refused
from .validation import validate_report_status

#: What a cut trace ends with.
CUT_MARK = "\n[... cut to {limit} bytes by the coordinator (--status-trace-max-bytes)]"


def key_of(resource: Resource) -> tuple[str, int]:
    """A resource as the (connector, task) key statuses are stored under."""
    if isinstance(resource, str):
        return resource, CONNECTOR_TASK
    return resource.connector, resource.task


def resource_of(connector: str, task: int) -> Resource:
    return connector if task == CONNECTOR_TASK else TaskId(connector, task)


def cut_trace(trace: str, limit: int) -> str:
    """`trace` if it fits in `limit` UTF-8 bytes, else its head (whole characters) and a mark
    saying it was cut; the result fits in `limit` bytes (or is the mark alone, if `limit` is
    smaller than the mark)."""
    data = trace.encode()
    if len(data) <= limit:
        return trace
    mark = CUT_MARK.format(limit=limit)
    room = max(0, limit - len(mark.encode()))
    return data[:room].decode(errors="ignore") + mark


def trace_digest(trace: str, key: bytes | None) -> str:
    """A digest of a trace for events and the export (traces may carry secrets): an HMAC under
    the database's digest key, as config digests are; equal digests mean equal traces."""
    return keyed_digest(trace.encode(), key)


def _refusal(member: Member, entry: StatusEntry, stored: ResourceStatus | None) -> str | None:
    """Why `entry` does not count for `member` (None: it counts). A resource of its current
    assignment must carry that grant's token; one pending revocation (whose token the member
    no longer has in its assignment) counts only under the token it last reported it with."""
    resource = entry.resource
    token = member.tokens.get(resource)
    if token is not None:
        if entry.token == token:
            return None
        return (
            f"{_name(resource)} is held under fencing token {token}, not {entry.token} "
            "(a stale grant)."
        )
    pending = (
        resource in member.pending_revocation.connectors
        if isinstance(resource, str)
        else resource in member.pending_revocation.tasks
    )
    if (
        pending
        and stored is not None
        and stored.member_id == member.member_id
        and stored.token == entry.token
    ):
        return None
    if pending:
        return (
            f"{_name(resource)} is being revoked from this member; a report under fencing "
            f"token {entry.token} does not match its last one."
        )
    return f"{_name(resource)} is not held by this member."


def _gone(state: GroupState, connector: str, task: int) -> str | None:
    """Why a resource no longer exists, if it does not: its connector was deleted, or it is a
    task beyond the connector's effective count (a lower task count, or STOPPED). Its holder
    may still run it until it is revoked; its reports must not bring a status back."""
    spec = state.catalogue.get(connector)
    if spec is None:
        return f"connector {connector!r} was deleted."
    if task != CONNECTOR_TASK and task >= spec.effective_task_count:
        why = "is STOPPED" if spec.target_state is TargetState.STOPPED else "has fewer tasks now"
        return f"task {connector}-{task} no longer exists: connector {connector!r} {why}."
    return None


def _name(resource: Resource) -> str:
    if isinstance(resource, str):
        return f"connector {resource!r}"
    return f"task {resource.connector}-{resource.task}"


def report_status(
    state: GroupState | None,
    req: ReportStatusRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[ReportStatusResponse]:
    """ConnectGroupReportStatus. Writes the statuses that changed (state, reporter, token or
    trace) and one STATUS_CHANGED event listing them; a report that changes nothing writes
    nothing. O(entries)."""
    try:
        if not validated:
            validate_report_status(req)
        member = acting_member(state, req.group_id, req.member_id, req.member_epoch, principal)
    except CoordinatorError as error:
        return refused(ReportStatusResponse, error)
    assert state is not None
    change = GroupChange(state, req.group_id, now_ms, defaults, creator=principal)
    results: list[EntryResult] = []
    changes: list[dict[str, Any]] = []
    for entry in req.entries:
        connector, task = key_of(entry.resource)
        stored = state.resource_status(connector, task)
        why = _gone(state, connector, task) or _refusal(member, entry, stored)
        if why is not None:
            results.append(EntryResult(entry.resource, ErrorCode.NOT_RESOURCE_OWNER, why))
            continue
        results.append(EntryResult(entry.resource))
        trace = cut_trace(entry.trace, defaults.status_trace_max_bytes)
        status = ResourceStatus(
            state=StatusState(entry.state.value),
            member_id=member.member_id,
            token=entry.token,
            reported_at_ms=now_ms,
            trace=trace,
            restart_count=0 if stored is None else stored.restart_count,
            trace_digest=trace_digest(trace, defaults.config_digest_key) if trace else "",
        )
        if stored is not None and _same_report(stored, status):
            continue
        status = with_auto_restart(change, connector, task, stored, status)
        change.put_status(connector, task, status)
        changes.append(_change_payload(entry, stored, status))
    if changes:
        change.event(EventType.STATUS_CHANGED, member.member_id, changes=changes)
    response = ReportStatusResponse(
        lifecycle_revision=member.lifecycle_revision, results=tuple(results)
    )
    return change.result(response)


def _same_report(stored: ResourceStatus, new: ResourceStatus) -> bool:
    return (
        stored.state is new.state
        and stored.member_id == new.member_id
        and stored.token == new.token
        and stored.trace == new.trace
    )


def _change_payload(
    entry: StatusEntry, stored: ResourceStatus | None, status: ResourceStatus
) -> dict[str, Any]:
    connector, task = key_of(entry.resource)
    out: dict[str, Any] = {"connector": connector}
    if task != CONNECTOR_TASK:
        out["task"] = task
    out["state"] = entry.state.value
    out["previous_state"] = None if stored is None else stored.state.value
    out["fencing_token"] = entry.token
    if status.trace_digest:
        out["trace_digest"] = status.trace_digest
    return out


# --- the derived view ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StatusView:
    """A resource's status as read (DescribeGroups, `coordinator-svc status`)."""

    connector: str
    task: int  # CONNECTOR_TASK: the connector itself
    state: StatusState
    worker_id: str = ""
    worker_url: str = ""
    trace: str = ""
    restart_count: int = 0
    token: int = 0
    reported_at_ms: int = 0
    #: Automatic restarts (DESIGN 3.20): consecutive attempts, the next one's time if one is
    #: pending and still applies, and whether they gave up.
    auto_attempts: int = 0
    next_restart_at_ms: int | None = None
    auto_exhausted: bool = False


@dataclass(frozen=True, slots=True)
class Owners:
    """The owner indexes a view reads: the state's own under its lock, or copies of them taken
    under it (`of`) for a view built after (`GroupState.read_view` does not copy them)."""

    connectors: Mapping[str, str]
    tasks: Mapping[TaskId, str]

    @staticmethod
    def of(state: GroupState, copy: bool = False) -> Owners:
        if copy:  # two dict copies, in C: ms for 100,000 tasks
            return Owners(dict(state.connector_owner), dict(state.task_owner))
        return Owners(state.connector_owner, state.task_owner)


def holder_of(
    state: GroupState, connector: str, task: int, owners: Owners | None = None
) -> Member | None:
    """The member that holds a resource now (assigned or pending revocation), if any."""
    index = owners or Owners.of(state)
    if task == CONNECTOR_TASK:
        member_id = index.connectors.get(connector)
    else:
        member_id = index.tasks.get(TaskId(connector, task))
    return None if member_id is None else state.members.get(member_id)


def counts(stored: ResourceStatus, holder: Member | None, resource: Resource) -> bool:
    """Whether a stored status is its current holder's report under its current grant."""
    if holder is None or stored.member_id != holder.member_id:
        return False
    token = holder.tokens.get(resource)
    return token is None or token == stored.token  # None: pending revocation, see `_refusal`


def view_of(
    state: GroupState, connector: str, task: int, owners: Owners | None = None
) -> StatusView:
    """A resource's status as read: its holder's report under its grant; RESTARTING after a
    restart request until then; otherwise UNASSIGNED (with the holder, if any, named)."""
    holder = holder_of(state, connector, task, owners)
    stored = state.resource_status(connector, task)
    worker = "" if holder is None else holder.member_id
    url = "" if holder is None else holder.url
    if stored is None:
        return StatusView(connector, task, StatusState.UNASSIGNED, worker, url)
    if counts(stored, holder, resource_of(connector, task)):
        spec = state.catalogue.get(connector)
        started = spec is not None and spec.target_state is TargetState.STARTED
        failed = stored.state is StatusState.FAILED
        return StatusView(
            connector,
            task,
            stored.state,
            worker,
            url,
            stored.trace,
            stored.restart_count,
            stored.token,
            stored.reported_at_ms,
            stored.auto_attempts,
            stored.auto_restart_at_ms if failed and started else None,
            stored.auto_exhausted and failed,
        )
    derived = StatusState.RESTARTING if stored.state is StatusState.RESTARTING else None
    return StatusView(
        connector,
        task,
        derived or StatusState.UNASSIGNED,
        worker,
        url,
        restart_count=stored.restart_count,
        auto_attempts=stored.auto_attempts,
    )


def drop_task_statuses(change: GroupChange, connector: str, from_task: int) -> int:
    """Forget the stored statuses of the connector's tasks numbered `from_task` and up: they no
    longer exist (a lower task count, or STOPPED), so they must neither show nor be counted
    (a FAILED one would keep an alert firing). O(the connector's stored statuses). Returns how
    many were dropped."""
    state = change.state
    dropped = 0
    if state is None:
        return 0
    for task in sorted(state.statuses.get(connector, {})):
        if task >= from_task and task != CONNECTOR_TASK:
            change.put_status(connector, task, None)
            dropped += 1
    return dropped


def views(state: GroupState, owners: Owners | None = None) -> list[StatusView]:
    """Every connector and task of the catalogue with its status, by connector, the connector
    first. O(the catalogue's resources). `owners`: the owner indexes to read (a copy taken
    under the group's lock, when `state` is a `read_view`)."""
    index = owners or Owners.of(state)
    out: list[StatusView] = []
    for name in sorted(state.catalogue):
        out.append(view_of(state, name, CONNECTOR_TASK, index))
        tasks = range(state.catalogue[name].effective_task_count)  # a STOPPED one has none
        out.extend(view_of(state, name, t, index) for t in tasks)
    return out
