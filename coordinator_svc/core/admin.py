"""ConnectGroupAdmin's state-changing calls: the catalogue and the group configurations
(DESIGN 3.1). Reads (list, describe) are served from state by the adapters.

On a classic group (DESIGN 3.19) a catalogue change that would bump a connect group's epoch
starts a classic rebalance instead (when the group has members; an EMPTY group's generation is
left alone), and AlterGroupConfigs refuses to set a key that does not apply to the group's type
(`connect_protocol.configs`, each row's `group_types`); unsetting one is allowed."""

from __future__ import annotations

from types import MappingProxyType

from connect_protocol.configs import (
    ASSIGNOR_PRINCIPALS,
    BY_NAME,
    MIGRATION_POLICY,
    SESSION_TIMEOUT,
    applies_to,
    config_digest,
    configs_of,
    cross_key_problem,
)
from connect_protocol.errors import (
    CoordinatorError,
    GroupIdNotFound,
    InvalidRequest,
    PolicyViolation,
)
from connect_protocol.lifecycle_messages import TargetState
from connect_protocol.messages import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DeleteConnectorRequest,
    DeleteConnectorResponse,
    PutConnectorRequest,
    PutConnectorResponse,
)

from .change import GroupChange
from .conversion import maybe_downgrade
from .lifecycle import tell_holders
from .model import Connector, GroupConfigDefaults, GroupState
from .records import EventType
from .results import Result, refused
from .status import drop_task_statuses
from .validation import validate_alter_configs, validate_delete_connector, validate_put_connector
from .wire_size import prepare_bytes


def who(caller: str, principal: str | None) -> dict[str, str]:
    """Who made an admin change, for its event (DESIGN 3.17): the caller's principal ("" when
    not known: a handler called without one) and network address (`caller`)."""
    return {"principal": principal or "", "caller": caller}


def put_connector(
    state: GroupState | None,
    req: PutConnectorRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[PutConnectorResponse]:
    try:
        if not validated:
            validate_put_connector(req)
    except CoordinatorError as error:
        return refused(PutConnectorResponse, error)
    change = GroupChange(state, req.group_id, now_ms, defaults, creator=principal)
    existing = change.connector(req.connector)
    config = MappingProxyType(dict(req.config))
    connector = Connector(
        req.connector,
        req.task_count,
        config,
        config_digest(config, defaults.config_digest_key),
        TargetState.STARTED if existing is None else existing.target_state,  # a put keeps it
    )
    if existing is not None and existing == connector:
        return Result(change.records(), PutConnectorResponse(group_epoch=change.group_epoch))
    try:
        check_catalogue_limits(state, existing, connector, defaults)
    except CoordinatorError as error:
        return refused(PutConnectorResponse, error)
    grows = connector.wire_bytes() - (0 if existing is None else existing.wire_bytes())
    if grows > 0:
        catalogue = (
            0 if state is None else state.catalogue_wire_bytes + state.assignor_metadata_bytes
        ) + grows
        size = prepare_bytes(catalogue, change.member_count())
        if size > defaults.max_message_bytes:
            too_large = InvalidRequest(
                f"connector {req.connector!r} would make the group's PrepareAssignment answer "
                f"about {size:,} bytes, over the coordinator's maximum message size of "
                f"{defaults.max_message_bytes:,} bytes (--max-message-bytes); use fewer tasks "
                "or a smaller config, or raise the limit on the coordinator and every agent."
            )
            return Result([], PutConnectorResponse(too_large.code, too_large.message))
    change.put_connector(connector)
    if existing is not None and connector.effective_task_count < existing.effective_task_count:
        drop_task_statuses(change, req.connector, connector.effective_task_count)
    told = 0
    if existing is not None and existing.config_digest != connector.config_digest:
        told = tell_holders(change, existing)  # their revisions rise (DESIGN 3.20)
    change.event(
        EventType.CONNECTOR_PUT,
        connector=req.connector,
        task_count=req.task_count,
        previous_task_count=None if existing is None else existing.task_count,
        config_changed=existing is None or dict(existing.config) != dict(req.config),
        config_digest=connector.config_digest,
        holders_told=told,
        **who(req.caller, principal),
    )
    # The epoch bumps when the effective task count changes (DESIGN 3.20): a STOPPED
    # connector's new task_count is kept for resume and moves nothing.
    rebalance = existing is None or existing.effective_task_count != connector.effective_task_count
    if rebalance:
        reason = "connector added" if existing is None else "connector task count changed"
        rebalance = catalogue_changed(change, reason, req.connector)
    return change.result(
        PutConnectorResponse(
            group_epoch=change.group_epoch, created=existing is None, rebalance_triggered=rebalance
        )
    )


def catalogue_changed(change: GroupChange, reason: str, connector: str) -> bool:
    """The catalogue changed the assignor's input: a connect group's epoch is bumped (DESIGN
    3.3); a classic group with members starts a rebalance with no generation bump (the
    generation moves when its join phase completes, DESIGN 3.19), an EMPTY one does nothing.
    Returns whether a rebalance was started (a connect group: always)."""
    if not change.meta.is_classic:
        change.bump_epoch(reason, connector=connector)
        return True
    if not change.has_members():
        return False
    change.start_classic_rebalance(f"catalogue changed: {reason}", connector=connector)
    return True


def check_catalogue_limits(
    state: GroupState | None,
    existing: Connector | None,
    connector: Connector,
    defaults: GroupConfigDefaults,
) -> None:
    """POLICY_VIOLATION if putting `connector` (replacing `existing`) would take the group over
    one of the catalogue limits. O(1) in the catalogue: the group keeps running totals."""
    size = connector.config_bytes()
    if size > defaults.max_config_bytes_per_connector:
        raise PolicyViolation(
            f"connector {connector.name!r} has {size:,} bytes of config, over the limit of "
            f"{defaults.max_config_bytes_per_connector:,} per connector "
            "(--max-config-bytes-per-connector)."
        )
    before = (
        (0, 0, 0)
        if state is None
        else (len(state.catalogue), state.catalogue_tasks, state.catalogue_config_bytes)
    )
    after = (
        before[0] + (1 if existing is None else 0),
        before[1] + connector.task_count - (0 if existing is None else existing.task_count),
        before[2] + size - (0 if existing is None else existing.config_bytes()),
    )
    limits = (
        (defaults.max_connectors_per_group, "connectors", "--max-connectors-per-group"),
        (defaults.max_tasks_per_group, "tasks", "--max-tasks-per-group"),
        (defaults.max_config_bytes_per_group, "bytes of config", "--max-config-bytes-per-group"),
    )
    for old, new, (limit, what, flag) in zip(before, after, limits, strict=True):
        if new > limit and new > old:  # a group over a lowered limit may still shrink
            raise PolicyViolation(
                f"connector {connector.name!r} would give the group {new:,} {what}, over the "
                f"limit of {limit:,} per group ({flag})."
            )


def delete_connector(
    state: GroupState | None,
    req: DeleteConnectorRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[DeleteConnectorResponse]:
    try:
        if not validated:
            validate_delete_connector(req)
        if state is None:
            raise GroupIdNotFound(f"group {req.group_id!r} does not exist.")
        if req.connector not in state.catalogue:
            raise InvalidRequest(
                f"connector {req.connector!r} is not in the catalogue of group {req.group_id!r}."
            )
    except CoordinatorError as error:
        return refused(DeleteConnectorResponse, error)
    change = GroupChange(state, req.group_id, now_ms, defaults)
    change.remove_connector(req.connector)
    change.event(EventType.CONNECTOR_DELETED, connector=req.connector, **who(req.caller, principal))
    catalogue_changed(change, "connector deleted", req.connector)
    return change.result(DeleteConnectorResponse(group_epoch=change.group_epoch))


def alter_configs(
    state: GroupState | None,
    req: AlterConfigsRequest,
    now_ms: int,
    defaults: GroupConfigDefaults,
    validated: bool = False,
    principal: str | None = None,
) -> Result[AlterConfigsResponse]:
    change = GroupChange(state, req.group_id, now_ms, defaults, creator=principal)
    try:
        if not validated:
            validate_alter_configs(req)
        check_applicable(change, req)
        configs = change.configs()
        configs.update(req.set)
        for key in req.unset:
            configs.pop(key, None)
        effective = {**defaults.as_map(), **configs}
        problem = cross_key_problem(effective, lambda row, value: f"{row.name} ({value})")
        if problem is not None:
            raise InvalidRequest(f"{problem}.")
    except CoordinatorError as error:
        return refused(AlterConfigsResponse, error)
    classic = change.meta.is_classic
    if configs != change.configs():
        told = change.fencing_session_ms()
        if not classic and defaults.read(SESSION_TIMEOUT, configs) < told:
            # Members were told the higher value and fence themselves by it: until every one
            # has either heard the new value or stopped, expiry and holds keep to the old one.
            change.set_meta(session_floor_ms=told, session_floor_until_ms=now_ms + told)
        change.set_configs(configs)
        change.event(
            EventType.CONFIG_ALTERED,
            set=dict(req.set),
            unset=list(req.unset),
            **who(req.caller, principal),
        )
        if (
            not classic
            and state is not None
            and state.configs.get(ASSIGNOR_PRINCIPALS) != configs.get(ASSIGNOR_PRINCIPALS)
        ):
            # Who may compute changed (DESIGN 3.4): choose again. No epoch bump, the assignor's
            # input is the same; a newly chosen member is asked on its next heartbeat if a
            # computation is due, and a Prepare or Install from the old one is refused.
            change.reselect_assignor()
        # A classic group's leader is chosen among `assignor.principals` when its next join
        # phase completes; a config change starts no classic rebalance (DESIGN 3.19).
        if (
            not classic
            and state is not None
            and state.configs.get(MIGRATION_POLICY.name) != configs.get(MIGRATION_POLICY.name)
        ):
            # A downgrade the old policy forbade may be allowed now (DESIGN 3.19).
            maybe_downgrade(change, "migration policy changed")
    return Result(
        change.records(), AlterConfigsResponse(effective_configs=effective), change.timers
    )


def check_applicable(change: GroupChange, req: AlterConfigsRequest) -> None:
    """INVALID_REQUEST if `req` sets a configuration that does not apply to the group's type
    (DESIGN 3.19): a classic group's members choose their own session and rebalance timeouts,
    and waves and assignment batching are the connect protocol's. Unsetting one is allowed (a
    group converted from connect may carry it). O(keys set)."""
    group_type = change.meta.group_type.value
    refused_keys = sorted(
        key
        for key in req.set
        if (row := BY_NAME.get(key)) is not None and not applies_to(row, group_type)
    )
    if refused_keys:
        applicable = ", ".join(row.name for row in configs_of(group_type)) or "none"
        verb = "does" if len(refused_keys) == 1 else "do"
        raise InvalidRequest(
            f"group {req.group_id!r} is a {group_type} group: {', '.join(refused_keys)} "
            f"{verb} not apply to {group_type} groups (their members choose their own session "
            "and rebalance timeouts; waves and assignment batching are the connect protocol's); "
            f"set only {applicable}, or unset it."
        )
