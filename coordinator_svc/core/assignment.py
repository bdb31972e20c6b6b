"""ConnectGroupPrepareAssignment and ConnectGroupInstallAssignment (seed 000; DESIGN 3.4-3.10)."""

from __future__ import annotations

from types import MappingProxyType

from .change import GroupChange
from .errors import (
    CoordinatorError,
    FencedMemberEpoch,
    GroupIdNotFound,
    InvalidAssignment,
    UnknownMemberId,
)
from .messages import (
    ConnectorInfo,
    InstallRequest,
    InstallResponse,
    MemberTarget,
    PreparedMemberInfo,
    PrepareRequest,
    PrepareResponse,
)
from .model import (
    SCHEDULED_REBALANCE_MAX_DELAY_MS,
    Assignor,
    GroupConfigDefaults,
    GroupState,
    Member,
    PreparedSnapshot,
    TargetAssignment,
    TargetEntry,
)
from .records import EventType
from .resources import ResourceSet, TaskId
from .results import ASSIGNOR, SCHEDULED_REBALANCE, Result
from .selection import GroupProfiles, NoSelection, Selection, select_with
from .validation import validate_install, validate_prepare


def _assignor_member(
    state: GroupState | None, group_id: str, member_id: str, member_epoch: int
) -> tuple[GroupState, Member]:
    """Seed 000's checks 1-4, shared by Prepare and Install."""
    if state is None:
        raise GroupIdNotFound(f"group {group_id!r} does not exist.")
    member = state.members.get(member_id)
    if member is None:
        raise UnknownMemberId(f"member {member_id!r} is not in group {group_id!r}.")
    if member_epoch != member.member_epoch:
        raise FencedMemberEpoch(
            f"member epoch {member_epoch} does not match the coordinator's "
            f"{member.member_epoch}; retry with the epoch of your next heartbeat response."
        )
    if state.meta.assignor_member_id != member_id:
        chosen = state.meta.assignor_member_id or "nobody"
        raise UnknownMemberId(
            f"member {member_id!r} is not the group's assignor member ({chosen} is); "
            "abandon the computation."
        )
    return state, member


def current_selection(state: GroupState) -> Selection | NoSelection:
    """The selection as it stands (no exclusions): O(profiles), from the state's index."""
    profiles = GroupProfiles(state.selection_index, frozenset(), {}, state.profile)
    return select_with(profiles, state.meta.assignor_member_id)


def prepare_assignment(
    state: GroupState | None, req: PrepareRequest, now_ms: int, defaults: GroupConfigDefaults
) -> Result[PrepareResponse]:
    try:
        validate_prepare(req)
        state, _member = _assignor_member(state, req.group_id, req.member_id, req.member_epoch)
    except CoordinatorError as error:
        return Result([], PrepareResponse(error.code, error.message))
    selection = current_selection(state)
    assert isinstance(selection, Selection), "an assignor member implies a selection"
    change = GroupChange(state, req.group_id, now_ms, defaults)
    snapshot = PreparedSnapshot(
        group_epoch=state.group_epoch,
        member_ids=frozenset(state.members),
        catalogue=state.catalogue_resources(),
    )
    if state.meta.prepared != snapshot:
        change.set_meta(prepared=snapshot)
    members = tuple(
        PreparedMemberInfo(
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            instance_id=m.instance_id,
            url=m.url,
            assignor=m.assignor(selection.assignor_name)
            or Assignor(selection.assignor_name, selection.version, selection.version),
            owned=m.owned,
        )
        for m in sorted(state.members.values(), key=lambda m: m.member_id)
    )
    response = PrepareResponse(
        group_epoch=state.group_epoch,
        assignor_name=selection.assignor_name,
        assignor_version=selection.version,
        members=members,
        catalogue=tuple(
            ConnectorInfo(c.name, c.task_count, dict(c.config))
            for c in sorted(state.catalogue.values(), key=lambda c: c.name)
        ),
        assignment_epoch=state.assignment_epoch,
        target=tuple(
            MemberTarget(member_id, e.resources, e.version, e.metadata)
            for member_id, e in sorted(state.target.members.items())
        ),
        assignor_state=state.target.assignor_state,
        group_configs=change.effective_configs(),
        coordinator_time_ms=now_ms,
        scheduled_rebalance_at_ms=state.target.scheduled_rebalance_at_ms,
    )
    return Result(change.records(), response, change.timers)


def install_assignment(
    state: GroupState | None, req: InstallRequest, now_ms: int, defaults: GroupConfigDefaults
) -> Result[InstallResponse]:
    try:
        validate_install(req)
        state, _member = _assignor_member(state, req.group_id, req.member_id, req.member_epoch)
        change = GroupChange(state, req.group_id, now_ms, defaults)
        snapshot = _check_epochs(state, req)
        if req.error != 0:
            _record_failure(change, req)
        else:
            _validate_against(snapshot, req)
            _install(change, req)
    except CoordinatorError as error:
        return Result([], InstallResponse(error.code, error.message))
    return Result(change.records(), InstallResponse(), change.timers)


def _check_epochs(state: GroupState, req: InstallRequest) -> PreparedSnapshot:
    prepared = state.meta.prepared
    if req.group_epoch > state.group_epoch:
        raise InvalidAssignment(
            f"install for group epoch {req.group_epoch}, but the group is at epoch "
            f"{state.group_epoch}."
        )
    if req.group_epoch <= state.assignment_epoch:
        raise InvalidAssignment(
            f"install for group epoch {req.group_epoch}, but epoch {state.assignment_epoch} "
            "already has a target installed."
        )
    if prepared is None:
        raise InvalidAssignment(
            f"install for group epoch {req.group_epoch} without a PrepareAssignment for it."
        )
    if req.group_epoch != prepared.group_epoch:
        raise InvalidAssignment(
            f"install for group epoch {req.group_epoch}, but the last PrepareAssignment "
            f"returned epoch {prepared.group_epoch}."
        )
    return prepared


def _validate_against(snapshot: PreparedSnapshot, req: InstallRequest) -> None:
    """DESIGN 3.6: against the group and catalogue the Prepare showed. O(members + resources):
    each share is checked against the sets of what was assigned before it, never copied."""
    catalogue = snapshot.catalogue
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for m in req.members:
        if m.member_id not in snapshot.member_ids:
            raise InvalidAssignment(
                f"member {m.member_id!r} was not in the group at epoch {snapshot.group_epoch}."
            )
        share = m.resources
        if not (share.connectors <= catalogue.connectors and share.tasks <= catalogue.tasks):
            unknown = share - catalogue
            raise InvalidAssignment(
                f"{unknown.describe()} assigned to {m.member_id!r} are not in the catalogue of "
                f"epoch {snapshot.group_epoch}."
            )
        if not (connectors.isdisjoint(share.connectors) and tasks.isdisjoint(share.tasks)):
            twice = ResourceSet(
                frozenset(connectors & share.connectors), frozenset(tasks & share.tasks)
            )
            raise InvalidAssignment(f"{twice.describe()} assigned more than once.")
        connectors.update(share.connectors)
        tasks.update(share.tasks)
    covered = len(connectors) + len(tasks) == len(catalogue)
    if not covered and req.scheduled_rebalance_delay_ms <= 0:
        unassigned = catalogue - ResourceSet(frozenset(connectors), frozenset(tasks))
        raise InvalidAssignment(
            f"{unassigned.describe()} left unassigned without a scheduled rebalance delay; "
            "assign every resource or declare scheduled_rebalance_delay_ms > 0."
        )


def _record_failure(change: GroupChange, req: InstallRequest) -> None:
    """DESIGN 3.10: keep the previous target; ask again after a backoff, of another member if
    one qualifies."""
    change.event(
        EventType.ASSIGNOR_FAILED,
        req.member_id,
        error=req.error,
        message=req.error_message,
        group_epoch=req.group_epoch,
    )
    change.set_meta(
        last_assignment_error=req.error,
        last_assignment_error_message=req.error_message,
        compute_not_before_ms=change.now_ms + change.defaults.assignment_error_backoff_ms,
        compute_requested_epoch=None,
        excluded_assignors=change.meta.excluded_assignors | {req.member_id},
    )
    change.cancel((ASSIGNOR, ""))
    change.reselect_assignor()


def _install(change: GroupChange, req: InstallRequest) -> None:
    """DESIGN 3.9: members that left since are dropped, resources deleted since are dropped,
    members that joined since get nothing; a newer group epoch asks for a new computation."""
    catalogue = change.catalogue_resources()
    entries = {
        m.member_id: TargetEntry(_within(m.resources, catalogue), m.version, m.metadata)
        for m in req.members
        if change.member(m.member_id) is not None
    }
    old = change.target
    scheduled_at = None
    if req.scheduled_rebalance_delay_ms > 0:
        max_delay = change.config_int(SCHEDULED_REBALANCE_MAX_DELAY_MS)
        scheduled_at = change.now_ms + min(req.scheduled_rebalance_delay_ms, max_delay)
    new = TargetAssignment(
        assignment_epoch=req.group_epoch,
        members=MappingProxyType(entries),
        assignor_state=req.assignor_state,
        scheduled_rebalance_at_ms=scheduled_at,
    )
    changed = [m for m in old.members.keys() | entries.keys() if old.of(m) != new.of(m)]
    change.set_target(new, changed)
    moves, unassigned = _moves(old, new, changed, catalogue)
    change.event(
        EventType.TARGET_INSTALLED,
        req.member_id,
        assignment_epoch=req.group_epoch,
        moves=moves,
        unassigned=unassigned,
        scheduled_rebalance_delay_ms=req.scheduled_rebalance_delay_ms,
    )
    change.set_meta(
        compute_requested_epoch=None,
        excluded_assignors=frozenset(),
        compute_not_before_ms=None,
        last_assignment_error=0,
        last_assignment_error_message="",
        prepared=None,
    )
    change.cancel((ASSIGNOR, ""))
    if scheduled_at is not None:
        change.schedule((SCHEDULED_REBALANCE, ""), scheduled_at)
        change.event(
            EventType.SCHEDULED_REBALANCE_SET,
            req.member_id,
            at_ms=scheduled_at,
            unassigned=unassigned,
        )
    elif old.scheduled_rebalance_at_ms is not None:
        change.cancel((SCHEDULED_REBALANCE, ""))


def _within(share: ResourceSet, catalogue: ResourceSet) -> ResourceSet:
    """`share & catalogue`, without a copy when the share is all in the catalogue (the rule)."""
    if share.connectors <= catalogue.connectors and share.tasks <= catalogue.tasks:
        return share
    return share & catalogue


def _moves(
    old: TargetAssignment,
    new: TargetAssignment,
    changed: list[str],
    catalogue: ResourceSet,
) -> tuple[list[dict[str, str | None]], list[str]]:
    """The resources whose owner the new target changes (from the changed members' entries
    only: O(what changed)), and every catalogue resource the new target gives to nobody, by
    display name. Only moved and unassigned resources are named."""
    before: dict[str | TaskId, str] = {}
    after: dict[str | TaskId, str] = {}
    for member_id in changed:
        for owners, entry in ((before, old.of(member_id)), (after, new.of(member_id))):
            owners.update(dict.fromkeys(entry.resources.connectors, member_id))
            owners.update(dict.fromkeys(entry.resources.tasks, member_id))
    moves = sorted(
        (
            {"resource": str(resource), "from": before.get(resource), "to": after.get(resource)}
            for resource in before.keys() | after.keys()
            if before.get(resource) != after.get(resource)
        ),
        key=lambda move: str(move["resource"]),
    )
    connectors = set(catalogue.connectors)
    tasks = set(catalogue.tasks)
    for entry in new.members.values():
        connectors.difference_update(entry.resources.connectors)
        tasks.difference_update(entry.resources.tasks)
    unassigned = sorted([*connectors, *(str(t) for t in tasks)])
    return moves, unassigned
