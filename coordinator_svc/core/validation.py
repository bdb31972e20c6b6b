"""Request validation: every invariant seed 000 lists per API, plus DESIGN's additions.

Each check raises InvalidRequest with a message that names the broken rule.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from collections.abc import Set as AbstractSet

from connect_protocol.configs import (
    BY_NAME,
    CONFIG_KEYS,
    cross_key_problem,
)

# Re-exported for their importers; defined with the group configurations.
from connect_protocol.configs import MAX_ASSIGNOR_PRINCIPALS as MAX_ASSIGNOR_PRINCIPALS
from connect_protocol.configs import MAX_PRINCIPAL_LENGTH as MAX_PRINCIPAL_LENGTH
from connect_protocol.errors import InvalidRequest
from connect_protocol.lifecycle_messages import (
    ConfigsRequest,
    ReportedState,
    ReportStatusRequest,
    RestartRequest,
    TargetStateRequest,
)
from connect_protocol.messages import (
    JOIN_EPOCH,
    STATIC_LEAVE_EPOCH,
    AlterConfigsRequest,
    DeleteConnectorRequest,
    DeleteGroupRequest,
    HeartbeatRequest,
    InstallRequest,
    PrepareRequest,
    PutConnectorRequest,
    RemoveMemberRequest,
)
from connect_protocol.resources import ResourceSet

MAX_NAME_LENGTH = 249
MAX_TASKS_PER_CONNECTOR = 100_000
MAX_URL_LENGTH = 2_048
MAX_ERROR_MESSAGE_LENGTH = 4_096
#: Assignors one member may list (the agent lists two; each is kept per member and compared
#: across the group).
MAX_CLIENT_ASSIGNORS = 64


def _require(condition: bool, rule: str) -> None:
    if not condition:
        raise InvalidRequest(rule)


def _check_text(value: str, what: str, max_length: int) -> None:
    """Any string that reaches the database: bounded, and free of the NUL character, which
    PostgreSQL refuses in text and JSON (a commit that fails on it would cost the whole
    group its owner for a moment)."""
    _require(len(value) <= max_length, f"{what} must be at most {max_length} characters.")
    _require("\x00" not in value, f"{what} must not contain the NUL character.")


def _check_name(value: str, what: str) -> None:
    _require(value != "", f"{what} must be non-empty.")
    _check_text(value, what, MAX_NAME_LENGTH)


def _check_resources(resources: ResourceSet, what: str) -> None:
    _check_names(
        resources.connectors,
        f"{what}: connector names must be non-empty.",
        f"{what}: a connector name",
    )
    if not resources.task_count():
        return
    # Each distinct connector once, the lowest task id once: a share holds thousands of tasks
    # of a few connectors (the passes over the tasks run in C; kept by connector, O(connectors)).
    shards = resources.kept_by_connector()
    if shards is not None:
        connectors: AbstractSet[str] = shards.keys()
        lowest = min((held.lowest() for held in shards.values()), key=_TASK_NUMBER)
    else:
        connectors = set(map(_CONNECTOR, resources.tasks))
        lowest = min(resources.tasks, key=_TASK_NUMBER)
    _check_names(
        connectors, f"{what}: a task's connector must be non-empty.", f"{what}: a task's connector"
    )
    _require(lowest.task >= 0, f"{what}: task ids must be >= 0 (got {lowest}).")


def _check_names(names: AbstractSet[str], empty_rule: str, label: str) -> None:
    """Every name non-empty, at most MAX_NAME_LENGTH long and without NUL: checked by a few
    passes in C (a heartbeat's owned list names a hundred connectors; a Python step and two
    formatted messages each were a tenth of the coordinator's time while 1,000 members
    joined), and name by name only to say which rule one breaks."""
    if (
        "" not in names
        and max(map(len, names), default=0) <= MAX_NAME_LENGTH
        and "\x00" not in "".join(names)
    ):
        return
    for name in names:
        _require(name != "", empty_rule)
        _check_text(name, label, MAX_NAME_LENGTH)


_CONNECTOR = operator.itemgetter(0)
_TASK_NUMBER = operator.itemgetter(1)


def validate_group_id(group_id: str) -> None:
    """For calls that only name a group (DescribeGroups, FindCoordinator)."""
    _check_name(group_id, "GroupId")


def validate_text(value: str, what: str, max_length: int) -> None:
    """Any other string that reaches the database (an ACL's principal or pattern)."""
    _check_text(value, what, max_length)


def validate_page_token(token: str) -> None:
    """ListGroups' page token: a group id from a previous page, or empty."""
    _check_text(token, "PageToken", MAX_NAME_LENGTH)


def validate_heartbeat(req: HeartbeatRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.member_id, "MemberId")
    _require(req.member_epoch >= STATIC_LEAVE_EPOCH, "MemberEpoch must be >= -2.")
    if req.instance_id is not None:
        _require(req.instance_id != "", "InstanceId, if provided, must be non-empty.")
        _check_text(req.instance_id, "InstanceId", MAX_NAME_LENGTH)
    if req.url is not None:
        _check_text(req.url, "Url", MAX_URL_LENGTH)
    if req.server_assignor is not None:
        _check_text(req.server_assignor, "ServerAssignor", MAX_NAME_LENGTH)
    if req.member_epoch == STATIC_LEAVE_EPOCH:
        _require(
            req.instance_id is not None,
            "MemberEpoch -2 (static leave) is accepted only with an InstanceId.",
        )
    if req.member_epoch == JOIN_EPOCH:
        _require(
            req.rebalance_timeout_ms is not None and req.rebalance_timeout_ms > 0,
            "RebalanceTimeoutMs must be larger than zero in the first heartbeat request "
            "(every epoch-0 heartbeat, join or rejoin).",
        )
    elif req.rebalance_timeout_ms is not None:
        _require(
            req.rebalance_timeout_ms > 0 or req.rebalance_timeout_ms == -1,
            "RebalanceTimeoutMs must be larger than zero, or -1 for unchanged.",
        )
    _require(
        req.server_assignor is None or req.client_assignors is None,
        "ServerAssignor and ClientAssignors cannot be used together.",
    )
    _require(
        len(req.client_assignors or ()) <= MAX_CLIENT_ASSIGNORS,
        f"ClientAssignors may list at most {MAX_CLIENT_ASSIGNORS} assignors.",
    )
    for a in req.client_assignors or ():
        _require(a.name != "", "Assignor.Name must be non-empty.")
        _check_text(a.name, "Assignor.Name", MAX_NAME_LENGTH)
        _require(a.minimum_version >= -1, f"Assignor.MinimumVersion must be >= -1 ({a.name}).")
        _require(
            a.maximum_version >= 0 and a.maximum_version >= a.minimum_version,
            f"Assignor.MaximumVersion must be >= 0 and >= Assignor.MinimumVersion ({a.name}).",
        )
        _require(
            a.minimum_version <= a.version <= a.maximum_version,
            f"Assignor.Version must be >= Assignor.MinimumVersion and <= "
            f"Assignor.MaximumVersion ({a.name}).",
        )
        _require(
            0 <= a.reason <= 127,
            f"Assignor.Reason must fit an int8 and be >= 0: between 0 and 127 ({a.name}).",
        )
    if req.client_assignors is not None:
        names = [a.name for a in req.client_assignors]
        _require(len(set(names)) == len(names), "Assignor names must be unique in ClientAssignors.")
    if req.owned is not None:
        _check_resources(req.owned, "ConnectorsAndTasks")


def validate_prepare(req: PrepareRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.member_id, "MemberId")
    _require(req.member_epoch >= 0, "MemberEpoch must be >= 0.")


#: Digests a ConnectGroupConfigs request may name (one per connector a member could hold).
MAX_KNOWN_DIGESTS = 10_000
#: Entries one ConnectGroupReportStatus may carry.
MAX_STATUS_ENTRIES = 10_000
#: The longest trace a report may carry (what is kept is cut to --status-trace-max-bytes).
MAX_TRACE_CHARACTERS = 1_000_000
MAX_DIGEST_LENGTH = 80


def validate_configs_request(req: ConfigsRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.member_id, "MemberId")
    _require(req.member_epoch >= 1, "MemberEpoch must be >= 1 (the member's epoch or generation).")
    _require(
        len(req.known_digests) <= MAX_KNOWN_DIGESTS,
        f"KnownDigests must name at most {MAX_KNOWN_DIGESTS:,} connectors.",
    )
    for connector, digest in req.known_digests.items():
        _check_name(connector, "KnownDigests' connector")
        _check_text(digest, "KnownDigests' digest", MAX_DIGEST_LENGTH)


def validate_target_state(req: TargetStateRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.connector, "Connector")


def validate_restart(req: RestartRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.connector, "Connector")
    _require(req.task is None or req.task >= 0, f"Task must be >= 0 (got {req.task}).")


def validate_report_status(req: ReportStatusRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.member_id, "MemberId")
    _require(req.member_epoch >= 1, "MemberEpoch must be >= 1 (the member's epoch or generation).")
    _require(len(req.entries) >= 1, "Entries must name at least one resource.")
    _require(
        len(req.entries) <= MAX_STATUS_ENTRIES,
        f"Entries must name at most {MAX_STATUS_ENTRIES:,} resources.",
    )
    seen: set[object] = set()
    for e in req.entries:
        resource = e.resource
        if isinstance(resource, str):
            _check_name(resource, "Entries' connector")
            name = f"connector {resource!r}"
        else:
            _check_name(resource.connector, "Entries' connector")
            name = f"task {resource.connector!r} {resource.task}"
            _require(resource.task >= 0, f"entry for {name}: Task must be >= 0.")
            _require(
                e.state is not ReportedState.STOPPED,
                f"entry for {name}: STOPPED is a connector's state only.",
            )
        _require(e.token > 0, f"entry for {name}: FencingToken must be > 0.")
        _check_text(e.trace, f"entry for {name}: Trace", MAX_TRACE_CHARACTERS)
        _require(resource not in seen, f"Entries name {name} more than once.")
        seen.add(resource)


def validate_install(req: InstallRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.member_id, "MemberId")
    _require(req.member_epoch >= 0, "MemberEpoch must be >= 0.")
    _require(req.group_epoch >= 0, "GroupEpoch must be >= 0.")
    _require(req.scheduled_rebalance_delay_ms >= 0, "ScheduledRebalanceDelayMs must be >= 0.")
    _require(req.lost_work_delay_ms >= 0, "LostWorkDelayMs must be >= 0.")
    _require(req.next_wave_delay_ms >= 0, "NextWaveDelayMs must be >= 0.")
    reasons = [d for d in (req.lost_work_delay_ms, req.next_wave_delay_ms) if d > 0]
    _require(
        not reasons or req.scheduled_rebalance_delay_ms == min(reasons),
        "ScheduledRebalanceDelayMs must be the smaller of LostWorkDelayMs and NextWaveDelayMs "
        "(those > 0) when either is set.",
    )
    _require(-128 <= req.error <= 127, "Error must fit an int8.")
    _check_text(req.error_message, "ErrorMessage", MAX_ERROR_MESSAGE_LENGTH)
    seen: set[str] = set()
    for m in req.members:
        _require(m.member_id != "", "Members[].MemberId must be non-empty.")
        _check_text(m.member_id, "Members[].MemberId", MAX_NAME_LENGTH)
        _require(m.member_id not in seen, f"member {m.member_id} is listed twice in Members.")
        seen.add(m.member_id)
        _check_resources(m.resources, f"Members[{m.member_id}].ConnectorsAndTasks")


def validate_put_connector(req: PutConnectorRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.connector, "Connector")
    _require(
        0 <= req.task_count <= MAX_TASKS_PER_CONNECTOR,
        f"TaskCount must be between 0 and {MAX_TASKS_PER_CONNECTOR}.",
    )
    for key, value in req.config.items():
        _require(key != "", "Config keys must be non-empty.")
        _require("\x00" not in key, "Config keys must not contain the NUL character.")
        _require("\x00" not in value, f"Config[{key!r}] must not contain the NUL character.")


def validate_delete_connector(req: DeleteConnectorRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _check_name(req.connector, "Connector")


def validate_delete_group(req: DeleteGroupRequest) -> None:
    _check_name(req.group_id, "GroupId")


#: The longest RemoveMember reason kept (it goes into the MEMBER_REMOVED event).
MAX_REMOVAL_REASON_LENGTH = 256


def validate_remove_member(req: RemoveMemberRequest) -> None:
    _check_name(req.group_id, "GroupId")
    _require(
        (req.member_id == "") != (req.instance_id == ""),
        "name the member by exactly one of MemberId and InstanceId.",
    )
    if req.member_id:
        _check_name(req.member_id, "MemberId")
    else:
        _check_name(req.instance_id, "InstanceId")
    _check_text(req.reason, "Reason", MAX_REMOVAL_REASON_LENGTH)


def _check_config_keys(keys: Iterable[str]) -> None:
    for key in keys:
        _require(
            key in CONFIG_KEYS,
            f"unknown group configuration {key!r}; known: {', '.join(CONFIG_KEYS)}.",
        )


def validate_alter_configs(req: AlterConfigsRequest) -> None:
    """Each key known and each value within its row's bounds (`connect_protocol.configs`), and
    the rules between keys where the request sets all of theirs (the rules against the
    effective configuration are checked by the handler, which knows the group's)."""
    _check_name(req.group_id, "GroupId")
    _require(
        len(req.unset) <= len(CONFIG_KEYS) and len(set(req.unset)) == len(req.unset),
        f"unset names each group configuration at most once ({len(CONFIG_KEYS)} exist).",
    )
    _check_config_keys(req.set.keys())
    _check_config_keys(req.unset)
    _require(not set(req.set) & set(req.unset), "a configuration cannot be both set and unset.")
    for key, raw in req.set.items():
        _check_problem(BY_NAME[key].problem(raw))
    problem = cross_key_problem(req.set)
    _check_problem(None if problem is None else f"{problem}.")


def _check_problem(problem: str | None) -> None:
    if problem is not None:
        raise InvalidRequest(problem)


Request = (
    HeartbeatRequest
    | PrepareRequest
    | InstallRequest
    | PutConnectorRequest
    | DeleteConnectorRequest
    | AlterConfigsRequest
    | ConfigsRequest
    | ReportStatusRequest
    | TargetStateRequest
    | RestartRequest
    | DeleteGroupRequest
    | RemoveMemberRequest
)


def validate_request(req: Request) -> None:
    """Raise InvalidRequest if `req` breaks a rule of its API: the one check of every request,
    which the gRPC layer runs before it takes the group (so bad input touches nothing) and
    tells the handler it ran (`validated=True`); a handler called directly runs it itself."""
    match req:
        case HeartbeatRequest():
            validate_heartbeat(req)
        case PrepareRequest():
            validate_prepare(req)
        case InstallRequest():
            validate_install(req)
        case PutConnectorRequest():
            validate_put_connector(req)
        case DeleteConnectorRequest():
            validate_delete_connector(req)
        case AlterConfigsRequest():
            validate_alter_configs(req)
        case ConfigsRequest():
            validate_configs_request(req)
        case ReportStatusRequest():
            validate_report_status(req)
        case TargetStateRequest():
            validate_target_state(req)
        case RestartRequest():
            validate_restart(req)
        case DeleteGroupRequest():
            validate_delete_group(req)
        case RemoveMemberRequest():
            validate_remove_member(req)


def validate_lengths(req: Request, max_id_length: int, max_url_length: int) -> None:
    """The server's own, possibly lower, limits on the lengths of ids and names
    (--max-id-length: group, member, instance and connector ids) and urls (--max-url-length),
    over the fixed maxima `validate_request` holds every request to (the database's columns).
    O(1): only top-level fields; names inside resource lists must name catalogue entries,
    which were held to it when put."""
    _require(
        len(req.group_id) <= max_id_length,
        f"GroupId must be at most {max_id_length} characters (--max-id-length).",
    )
    member_id = getattr(req, "member_id", None)
    if member_id is not None:
        _require(
            len(member_id) <= max_id_length,
            f"MemberId must be at most {max_id_length} characters (--max-id-length).",
        )
    connector = getattr(req, "connector", None)
    if connector is not None:
        _require(
            len(connector) <= max_id_length,
            f"Connector must be at most {max_id_length} characters (--max-id-length).",
        )
    if isinstance(req, RemoveMemberRequest):
        _require(
            len(req.instance_id) <= max_id_length,
            f"InstanceId must be at most {max_id_length} characters (--max-id-length).",
        )
    if isinstance(req, HeartbeatRequest):
        if req.instance_id is not None:
            _require(
                len(req.instance_id) <= max_id_length,
                f"InstanceId must be at most {max_id_length} characters (--max-id-length).",
            )
        if req.url is not None:
            _require(
                len(req.url) <= max_url_length,
                f"Url must be at most {max_url_length} characters (--max-url-length).",
            )
