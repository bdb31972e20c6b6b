"""The classic group protocol's requests and responses as plain values (DESIGN 3.19): Kafka's
JoinGroup v9, SyncGroup v5, Heartbeat v4 and LeaveGroup v5 carrying Connect's embedded protocol,
typed. No wire types (`classic_wire` converts); shared by the coordinator and the agent's classic
mode.

Field names follow Kafka's and Connect's (`ConnectProtocol`, `IncrementalCooperativeConnectProtocol`
in apache/kafka's connect/runtime, read for the names and versions only). `None` on an optional
field means "absent on the wire", as in `messages`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from .errors import ErrorCode
from .messages import ConnectorInfo
from .resources import EMPTY, ResourceSet
from .tokens import NO_TOKENS, FencingTokens

#: The only protocol type a classic group takes (Connect's WorkerCoordinator.protocolType()).
PROTOCOL_TYPE = "connect"
#: Connect's protocol names and the embedded protocol's version of each (Connect's
#: ConnectProtocolCompatibility): "sessioned" behaves as "compatible" here (no request signing).
PROTOCOL_VERSIONS: Mapping[str, int] = MappingProxyType(
    {"default": 0, "compatible": 1, "sessioned": 2}
)
#: The embedded protocol version from which a worker reports its allocation and an assignment
#: carries `revoked` and `delay` (incremental cooperative rebalancing, KIP-415).
COOPERATIVE_VERSION = 1
#: What JoinGroup and SyncGroup answers give as `throttle_time_ms` (the coordinator throttles by
#: THROTTLING_QUOTA_EXCEEDED instead).
NO_THROTTLE = 0


def protocol_version(name: str) -> int | None:
    """The embedded protocol version of protocol `name`, or None for a name Connect does not
    have."""
    return PROTOCOL_VERSIONS.get(name)


@dataclass(frozen=True, slots=True)
class ConnectWorkerMetadata:
    """A worker's metadata for one protocol (Connect's WorkerState plus, from version 1, its
    allocation).

    Attributes:
        version: the embedded protocol's version (that of the protocol it is listed under).
        url: the worker's REST URL.
        config_offset: Connect's config topic offset; carries no meaning here (sent as 0).
        allocation: what the worker runs now (versions 1 and 2); None: absent (version 0, or a
            cooperative worker's first join).
    """

    version: int
    url: str = ""
    config_offset: int = 0
    allocation: ResourceSet | None = None


@dataclass(frozen=True, slots=True)
class ConnectWorkerAssignment:
    """One member's assignment for one generation (Connect's Assignment, plus fencing tokens).

    Attributes:
        version: the embedded protocol's version.
        error: Connect's assignment error; always 0 here.
        leader, leader_url: the generation's leader and its REST URL.
        config_offset: always 0 here.
        assignment: version 0: the whole set to run; versions 1-2: what is newly given.
        revoked: versions 1-2: what to stop; None: absent (version 0).
        delay: versions 1-2: the leader's scheduled rebalance delay in ms (0: none).
        tokens: the fencing token of every resource the member holds after it (DESIGN 3.18).
    """

    version: int
    error: int = 0
    leader: str = ""
    leader_url: str = ""
    config_offset: int = 0
    assignment: ResourceSet = EMPTY
    revoked: ResourceSet | None = None
    delay: int = 0
    tokens: FencingTokens = NO_TOKENS


@dataclass(frozen=True, slots=True)
class ClassicProtocol:
    """One protocol a joining member supports, with its metadata for it."""

    name: str
    metadata: ConnectWorkerMetadata


@dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str = ""
    #: Always refused when present (no static classic members).
    group_instance_id: str | None = None
    protocol_type: str = PROTOCOL_TYPE
    #: Most preferred first.
    protocols: tuple[ClassicProtocol, ...] = ()
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class JoinGroupMember:
    """One member of the generation as the leader is shown it."""

    member_id: str
    metadata: ConnectWorkerMetadata
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class JoinGroupResponse:
    """A JoinGroup answer. `members`, `catalogue`, `withheld`, `group_configs` and
    `coordinator_time_ms` are set for the leader only (the catalogue without configs)."""

    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    generation_id: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    member_id: str = ""
    members: tuple[JoinGroupMember, ...] = ()
    catalogue: tuple[ConnectorInfo, ...] = ()
    withheld: ResourceSet = EMPTY
    group_configs: Mapping[str, str] = field(default_factory=dict)
    coordinator_time_ms: int = 0
    skip_assignment: bool = False
    throttle_time_ms: int = NO_THROTTLE

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.member_id == self.leader


@dataclass(frozen=True, slots=True)
class SyncGroupAssignment:
    """One member's assignment in the leader's SyncGroup."""

    member_id: str
    assignment: ConnectWorkerAssignment


@dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    #: The leader's assignments; empty from followers.
    assignments: tuple[SyncGroupAssignment, ...] = ()


@dataclass(frozen=True, slots=True)
class SyncGroupResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    protocol_type: str = ""
    protocol_name: str = ""
    #: None: absent (an error answer).
    assignment: ConnectWorkerAssignment | None = None
    lifecycle_revision: int = 0
    throttle_time_ms: int = NO_THROTTLE


@dataclass(frozen=True, slots=True)
class ClassicHeartbeatRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClassicHeartbeatResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    lifecycle_revision: int = 0
    throttle_time_ms: int = NO_THROTTLE


@dataclass(frozen=True, slots=True)
class LeavingMember:
    """One member named by a LeaveGroup (Kafka's MemberIdentity)."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupRequest:
    group_id: str
    members: tuple[LeavingMember, ...] = ()


@dataclass(frozen=True, slots=True)
class LeftMember:
    """The outcome of a LeaveGroup for one member."""

    member_id: str
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    group_instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class LeaveGroupResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    members: tuple[LeftMember, ...] = ()
    throttle_time_ms: int = NO_THROTTLE
