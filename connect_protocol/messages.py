"""The protocol's requests and responses as plain values (no wire types: `wire` converts), shared
by the coordinator and the agent.

`None` on an optional field means "absent: unchanged since the last heartbeat", as on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import ErrorCode
from .resources import ResourceSet
from .tokens import NO_TOKENS, FencingTokens

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


@dataclass(frozen=True, slots=True)
class Assignor:
    """A client-side assignor a member supports, with its metadata."""

    name: str
    minimum_version: int
    maximum_version: int
    reason: int = 0
    version: int = 0
    metadata: bytes = b""

    def covers(self, other: Assignor) -> bool:
        return (
            self.minimum_version <= other.minimum_version
            and self.maximum_version >= other.maximum_version
        )


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rebalance_timeout_ms: int | None = None
    server_assignor: str | None = None
    client_assignors: tuple[Assignor, ...] | None = None
    owned: ResourceSet | None = None
    url: str | None = None


@dataclass(frozen=True, slots=True)
class AssignmentMessage:
    resources: ResourceSet
    version: int = 0
    metadata: bytes = b""
    error: int = 0
    #: The fencing token of each of `resources` (DESIGN 3.18).
    tokens: FencingTokens = NO_TOKENS


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    session_timeout_ms: int = 0
    assignment: AssignmentMessage | None = None
    #: The member's lifecycle revision (DESIGN 3.20): fetch configs when it moved.
    lifecycle_revision: int = 0


@dataclass(frozen=True, slots=True)
class PrepareRequest:
    group_id: str
    member_id: str
    member_epoch: int


@dataclass(frozen=True, slots=True)
class PreparedMemberInfo:
    member_id: str
    member_epoch: int
    instance_id: str | None
    url: str
    assignor: Assignor
    owned: ResourceSet
    last_grant_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class MemberTarget:
    member_id: str
    resources: ResourceSet
    version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class ConnectorInfo:
    name: str
    task_count: int
    config: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PrepareResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    group_epoch: int = 0
    assignor_name: str = ""
    assignor_version: int = 0
    members: tuple[PreparedMemberInfo, ...] = ()
    catalogue: tuple[ConnectorInfo, ...] = ()
    assignment_epoch: int = 0
    target: tuple[MemberTarget, ...] = ()
    assignor_state: bytes = b""
    group_configs: Mapping[str, str] = field(default_factory=dict)
    coordinator_time_ms: int = 0
    scheduled_rebalance_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class InstallRequest:
    group_id: str
    member_id: str
    member_epoch: int
    group_epoch: int
    error: int = 0
    error_message: str = ""
    members: tuple[MemberTarget, ...] = ()
    assignor_state: bytes = b""
    scheduled_rebalance_delay_ms: int = 0
    lost_work_delay_ms: int = 0
    next_wave_delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class InstallResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class PutConnectorRequest:
    group_id: str
    connector: str
    task_count: int
    config: Mapping[str, str] = field(default_factory=dict)
    caller: str = ""


@dataclass(frozen=True, slots=True)
class PutConnectorResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    group_epoch: int = 0
    created: bool = False
    rebalance_triggered: bool = False


@dataclass(frozen=True, slots=True)
class DeleteConnectorRequest:
    group_id: str
    connector: str
    caller: str = ""


@dataclass(frozen=True, slots=True)
class DeleteConnectorResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    group_epoch: int = 0


@dataclass(frozen=True, slots=True)
class AlterConfigsRequest:
    group_id: str
    set: Mapping[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()
    caller: str = ""


@dataclass(frozen=True, slots=True)
class AlterConfigsResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    effective_configs: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteGroupRequest:
    """DeleteGroup (DESIGN 3.20): `with_catalogue` lets a group with connectors go too."""

    group_id: str
    with_catalogue: bool = False
    caller: str = ""


@dataclass(frozen=True, slots=True)
class DeleteGroupResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    #: The counters the tombstone keeps: a re-created group continues above them.
    group_epoch: int = 0
    last_fencing_token: int = 0
    connectors_deleted: int = 0
    tasks_deleted: int = 0
    configs_deleted: int = 0


@dataclass(frozen=True, slots=True)
class RemoveMemberRequest:
    """RemoveMember (DESIGN 3.20): the member named by `member_id` or by `instance_id`."""

    group_id: str
    member_id: str = ""
    instance_id: str = ""
    reason: str = ""
    caller: str = ""


@dataclass(frozen=True, slots=True)
class RemoveMemberResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    member_id: str = ""
    group_epoch: int = 0
    resources_held: int = 0
    held_until_ms: int = 0
