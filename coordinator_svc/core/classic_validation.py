"""Validation of the four classic calls (DESIGN 3.19) before they reach a group: ids, the refused
static membership, the protocol type and names, the embedded protocol's versions, the session and
rebalance timeouts, and the resource sets a leader sends. Each check raises the error the call is
answered with (Kafka's GroupCoordinatorService `joinGroup` checks the group id and the session
timeout bounds before the group; the rest are this coordinator's, as `validation` is for the
connect calls)."""

from __future__ import annotations

from connect_protocol.classic_messages import (
    COOPERATIVE_VERSION,
    PROTOCOL_TYPE,
    ClassicHeartbeatRequest,
    ClassicProtocol,
    JoinGroupRequest,
    LeaveGroupRequest,
    SyncGroupRequest,
    protocol_version,
)
from connect_protocol.errors import (
    InconsistentGroupProtocol,
    InvalidRequest,
    InvalidSessionTimeout,
    PolicyViolation,
)

from .model import GroupConfigDefaults
from .validation import MAX_NAME_LENGTH, MAX_URL_LENGTH, validate_group_id, validate_text
from .validation import _check_resources as check_resources

#: Connect's protocol names: a worker lists at most these three.
MAX_PROTOCOLS = 3
#: A JoinGroup's or a leaving member's `reason` (Kafka's KIP-800 field), at most.
MAX_REASON_LENGTH = 1_024
#: Members one LeaveGroup may name (a worker names itself; the batch form is Kafka's).
MAX_LEAVING_MEMBERS = 64


def _require(condition: bool, rule: str) -> None:
    if not condition:
        raise InvalidRequest(rule)


def _refuse_instance_id(instance_id: str | None) -> None:
    """No static classic members (DESIGN 3.19 Departure): Connect has none, and its
    WorkerCoordinator refuses `skip_assignment`; static members are the connect protocol's."""
    _require(
        instance_id is None,
        "GroupInstanceId is not accepted by classic groups (no static classic members): "
        "leave it unset, or use the connect protocol for static membership.",
    )


def _check_member_id(member_id: str, what: str = "MemberId") -> None:
    _require(member_id != "", f"{what} must be non-empty.")
    validate_text(member_id, what, MAX_NAME_LENGTH)


def validate_join(req: JoinGroupRequest, defaults: GroupConfigDefaults) -> None:
    """A JoinGroup: the group id, the (possibly empty) member id, no instance id, protocol type
    `connect`, one to three known and distinct protocol names whose metadata has the name's
    version, the session timeout within the coordinator's bounds, a positive rebalance
    timeout, urls and reason within their limits."""
    validate_group_id(req.group_id)
    validate_text(req.member_id, "MemberId", MAX_NAME_LENGTH)
    _refuse_instance_id(req.group_instance_id)
    if req.protocol_type != PROTOCOL_TYPE:
        raise InconsistentGroupProtocol(
            f"protocol type {req.protocol_type!r} is not served: classic groups take "
            f"{PROTOCOL_TYPE!r} only."
        )
    _require(len(req.protocols) > 0, "Protocols must list at least one protocol.")
    _require(len(req.protocols) <= MAX_PROTOCOLS, f"Protocols may list at most {MAX_PROTOCOLS}.")
    names = [p.name for p in req.protocols]
    _require(len(set(names)) == len(names), "Protocol names must be unique in Protocols.")
    for protocol in req.protocols:
        _check_protocol(protocol, defaults)
    low, high = defaults.classic_min_session_timeout_ms, defaults.classic_max_session_timeout_ms
    if not low <= req.session_timeout_ms <= high:
        raise InvalidSessionTimeout(
            f"session timeout {req.session_timeout_ms} ms is outside this coordinator's bounds "
            f"[{low}, {high}] (--classic-min/max-session-timeout-ms)."
        )
    _require(req.rebalance_timeout_ms > 0, "RebalanceTimeoutMs must be larger than zero.")
    if req.reason is not None:
        validate_text(req.reason, "Reason", MAX_REASON_LENGTH)


def _check_protocol(protocol: ClassicProtocol, defaults: GroupConfigDefaults) -> None:
    version = protocol_version(protocol.name)
    if version is None:
        raise InconsistentGroupProtocol(
            f"protocol {protocol.name!r} is not one of Connect's: default, compatible, sessioned."
        )
    metadata = protocol.metadata
    if metadata.version != version:
        raise InconsistentGroupProtocol(
            f"protocol {protocol.name!r} carries metadata version {metadata.version}; it must "
            f"be {version}."
        )
    validate_text(metadata.url, "Metadata.Url", MAX_URL_LENGTH)
    if len(metadata.url) > defaults.max_url_length:
        raise PolicyViolation(
            f"the url is {len(metadata.url)} characters, over the limit of "
            f"{defaults.max_url_length} (--max-url-length)."
        )
    if metadata.allocation is not None:
        _require(
            version >= COOPERATIVE_VERSION,
            f"protocol {protocol.name!r} (version {version}) carries no allocation.",
        )
        check_resources(metadata.allocation, "Metadata.Allocation")


def validate_sync(req: SyncGroupRequest) -> None:
    """A SyncGroup: ids, no instance id, and well-formed assignments (each member once)."""
    validate_group_id(req.group_id)
    _check_member_id(req.member_id)
    _refuse_instance_id(req.group_instance_id)
    if req.protocol_type is not None:
        validate_text(req.protocol_type, "ProtocolType", MAX_NAME_LENGTH)
    if req.protocol_name is not None:
        validate_text(req.protocol_name, "ProtocolName", MAX_NAME_LENGTH)
    seen: set[str] = set()
    for entry in req.assignments:
        _check_member_id(entry.member_id, "Assignments.MemberId")
        _require(entry.member_id not in seen, "Assignments must name each member once.")
        seen.add(entry.member_id)
        check_resources(entry.assignment.assignment, "Assignment.Assignment")
        if entry.assignment.revoked is not None:
            check_resources(entry.assignment.revoked, "Assignment.Revoked")
        _require(entry.assignment.delay >= 0, "Assignment.Delay must be >= 0.")


def validate_classic_heartbeat(req: ClassicHeartbeatRequest) -> None:
    """A classic Heartbeat: ids and no instance id."""
    validate_group_id(req.group_id)
    _check_member_id(req.member_id)
    _refuse_instance_id(req.group_instance_id)


def validate_leave(req: LeaveGroupRequest) -> None:
    """A LeaveGroup: one to 64 members, each by a non-empty member id, no instance ids."""
    validate_group_id(req.group_id)
    _require(len(req.members) > 0, "Members must name at least one member.")
    _require(
        len(req.members) <= MAX_LEAVING_MEMBERS,
        f"Members may name at most {MAX_LEAVING_MEMBERS} members.",
    )
    for member in req.members:
        _check_member_id(member.member_id, "Members.MemberId")
        _refuse_instance_id(member.group_instance_id)
        if member.reason is not None:
            validate_text(member.reason, "Members.Reason", MAX_REASON_LENGTH)
