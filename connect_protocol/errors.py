"""Protocol error codes and the typed errors that carry them (both sides use them).

Every error a handler can answer with is a `CoordinatorError` subclass; its `code` maps to the wire
in one place (the gRPC adapter). Messages tell the client what to do.
"""

from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    """Wire error codes: Kafka's numeric values where Kafka has the error (DESIGN 2.1)."""

    NONE = 0
    UNKNOWN_SERVER_ERROR = -1
    COORDINATOR_LOAD_IN_PROGRESS = 14
    COORDINATOR_NOT_AVAILABLE = 15
    NOT_COORDINATOR = 16
    ILLEGAL_GENERATION = 22  # classic groups (DESIGN 3.19)
    INCONSISTENT_GROUP_PROTOCOL = 23
    INVALID_GROUP_ID = 24  # a malformed group id only
    UNKNOWN_MEMBER_ID = 25
    INVALID_SESSION_TIMEOUT = 26  # classic groups
    REBALANCE_IN_PROGRESS = 27  # classic groups
    UNSUPPORTED_VERSION = 35  # group.version 0: no new connect-protocol member (DESIGN 3.19)
    GROUP_AUTHORIZATION_FAILED = 30
    CLUSTER_AUTHORIZATION_FAILED = 31
    INVALID_REQUEST = 42
    POLICY_VIOLATION = 44
    NON_EMPTY_GROUP = 68  # DeleteGroup of a group with members, holds or a classic state
    GROUP_ID_NOT_FOUND = 69
    MEMBER_ID_REQUIRED = 79  # classic groups: a signal carrying the member id to rejoin with
    GROUP_MAX_SIZE_REACHED = 81
    THROTTLING_QUOTA_EXCEEDED = 89
    INVALID_UPDATE_VERSION = 95  # UpdateFeatures: unknown feature or level (DESIGN 3.19)
    FENCED_INSTANCE_ID = 82
    FENCED_MEMBER_EPOCH = 110
    UNRELEASED_INSTANCE_ID = 111
    UNSUPPORTED_ASSIGNOR = 112
    COMPUTE_ASSIGNMENT = 10001
    INVALID_ASSIGNMENT = 10002
    NOT_RESOURCE_OWNER = 10003  # a status entry for a resource not held under that token


class CoordinatorError(Exception):
    """Base of every error a request can be answered with.

    Attributes:
        code: the wire error code.
        message: what went wrong and what the client should do.
    """

    code: ErrorCode = ErrorCode.UNKNOWN_SERVER_ERROR

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(CoordinatorError):
    code = ErrorCode.INVALID_REQUEST


class UnknownMemberId(CoordinatorError):
    code = ErrorCode.UNKNOWN_MEMBER_ID


class FencedMemberEpoch(CoordinatorError):
    code = ErrorCode.FENCED_MEMBER_EPOCH


class NonEmptyGroup(CoordinatorError):
    """DeleteGroup of a group that still has members, holds, a classic state other than EMPTY,
    or (without with_catalogue) connectors (DESIGN 3.20)."""

    code = ErrorCode.NON_EMPTY_GROUP


class GroupIdNotFound(CoordinatorError):
    code = ErrorCode.GROUP_ID_NOT_FOUND


class UnsupportedAssignor(CoordinatorError):
    code = ErrorCode.UNSUPPORTED_ASSIGNOR


class InvalidAssignment(CoordinatorError):
    code = ErrorCode.INVALID_ASSIGNMENT


class FencedInstanceId(CoordinatorError):
    code = ErrorCode.FENCED_INSTANCE_ID


class UnreleasedInstanceId(CoordinatorError):
    code = ErrorCode.UNRELEASED_INSTANCE_ID


class NotCoordinator(CoordinatorError):
    code = ErrorCode.NOT_COORDINATOR


class CoordinatorNotAvailable(CoordinatorError):
    code = ErrorCode.COORDINATOR_NOT_AVAILABLE


class CoordinatorLoadInProgress(CoordinatorError):
    code = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS


class GroupMaxSizeReached(CoordinatorError):
    code = ErrorCode.GROUP_MAX_SIZE_REACHED


class GroupAuthorizationFailed(CoordinatorError):
    code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailed(CoordinatorError):
    code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class PolicyViolation(CoordinatorError):
    code = ErrorCode.POLICY_VIOLATION


class ThrottlingQuotaExceeded(CoordinatorError):
    code = ErrorCode.THROTTLING_QUOTA_EXCEEDED

    def __init__(self, message: str, wait_ms: int = 0) -> None:
        super().__init__(message)
        #: How long the caller should wait before its next call (throttle_time_ms).
        self.wait_ms = wait_ms


# --- classic groups (DESIGN 3.19) ---------------------------------------------------------------


class IllegalGeneration(CoordinatorError):
    """A classic call's generation is not the group's current one: the member rejoins."""

    code = ErrorCode.ILLEGAL_GENERATION


class InconsistentGroupProtocol(CoordinatorError):
    """The call's protocol type, name or version does not fit the group (or the group is of
    the other type: the message names it and the fix)."""

    code = ErrorCode.INCONSISTENT_GROUP_PROTOCOL


class InvalidSessionTimeout(CoordinatorError):
    """A classic JoinGroup's session timeout is outside the coordinator's bounds."""

    code = ErrorCode.INVALID_SESSION_TIMEOUT


class RebalanceInProgress(CoordinatorError):
    """The classic group is rebalancing (or the leader's assignments were refused): rejoin."""

    code = ErrorCode.REBALANCE_IN_PROGRESS


class UnsupportedVersion(CoordinatorError):
    """The cluster's `group.version` feature level does not serve the call (level 0: no new
    connect-protocol member is admitted, DESIGN 3.19 "Feature flag"): a configuration error,
    which a worker does not retry; it joins with the classic protocol instead."""

    code = ErrorCode.UNSUPPORTED_VERSION


class InvalidUpdateVersion(CoordinatorError):
    """UpdateFeatures names a feature this release does not know, or a level outside the range
    it serves (DescribeFeatures shows both); nothing was changed."""

    code = ErrorCode.INVALID_UPDATE_VERSION


class MemberIdRequired(CoordinatorError):
    """A classic JoinGroup without a member id (KIP-394): `member_id` is the id the
    coordinator made for the caller, which it sends in its next JoinGroup.

    Attributes:
        member_id: the coordinator-made member id.
    """

    code = ErrorCode.MEMBER_ID_REQUIRED

    def __init__(self, message: str, member_id: str) -> None:
        super().__init__(message)
        self.member_id = member_id
