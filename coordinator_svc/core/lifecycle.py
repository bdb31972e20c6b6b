"""The connector lifecycle as members see it (DESIGN 3.20): each member's lifecycle revision,
raised for the holders of a connector whose config changed (grants raise it in `delivery`);
ConnectGroupConfigs, which hands a member the configs of what it holds and nothing else; and
the identity check both member calls share (the epochs a heartbeat would accept, never a
removal). Statuses are `status.py`'s.

Costs: a config change O(the connector's tasks) (its holders are found through the owner
index); a ConnectGroupConfigs answer O(the member's share); neither looks at other members."""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.errors import (
    CoordinatorError,
    FencedMemberEpoch,
    GroupAuthorizationFailed,
    GroupIdNotFound,
    UnknownMemberId,
)
from connect_protocol.lifecycle_messages import (
    ConfigsRequest,
    ConfigsResponse,
    HeldConnector,
)
from connect_protocol.resources import TaskId
from connect_protocol.tokens import Resource

from .change import GroupChange
from .heartbeat import told_its_assignment_at
from .model import CONNECTOR_TASK, Connector, GroupConfigDefaults, GroupState, Member, MemberState
from .results import Result, refused
from .validation import validate_configs_request


def raised(member: Member) -> Member:
    """The member with its lifecycle revision raised by one."""
    return replace(member, lifecycle_revision=member.lifecycle_revision + 1)


def tell_holders(change: GroupChange, before: Connector) -> int:
    """Raise the revision of every member that holds connector `before.name` or one of its
    tasks (assigned or pending), in `change`: its config changed. Holds are skipped (nobody
    runs their work). Returns how many members were told. O(before.task_count + the members
    this change already touched), never O(tasks x holders)."""
    told = 0
    for member_id in sorted(change.holders_of(before.name, before.task_count)):
        member = change.member(member_id)
        if member is not None:
            change.put_member(raised(member))
            told += 1
    return told


def acting_member(
    state: GroupState | None,
    group_id: str,
    member_id: str,
    epoch: int,
    principal: str | None,
) -> Member:
    """The member a ConnectGroupConfigs or ConnectGroupReportStatus call acts as, checked as a
    heartbeat would check it (DESIGN 3.21): its own principal, and an epoch the member was told
    (a connect member: its epoch, or one since it was last sent its assignment; a classic
    member: its generation). Anything else raises, and nothing is removed: these calls change
    no membership."""
    if state is None:
        raise GroupIdNotFound(f"group {group_id!r} does not exist.")
    member = state.members.get(member_id)
    if member is None or member.state is MemberState.LEFT:
        raise UnknownMemberId(
            f"member {member_id!r} is not in group {group_id!r}; rejoin before asking."
        )
    if principal is not None and member.principal and member.principal != principal:
        raise GroupAuthorizationFailed(
            f"member id {member_id!r} belongs to another principal; use an id of your own."
        )
    if epoch == member.member_epoch:
        return member
    if member.classic is None and told_its_assignment_at(member, epoch):
        return member
    what = "generation" if member.classic is not None else "epoch"
    raise FencedMemberEpoch(
        f"{what} {epoch} is not member {member_id!r}'s current {what} "
        f"({member.member_epoch}); the member was not removed: heartbeat, then ask again "
        "with the epoch of the answer."
    )


def held_connectors(member: Member) -> list[str]:
    """The connectors whose connector or tasks are in the member's current assignment (pending
    revocation excluded), by name. O(share)."""
    names = set(member.assigned.connectors)
    names.update(t.connector for t in member.assigned.tasks)
    return sorted(names)


def configs(
    state: GroupState | None,
    req: ConfigsRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[ConfigsResponse]:
    """ConnectGroupConfigs: writes nothing. O(the member's share)."""
    try:
        if not validated:
            validate_configs_request(req)
        member = acting_member(state, req.group_id, req.member_id, req.member_epoch, principal)
    except CoordinatorError as error:
        return refused(ConfigsResponse, error)
    assert state is not None
    held: list[HeldConnector] = []
    restarts: dict[Resource, int] = {}
    for name in held_connectors(member):
        connector = state.catalogue.get(name)
        if connector is None:
            continue  # deleted: its resources are being revoked
        known = req.known_digests.get(name)
        held.append(
            HeldConnector(
                connector=name,
                config_digest=connector.config_digest,
                config=None if known == connector.config_digest else connector.config,
                target_state=connector.target_state,
            )
        )
        for task, status in state.statuses.get(name, {}).items():
            if status.restart_count <= 0:
                continue
            if task == CONNECTOR_TASK:
                if name in member.assigned.connectors:
                    restarts[name] = status.restart_count
            elif (resource := TaskId(name, task)) in member.assigned.tasks:
                restarts[resource] = status.restart_count
    return Result(
        [],
        ConfigsResponse(
            lifecycle_revision=member.lifecycle_revision,
            connectors=tuple(held),
            restart_counts=restarts,
        ),
    )
