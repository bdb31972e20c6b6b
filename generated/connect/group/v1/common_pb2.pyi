from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NONE: _ClassVar[ErrorCode]
    UNKNOWN_SERVER_ERROR: _ClassVar[ErrorCode]
    COORDINATOR_LOAD_IN_PROGRESS: _ClassVar[ErrorCode]
    COORDINATOR_NOT_AVAILABLE: _ClassVar[ErrorCode]
    NOT_COORDINATOR: _ClassVar[ErrorCode]
    ILLEGAL_GENERATION: _ClassVar[ErrorCode]
    INCONSISTENT_GROUP_PROTOCOL: _ClassVar[ErrorCode]
    INVALID_GROUP_ID: _ClassVar[ErrorCode]
    UNKNOWN_MEMBER_ID: _ClassVar[ErrorCode]
    INVALID_SESSION_TIMEOUT: _ClassVar[ErrorCode]
    REBALANCE_IN_PROGRESS: _ClassVar[ErrorCode]
    UNSUPPORTED_VERSION: _ClassVar[ErrorCode]
    GROUP_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    CLUSTER_AUTHORIZATION_FAILED: _ClassVar[ErrorCode]
    INVALID_REQUEST: _ClassVar[ErrorCode]
    POLICY_VIOLATION: _ClassVar[ErrorCode]
    NON_EMPTY_GROUP: _ClassVar[ErrorCode]
    GROUP_ID_NOT_FOUND: _ClassVar[ErrorCode]
    MEMBER_ID_REQUIRED: _ClassVar[ErrorCode]
    GROUP_MAX_SIZE_REACHED: _ClassVar[ErrorCode]
    THROTTLING_QUOTA_EXCEEDED: _ClassVar[ErrorCode]
    INVALID_UPDATE_VERSION: _ClassVar[ErrorCode]
    FENCED_INSTANCE_ID: _ClassVar[ErrorCode]
    FENCED_MEMBER_EPOCH: _ClassVar[ErrorCode]
    UNRELEASED_INSTANCE_ID: _ClassVar[ErrorCode]
    UNSUPPORTED_ASSIGNOR: _ClassVar[ErrorCode]
    COMPUTE_ASSIGNMENT: _ClassVar[ErrorCode]
    INVALID_ASSIGNMENT: _ClassVar[ErrorCode]
    NOT_RESOURCE_OWNER: _ClassVar[ErrorCode]

class TargetState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TARGET_STARTED: _ClassVar[TargetState]
    TARGET_PAUSED: _ClassVar[TargetState]
    TARGET_STOPPED: _ClassVar[TargetState]

class ResourceState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UNASSIGNED: _ClassVar[ResourceState]
    RUNNING: _ClassVar[ResourceState]
    PAUSED: _ClassVar[ResourceState]
    FAILED: _ClassVar[ResourceState]
    STOPPED: _ClassVar[ResourceState]
    RESTARTING: _ClassVar[ResourceState]
NONE: ErrorCode
UNKNOWN_SERVER_ERROR: ErrorCode
COORDINATOR_LOAD_IN_PROGRESS: ErrorCode
COORDINATOR_NOT_AVAILABLE: ErrorCode
NOT_COORDINATOR: ErrorCode
ILLEGAL_GENERATION: ErrorCode
INCONSISTENT_GROUP_PROTOCOL: ErrorCode
INVALID_GROUP_ID: ErrorCode
UNKNOWN_MEMBER_ID: ErrorCode
INVALID_SESSION_TIMEOUT: ErrorCode
REBALANCE_IN_PROGRESS: ErrorCode
UNSUPPORTED_VERSION: ErrorCode
GROUP_AUTHORIZATION_FAILED: ErrorCode
CLUSTER_AUTHORIZATION_FAILED: ErrorCode
INVALID_REQUEST: ErrorCode
POLICY_VIOLATION: ErrorCode
NON_EMPTY_GROUP: ErrorCode
GROUP_ID_NOT_FOUND: ErrorCode
MEMBER_ID_REQUIRED: ErrorCode
GROUP_MAX_SIZE_REACHED: ErrorCode
THROTTLING_QUOTA_EXCEEDED: ErrorCode
INVALID_UPDATE_VERSION: ErrorCode
FENCED_INSTANCE_ID: ErrorCode
FENCED_MEMBER_EPOCH: ErrorCode
UNRELEASED_INSTANCE_ID: ErrorCode
UNSUPPORTED_ASSIGNOR: ErrorCode
COMPUTE_ASSIGNMENT: ErrorCode
INVALID_ASSIGNMENT: ErrorCode
NOT_RESOURCE_OWNER: ErrorCode
TARGET_STARTED: TargetState
TARGET_PAUSED: TargetState
TARGET_STOPPED: TargetState
UNASSIGNED: ResourceState
RUNNING: ResourceState
PAUSED: ResourceState
FAILED: ResourceState
STOPPED: ResourceState
RESTARTING: ResourceState

class ConnectorTaskId(_message.Message):
    __slots__ = ("connector", "task")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ...) -> None: ...

class FencingToken(_message.Message):
    __slots__ = ("connector", "task", "token")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    token: int
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., token: _Optional[int] = ...) -> None: ...

class ConnectorsAndTasks(_message.Message):
    __slots__ = ("connectors", "tasks")
    CONNECTORS_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    connectors: _containers.RepeatedScalarFieldContainer[str]
    tasks: _containers.RepeatedCompositeFieldContainer[ConnectorTaskId]
    def __init__(self, connectors: _Optional[_Iterable[str]] = ..., tasks: _Optional[_Iterable[_Union[ConnectorTaskId, _Mapping]]] = ...) -> None: ...

class Assignor(_message.Message):
    __slots__ = ("name", "minimum_version", "maximum_version", "reason", "version", "metadata")
    NAME_FIELD_NUMBER: _ClassVar[int]
    MINIMUM_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAXIMUM_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    minimum_version: int
    maximum_version: int
    reason: int
    version: int
    metadata: bytes
    def __init__(self, name: _Optional[str] = ..., minimum_version: _Optional[int] = ..., maximum_version: _Optional[int] = ..., reason: _Optional[int] = ..., version: _Optional[int] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class AssignorList(_message.Message):
    __slots__ = ("assignors",)
    ASSIGNORS_FIELD_NUMBER: _ClassVar[int]
    assignors: _containers.RepeatedCompositeFieldContainer[Assignor]
    def __init__(self, assignors: _Optional[_Iterable[_Union[Assignor, _Mapping]]] = ...) -> None: ...

class ConnectorSpec(_message.Message):
    __slots__ = ("name", "task_count", "config", "config_digest", "target_state")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CONFIG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    TARGET_STATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    task_count: int
    config: _containers.ScalarMap[str, str]
    config_digest: str
    target_state: TargetState
    def __init__(self, name: _Optional[str] = ..., task_count: _Optional[int] = ..., config: _Optional[_Mapping[str, str]] = ..., config_digest: _Optional[str] = ..., target_state: _Optional[_Union[TargetState, str]] = ...) -> None: ...

class MemberAssignment(_message.Message):
    __slots__ = ("member_id", "connectors_and_tasks", "version", "metadata")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_AND_TASKS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    connectors_and_tasks: ConnectorsAndTasks
    version: int
    metadata: bytes
    def __init__(self, member_id: _Optional[str] = ..., connectors_and_tasks: _Optional[_Union[ConnectorsAndTasks, _Mapping]] = ..., version: _Optional[int] = ..., metadata: _Optional[bytes] = ...) -> None: ...
