"""ConnectGroupPrepareAssignment and ConnectGroupInstallAssignment (seed 000; DESIGN 3.4-3.10).

Both are the connect protocol's: on a classic group (DESIGN 3.19), whose leader computes in its
SyncGroup, they are INCONSISTENT_GROUP_PROTOCOL naming the group's type."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import repeat
from types import MappingProxyType

from connect_protocol.configs import (
    ASSIGNOR_CONFIG_KEYS,
    ASSIGNOR_PRINCIPALS,
    HEARTBEAT_INTERVAL,
    REBALANCE_WAVE_PAUSE,
    SCHEDULED_REBALANCE_MAX_DELAY,
)
from connect_protocol.errors import (
    CoordinatorError,
    ErrorCode,
    FencedMemberEpoch,
    GroupAuthorizationFailed,
    GroupIdNotFound,
    InconsistentGroupProtocol,
    InvalidAssignment,
    PolicyViolation,
    UnknownMemberId,
)
from connect_protocol.messages import (
    Assignor,
    ConnectorInfo,
    InstallRequest,
    InstallResponse,
    MemberTarget,
    PreparedMemberInfo,
    PrepareRequest,
    PrepareResponse,
)
from connect_protocol.ordering import sorted_in_chunks
from connect_protocol.resources import (
    BY_CONNECTOR_FROM,
    ConnectorTasks,
    ResourceSet,
    TaskId,
    union,
    within_catalogue,
)

from .change import GroupChange
from .model import (
    Connector,
    GroupConfigDefaults,
    GroupState,
    Member,
    MemberState,
    PreparedSnapshot,
    TargetAssignment,
    TargetEntry,
)
from .records import EventType
from .results import ASSIGNOR, SCHEDULED_REBALANCE, Result, refused
from .selection import GroupProfiles, NoSelection, Selection, select_with
from .validation import validate_install, validate_prepare


def _assignor_member(
    state: GroupState | None,
    group_id: str,
    member_id: str,
    member_epoch: int,
    principal: str | None,
    defaults: GroupConfigDefaults,
    may_describe: bool = True,
) -> tuple[GroupState, Member]:
    """Seed 000's checks 1-4, shared by Prepare and Install; and that the caller is the
    principal the member is bound to (None: not checked, as in the core's own tests). The
    refusal of a non-assignor names the assignor member only to a caller that `may_describe`
    the group."""
    if state is None:
        raise GroupIdNotFound(f"group {group_id!r} does not exist.")
    if state.meta.is_classic:
        raise InconsistentGroupProtocol(
            f"group {group_id!r} is a classic group: its leader computes assignments and sends "
            "them in its SyncGroup (ConnectGroupClassic); PrepareAssignment and "
            "InstallAssignment are the connect protocol's. Abandon the computation."
        )
    member = state.members.get(member_id)
    if member is None:
        raise UnknownMemberId(f"member {member_id!r} is not in group {group_id!r}.")
    if principal is not None and member.principal and member.principal != principal:
        raise GroupAuthorizationFailed(
            f"member id {member_id!r} belongs to another principal; only the assignor member's "
            "own principal may prepare or install an assignment."
        )
    if member_epoch != member.member_epoch:
        raise FencedMemberEpoch(
            f"member epoch {member_epoch} does not match the coordinator's "
            f"{member.member_epoch}; retry with the epoch of your next heartbeat response."
        )
    if state.meta.assignor_member_id != member_id:
        chosen = f" ({state.meta.assignor_member_id or 'nobody'} is)" if may_describe else ""
        raise UnknownMemberId(
            f"member {member_id!r} is not the group's assignor member{chosen}; "
            "abandon the computation."
        )
    allowed = state.assignor_principals(defaults)
    if allowed is not None and member.principal not in allowed:
        # Chosen before the server's default `assignor.principals` changed (a group config
        # change reselects at once); its next heartbeat passes the role on (heartbeat.py).
        raise UnknownMemberId(
            f"member {member_id!r} may not compute group {group_id!r}'s assignment: "
            f"{ASSIGNOR_PRINCIPALS} does not list its principal; abandon the computation."
        )
    return state, member


def current_selection(state: GroupState, defaults: GroupConfigDefaults) -> Selection | NoSelection:
    """The selection as it stands (no exclusions): O(profiles), from the state's index."""
    profiles = GroupProfiles(
        state.selection_index, frozenset(), {}, state.profile, {}, state.principal_of
    )
    return select_with(
        profiles, state.meta.assignor_member_id, principals=state.assignor_principals(defaults)
    )


@dataclass(frozen=True, slots=True)
class PrepareView:
    """What a Prepare captured of the group under its lock: immutable values only (members and
    connectors are immutable objects; the tuples are copies of the group's maps), so that
    `finish_prepare` can build the O(members + resources) answer after the lock is released,
    while the group serves on."""

    group_epoch: int
    selection: Selection
    members: tuple[Member, ...]
    catalogue: tuple[Connector, ...]
    target: TargetAssignment
    configs: Mapping[str, str]
    now_ms: int
    error_code: ErrorCode = ErrorCode.NONE


def start_prepare(
    state: GroupState | None,
    req: PrepareRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
    may_describe: bool = True,
) -> Result[PrepareView | PrepareResponse]:
    """The part of a Prepare that needs the group: checks, the snapshot its install is
    validated against, and a `PrepareView` (O(members) pointer copies)."""
    try:
        if not validated:
            validate_prepare(req)
        state, _member = _assignor_member(
            state, req.group_id, req.member_id, req.member_epoch, principal, defaults, may_describe
        )
    except CoordinatorError as error:
        return refused(PrepareResponse, error)
    selection = current_selection(state, defaults)
    assert isinstance(selection, Selection), "an allowed assignor member implies a selection"
    change = GroupChange(state, req.group_id, now_ms, defaults)
    snapshot = PreparedSnapshot(
        group_epoch=state.group_epoch,
        member_ids=frozenset(state.members),
        catalogue=state.catalogue_resources(),
    )
    if state.meta.prepared != snapshot:
        change.set_meta(prepared=snapshot)
    view = PrepareView(
        group_epoch=state.group_epoch,
        selection=selection,
        members=tuple(state.members.values()),
        catalogue=tuple(state.catalogue.values()),
        target=state.target,
        configs={k: v for k, v in change.effective_configs().items() if k in ASSIGNOR_CONFIG_KEYS},
        now_ms=now_ms,
    )
    return Result(change.records(), view, change.timers)


def finish_prepare(view: PrepareView | PrepareResponse) -> PrepareResponse:
    """The Prepare answer from what `start_prepare` captured (an error answer as it is)."""
    if isinstance(view, PrepareResponse):
        return view
    selection = view.selection
    members = tuple(
        PreparedMemberInfo(
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            instance_id=m.instance_id,
            url=m.url,
            assignor=m.assignor(selection.assignor_name)
            or Assignor(selection.assignor_name, selection.version, selection.version),
            owned=m.owned,
            last_grant_at_ms=m.last_grant_at_ms,
        )
        for m in sorted(view.members, key=lambda m: m.member_id)
    )
    target = view.target
    return PrepareResponse(
        group_epoch=view.group_epoch,
        assignor_name=selection.assignor_name,
        assignor_version=selection.version,
        members=members,
        catalogue=tuple(
            ConnectorInfo(
                c.name, c.effective_task_count, {}
            )  # configs carry secrets; no assignor reads them
            for c in sorted(view.catalogue, key=lambda c: c.name)
        ),
        assignment_epoch=target.assignment_epoch,
        target=tuple(
            MemberTarget(member_id, e.resources, e.version, e.metadata)
            for member_id, e in sorted(target.members.items())
        ),
        assignor_state=target.assignor_state,
        group_configs=view.configs,
        coordinator_time_ms=view.now_ms,
        scheduled_rebalance_at_ms=target.scheduled_rebalance_at_ms,
    )


def prepare_assignment(
    state: GroupState | None, req: PrepareRequest, now_ms: int, defaults: GroupConfigDefaults
) -> Result[PrepareResponse]:
    """ConnectGroupPrepareAssignment in one step: `start_prepare`, then `finish_prepare`."""
    started = start_prepare(state, req, now_ms, defaults)
    return Result(started.records, finish_prepare(started.response), started.timers)


@dataclass(frozen=True, slots=True)
class InstallPlan:
    """The O(members + resources) part of an install, worked out before the group's lock is
    taken from values that never change in place (the Prepare snapshot, the current target,
    the catalogue's resources). Under the lock it is used only if those are still the group's
    very objects and every member it names is still present; otherwise the install is computed
    there in full. So a large install holds the group only for O(members) lookups."""

    request: InstallRequest
    snapshot: PreparedSnapshot
    old_target: TargetAssignment
    catalogue: ResourceSet
    entries: Mapping[str, TargetEntry]
    changed: tuple[str, ...]
    moves: list[dict[str, str | None]]
    unassigned: list[str]

    def applies_to(self, state: GroupState, req: InstallRequest) -> bool:
        return (
            req is self.request
            and state.meta.prepared is self.snapshot
            and state.target is self.old_target
            and state.cached_catalogue_resources() is self.catalogue
            and all(member_id in state.members for member_id in self.entries)
        )


def plan_install(
    state: GroupState | None, req: InstallRequest, validated: bool = False
) -> InstallPlan | None:
    """An `InstallPlan` for `req`, or None when there is nothing to plan (an error report, no
    snapshot yet, a request the full path will refuse). Reads only values of `state` that are
    replaced, never changed in place, so it may run without the group's lock."""
    if state is None or req.error != 0:
        return None
    snapshot = state.meta.prepared
    old_target = state.target
    catalogue = state.cached_catalogue_resources()
    if snapshot is None or catalogue is None or snapshot.group_epoch != req.group_epoch:
        return None
    try:
        if not validated:
            validate_install(req)
        _validate_against(snapshot, req)
    except CoordinatorError:
        return None
    # Validated within the Prepare's catalogue: when that is the very catalogue of now, each
    # share is within it, and not checked again (a subset test of each small share's tasks).
    entries = _entries(req, catalogue, within=snapshot.catalogue is catalogue)
    new = TargetAssignment(req.group_epoch, MappingProxyType(entries))
    changed = _changed(old_target, new)
    moves, unassigned = _moves(old_target, new, changed, catalogue)
    return InstallPlan(
        req, snapshot, old_target, catalogue, entries, tuple(changed), moves, unassigned
    )


def install_assignment(
    state: GroupState | None,
    req: InstallRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    plan: InstallPlan | None = None,
    validated: bool = False,
    principal: str | None = None,
    may_describe: bool = True,
) -> Result[InstallResponse]:
    """ConnectGroupInstallAssignment. With a `plan` (see `plan_install`) that still applies,
    the O(resources) validation and diff are taken from it."""
    try:
        if state is None or plan is None or not plan.applies_to(state, req):
            plan = None
            if not validated:
                validate_install(req)
        state, _member = _assignor_member(
            state, req.group_id, req.member_id, req.member_epoch, principal, defaults, may_describe
        )
        _check_assignor_state_size(req, defaults)
        change = GroupChange(state, req.group_id, now_ms, defaults)
        snapshot = _check_epochs(state, req)
        if req.error != 0:
            _record_failure(change, req)
        else:
            if plan is None:
                _validate_against(snapshot, req)
            _install(change, req, plan)
    except CoordinatorError as error:
        return refused(InstallResponse, error)
    return Result(change.records(), InstallResponse(), change.timers)


def _check_assignor_state_size(req: InstallRequest, defaults: GroupConfigDefaults) -> None:
    """POLICY_VIOLATION if the assignor state plus the per-member metadata exceed the limit:
    they are stored and handed to every later assignor (O(members) byte lengths)."""
    size = len(req.assignor_state) + sum(len(m.metadata) for m in req.members)
    if size > defaults.max_assignor_state_bytes:
        raise PolicyViolation(
            f"the assignor state and per-member metadata take {size:,} bytes, over the limit of "
            f"{defaults.max_assignor_state_bytes:,} (--max-assignor-state-bytes)."
        )


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
    # By connector, the shares' tasks so far: a connector in one share is its share's object,
    # one split among shares a set of them all (O(resources) in all, never a copy per share);
    # when every share is small, all in one set (a connector per share would cost more).
    tasks: dict[str, ConnectorTasks | set[TaskId]] = {}
    all_tasks: set[TaskId] = set()
    by_connector = any(m.resources.task_count() >= BY_CONNECTOR_FROM for m in req.members)
    task_count = 0
    for m in req.members:
        if m.member_id not in snapshot.member_ids:
            raise InvalidAssignment(
                f"member {m.member_id!r} was not in the group at epoch {snapshot.group_epoch}."
            )
        share = m.resources
        if not within_catalogue(share, catalogue):  # O(connectors) once their order is known
            unknown = share - catalogue
            raise InvalidAssignment(
                f"{unknown.describe()} assigned to {m.member_id!r} are not in the catalogue of "
                f"epoch {snapshot.group_epoch}."
            )
        twice_connectors = connectors & share.connectors
        twice_tasks: list[TaskId] = []
        if not by_connector:
            if not all_tasks.isdisjoint(share.tasks):
                twice_tasks.extend(all_tasks & share.tasks)
            all_tasks.update(share.tasks)
        for connector, held in share.by_connector().items() if by_connector else ():
            earlier = tasks.get(connector)
            if earlier is None:
                tasks[connector] = held
                continue
            if not held.isdisjoint(earlier):
                twice_tasks.extend(held & earlier)
            if isinstance(earlier, set):
                earlier.update(held)
            else:
                tasks[connector] = {*earlier, *held}
        if twice_connectors or twice_tasks:
            twice = ResourceSet(frozenset(twice_connectors), frozenset(twice_tasks))
            raise InvalidAssignment(f"{twice.describe()} assigned more than once.")
        connectors.update(share.connectors)
        task_count += share.task_count()
    covered = len(connectors) + task_count == len(catalogue)  # disjoint shares, all in it
    if not covered and req.scheduled_rebalance_delay_ms <= 0:
        unassigned = catalogue - union(m.resources for m in req.members)
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


def _entries(
    req: InstallRequest, catalogue: ResourceSet, within: bool = False
) -> dict[str, TargetEntry]:
    """The target's entries: each share restricted to `catalogue` (`within`: known to be
    within it already)."""
    if within:
        return {m.member_id: TargetEntry(m.resources, m.version, m.metadata) for m in req.members}
    return {
        m.member_id: TargetEntry(_within(m.resources, catalogue), m.version, m.metadata)
        for m in req.members
    }


def _changed(old: TargetAssignment, new: TargetAssignment) -> list[str]:
    """Members whose entry differs between two targets (added, changed or gone)."""
    return [m for m in old.members.keys() | new.members.keys() if old.of(m) != new.of(m)]


def _install(change: GroupChange, req: InstallRequest, plan: InstallPlan | None) -> None:
    """DESIGN 3.9: members that left since are dropped, resources deleted since are dropped,
    members that joined since get nothing; a newer group epoch asks for a new computation as
    soon as `assignment.interval.ms` allows (DESIGN 3.21: the request it answers is no longer
    outstanding, so the assignor member's next heartbeat after the interval asks)."""
    catalogue = change.catalogue_resources()
    if plan is not None:
        entries = dict(plan.entries)  # every member it names is present (`applies_to`)
    else:
        entries = {
            member_id: entry
            for member_id, entry in _entries(req, catalogue).items()
            if change.member(member_id) is not None
        }
    old = change.target
    # A lost-work delay is capped by scheduled.rebalance.max.delay.ms; the next wave by the
    # longest of that, the wave pause and the heartbeat interval (a paced assignor waits for a
    # delivery at least a heartbeat, then a pause), so that a delay of 0 cannot make it spin.
    max_delay = change.config(SCHEDULED_REBALANCE_MAX_DELAY)
    max_wave_delay = max(
        max_delay, change.config(REBALANCE_WAVE_PAUSE), change.config(HEARTBEAT_INTERVAL)
    )

    def at(delay_ms: int, cap: int) -> int | None:
        return change.now_ms + min(delay_ms, cap) if delay_ms > 0 else None

    lost_at = at(req.lost_work_delay_ms, max_delay)
    wave_at = at(req.next_wave_delay_ms, max_wave_delay)
    reasons = [t for t in (lost_at, wave_at) if t is not None]
    scheduled_at = min(reasons) if reasons else at(req.scheduled_rebalance_delay_ms, max_delay)
    new = TargetAssignment(
        assignment_epoch=req.group_epoch,
        members=MappingProxyType(entries),
        assignor_state=req.assignor_state,
        scheduled_rebalance_at_ms=scheduled_at,
        lost_work_rebalance_at_ms=lost_at,
        next_wave_at_ms=wave_at,
    )
    if plan is not None:
        changed, moves, unassigned = list(plan.changed), plan.moves, plan.unassigned
    else:
        changed = _changed(old, new)
        moves, unassigned = _moves(old, new, changed, catalogue)
    change.set_target(new, changed)
    moved = _unchanged_members(change, new)
    if moved:
        change.move_members(moved, new.assignment_epoch)
    change.event(
        EventType.TARGET_INSTALLED,
        req.member_id,
        assignment_epoch=req.group_epoch,
        moves=moves,
        unassigned=unassigned,
        moved_members=moved,
        scheduled_rebalance_delay_ms=req.scheduled_rebalance_delay_ms,
        **({"lost_work_delay_ms": req.lost_work_delay_ms} if req.lost_work_delay_ms else {}),
        **({"next_wave_delay_ms": req.next_wave_delay_ms} if req.next_wave_delay_ms else {}),
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


def _unchanged_members(change: GroupChange, new: TargetAssignment) -> list[str]:
    """The members an install moves to its epoch at once (DESIGN 3.21), sorted: STABLE, nothing
    pending, and a share in `new` equal to what they were last told to run (a member the
    install does not name has an empty share). Reconciling any of them would only move its
    epoch; nothing else about them changes, so none is written one by one. Never a member of
    the classic protocol: it learns a new epoch only through JoinGroup, as in Kafka."""
    return sorted(
        member_id
        for member_id, m in change.members().items()
        if m.state is MemberState.STABLE
        and m.classic is None  # classic members learn epochs only by JoinGroup (3.21)
        and not m.pending_revocation
        and m.member_epoch < new.assignment_epoch
        and m.assigned == new.of(member_id).resources
    )


def _within(share: ResourceSet, catalogue: ResourceSet) -> ResourceSet:
    """`share & catalogue`, without a copy when the share is all in the catalogue (the rule)."""
    if within_catalogue(share, catalogue):
        return share
    return share & catalogue


def _moves(
    old: TargetAssignment,
    new: TargetAssignment,
    changed: list[str],
    catalogue: ResourceSet,
) -> tuple[list[dict[str, str | None]], list[str]]:
    """The resources whose owner the new target changes (from the changed members' entries
    only: what each of them lost or gained, found with set operations, so that Python touches
    only the moved resources: O(what moved)), and every catalogue resource the new target gives
    to nobody, by display name. Only moved and unassigned resources are named."""
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    tasks_before: dict[TaskId, str] = {}
    tasks_after: dict[TaskId, str] = {}
    for member_id in changed:
        was, now = old.of(member_id).resources, new.of(member_id).resources
        lost, gained = was - now, now - was
        before.update(dict.fromkeys(lost.connectors, member_id))
        tasks_before.update(dict.fromkeys(lost.tasks, member_id))
        after.update(dict.fromkeys(gained.connectors, member_id))
        tasks_after.update(dict.fromkeys(gained.tasks, member_id))
    # A target gives a resource to one member at most, so a resource a changed member kept is
    # in neither map, and one in either map changed its owner.
    # A connector may be named like another's task ("c-1" and task 1 of "c"): the kind breaks
    # the tie, so no two keys are equal and the owners (a name or None) are never compared.
    # Built by C calls over the moved resources but the tasks' names (as `TaskId.__str__`
    # names them, without its call): 5,000 moved tasks took 25 ms a Python step each.
    moved = list(before.keys() | after.keys())
    moved_tasks = list(tasks_before.keys() | tasks_after.keys())
    named = sorted_in_chunks(
        [
            *zip(moved, repeat(False), map(before.get, moved), map(after.get, moved)),
            *zip(
                [f"{connector}-{number}" for connector, number in moved_tasks],
                repeat(True),
                map(tasks_before.get, moved_tasks),
                map(tasks_after.get, moved_tasks),
            ),
        ]
    )
    moves: list[dict[str, str | None]] = [
        {"resource": name, "from": was_owner, "to": now_owner}
        for name, _task, was_owner, now_owner in named
    ]
    # The shares are within the catalogue and disjoint (validated), so when their sizes add up
    # to the catalogue's, nothing is unassigned: no copy of a 100,000-task catalogue set (one
    # C call that held the interpreter for tens of milliseconds at every install).
    if sum(len(entry.resources) for entry in new.members.values()) == len(catalogue):
        return moves, []
    connectors = set(catalogue.connectors)
    tasks = set(catalogue.tasks)
    for entry in new.members.values():
        connectors.difference_update(entry.resources.connectors)
        tasks.difference_update(entry.resources.tasks)
    unassigned = sorted([*connectors, *(str(t) for t in tasks)])
    return moves, unassigned
