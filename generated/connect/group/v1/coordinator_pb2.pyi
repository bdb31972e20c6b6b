from connect.group.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectGroupHeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "instance_id", "rebalance_timeout_ms", "server_assignor", "client_assignors", "connectors_and_tasks", "url")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ASSIGNORS_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_AND_TASKS_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str
    rebalance_timeout_ms: int
    server_assignor: str
    client_assignors: _common_pb2.AssignorList
    connectors_and_tasks: _common_pb2.ConnectorsAndTasks
    url: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., instance_id: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ..., server_assignor: _Optional[str] = ..., client_assignors: _Optional[_Union[_common_pb2.AssignorList, _Mapping]] = ..., connectors_and_tasks: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., url: _Optional[str] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("error", "connectors_and_tasks", "version", "metadata", "fencing_tokens")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_AND_TASKS_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    error: int
    connectors_and_tasks: _common_pb2.ConnectorsAndTasks
    version: int
    metadata: bytes
    fencing_tokens: _containers.RepeatedCompositeFieldContainer[_common_pb2.FencingToken]
    def __init__(self, error: _Optional[int] = ..., connectors_and_tasks: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., version: _Optional[int] = ..., metadata: _Optional[bytes] = ..., fencing_tokens: _Optional[_Iterable[_Union[_common_pb2.FencingToken, _Mapping]]] = ...) -> None: ...

class ConnectGroupHeartbeatResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "member_epoch", "heartbeat_interval_ms", "assignment", "session_timeout_ms", "lifecycle_revision")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    member_epoch: int
    heartbeat_interval_ms: int
    assignment: Assignment
    session_timeout_ms: int
    lifecycle_revision: int
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., member_epoch: _Optional[int] = ..., heartbeat_interval_ms: _Optional[int] = ..., assignment: _Optional[_Union[Assignment, _Mapping]] = ..., session_timeout_ms: _Optional[int] = ..., lifecycle_revision: _Optional[int] = ...) -> None: ...

class ConnectGroupPrepareAssignmentRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ...) -> None: ...

class PreparedMember(_message.Message):
    __slots__ = ("member_id", "member_epoch", "instance_id", "url", "assignor", "connectors_and_tasks", "last_grant_at_ms")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_AND_TASKS_FIELD_NUMBER: _ClassVar[int]
    LAST_GRANT_AT_MS_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    member_epoch: int
    instance_id: str
    url: str
    assignor: _common_pb2.Assignor
    connectors_and_tasks: _common_pb2.ConnectorsAndTasks
    last_grant_at_ms: int
    def __init__(self, member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., instance_id: _Optional[str] = ..., url: _Optional[str] = ..., assignor: _Optional[_Union[_common_pb2.Assignor, _Mapping]] = ..., connectors_and_tasks: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., last_grant_at_ms: _Optional[int] = ...) -> None: ...

class ConnectGroupPrepareAssignmentResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "group_epoch", "assignor_name", "assignor_version", "members", "catalogue", "assignment_epoch", "target_assignment", "assignor_state", "group_configs", "coordinator_time_ms", "scheduled_rebalance_at_ms")
    class GroupConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    CATALOGUE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REBALANCE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    assignor_name: str
    assignor_version: int
    members: _containers.RepeatedCompositeFieldContainer[PreparedMember]
    catalogue: _containers.RepeatedCompositeFieldContainer[_common_pb2.ConnectorSpec]
    assignment_epoch: int
    target_assignment: _containers.RepeatedCompositeFieldContainer[_common_pb2.MemberAssignment]
    assignor_state: bytes
    group_configs: _containers.ScalarMap[str, str]
    coordinator_time_ms: int
    scheduled_rebalance_at_ms: int
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., assignor_name: _Optional[str] = ..., assignor_version: _Optional[int] = ..., members: _Optional[_Iterable[_Union[PreparedMember, _Mapping]]] = ..., catalogue: _Optional[_Iterable[_Union[_common_pb2.ConnectorSpec, _Mapping]]] = ..., assignment_epoch: _Optional[int] = ..., target_assignment: _Optional[_Iterable[_Union[_common_pb2.MemberAssignment, _Mapping]]] = ..., assignor_state: _Optional[bytes] = ..., group_configs: _Optional[_Mapping[str, str]] = ..., coordinator_time_ms: _Optional[int] = ..., scheduled_rebalance_at_ms: _Optional[int] = ...) -> None: ...

class ConnectGroupInstallAssignmentRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "group_epoch", "error", "error_message", "members", "assignor_state", "scheduled_rebalance_delay_ms", "lost_work_delay_ms", "next_wave_delay_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_STATE_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REBALANCE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LOST_WORK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_WAVE_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    group_epoch: int
    error: int
    error_message: str
    members: _containers.RepeatedCompositeFieldContainer[_common_pb2.MemberAssignment]
    assignor_state: bytes
    scheduled_rebalance_delay_ms: int
    lost_work_delay_ms: int
    next_wave_delay_ms: int
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., group_epoch: _Optional[int] = ..., error: _Optional[int] = ..., error_message: _Optional[str] = ..., members: _Optional[_Iterable[_Union[_common_pb2.MemberAssignment, _Mapping]]] = ..., assignor_state: _Optional[bytes] = ..., scheduled_rebalance_delay_ms: _Optional[int] = ..., lost_work_delay_ms: _Optional[int] = ..., next_wave_delay_ms: _Optional[int] = ...) -> None: ...

class ConnectGroupInstallAssignmentResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ConnectGroupConfigsRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "known_digests")
    class KnownDigestsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    KNOWN_DIGESTS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    known_digests: _containers.ScalarMap[str, str]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., known_digests: _Optional[_Mapping[str, str]] = ...) -> None: ...

class HeldConnector(_message.Message):
    __slots__ = ("connector", "config_digest", "config", "target_state")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    TARGET_STATE_FIELD_NUMBER: _ClassVar[int]
    connector: str
    config_digest: str
    config: ConfigValues
    target_state: _common_pb2.TargetState
    def __init__(self, connector: _Optional[str] = ..., config_digest: _Optional[str] = ..., config: _Optional[_Union[ConfigValues, _Mapping]] = ..., target_state: _Optional[_Union[_common_pb2.TargetState, str]] = ...) -> None: ...

class ConfigValues(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RestartCount(_message.Message):
    __slots__ = ("connector", "task", "restart_count")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    restart_count: int
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., restart_count: _Optional[int] = ...) -> None: ...

class ConnectGroupConfigsResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "lifecycle_revision", "connectors", "restart_counts")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNTS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    lifecycle_revision: int
    connectors: _containers.RepeatedCompositeFieldContainer[HeldConnector]
    restart_counts: _containers.RepeatedCompositeFieldContainer[RestartCount]
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., lifecycle_revision: _Optional[int] = ..., connectors: _Optional[_Iterable[_Union[HeldConnector, _Mapping]]] = ..., restart_counts: _Optional[_Iterable[_Union[RestartCount, _Mapping]]] = ...) -> None: ...

class StatusEntry(_message.Message):
    __slots__ = ("connector", "task", "fencing_token", "state", "trace")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    fencing_token: int
    state: _common_pb2.ResourceState
    trace: str
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., fencing_token: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ResourceState, str]] = ..., trace: _Optional[str] = ...) -> None: ...

class ConnectGroupReportStatusRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "member_epoch", "entries")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    member_epoch: int
    entries: _containers.RepeatedCompositeFieldContainer[StatusEntry]
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., member_epoch: _Optional[int] = ..., entries: _Optional[_Iterable[_Union[StatusEntry, _Mapping]]] = ...) -> None: ...

class StatusEntryResult(_message.Message):
    __slots__ = ("connector", "task", "error_code", "error_message")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class ConnectGroupReportStatusResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "lifecycle_revision", "results")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    lifecycle_revision: int
    results: _containers.RepeatedCompositeFieldContainer[StatusEntryResult]
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., lifecycle_revision: _Optional[int] = ..., results: _Optional[_Iterable[_Union[StatusEntryResult, _Mapping]]] = ...) -> None: ...
