from connect.group.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectWorkerMetadata(_message.Message):
    __slots__ = ("version", "url", "config_offset", "allocation")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    version: int
    url: str
    config_offset: int
    allocation: _common_pb2.ConnectorsAndTasks
    def __init__(self, version: _Optional[int] = ..., url: _Optional[str] = ..., config_offset: _Optional[int] = ..., allocation: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ...) -> None: ...

class ConnectWorkerAssignment(_message.Message):
    __slots__ = ("version", "error", "leader", "leader_url", "config_offset", "assignment", "revoked", "delay", "fencing_tokens")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_URL_FIELD_NUMBER: _ClassVar[int]
    CONFIG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    DELAY_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    version: int
    error: int
    leader: str
    leader_url: str
    config_offset: int
    assignment: _common_pb2.ConnectorsAndTasks
    revoked: _common_pb2.ConnectorsAndTasks
    delay: int
    fencing_tokens: _containers.RepeatedCompositeFieldContainer[_common_pb2.FencingToken]
    def __init__(self, version: _Optional[int] = ..., error: _Optional[int] = ..., leader: _Optional[str] = ..., leader_url: _Optional[str] = ..., config_offset: _Optional[int] = ..., assignment: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., revoked: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., delay: _Optional[int] = ..., fencing_tokens: _Optional[_Iterable[_Union[_common_pb2.FencingToken, _Mapping]]] = ...) -> None: ...

class JoinGroupRequestProtocol(_message.Message):
    __slots__ = ("name", "metadata")
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    metadata: ConnectWorkerMetadata
    def __init__(self, name: _Optional[str] = ..., metadata: _Optional[_Union[ConnectWorkerMetadata, _Mapping]] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("group_id", "session_timeout_ms", "rebalance_timeout_ms", "member_id", "group_instance_id", "protocol_type", "protocols", "reason")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOLS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    group_instance_id: str
    protocol_type: str
    protocols: _containers.RepeatedCompositeFieldContainer[JoinGroupRequestProtocol]
    reason: str
    def __init__(self, group_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocols: _Optional[_Iterable[_Union[JoinGroupRequestProtocol, _Mapping]]] = ..., reason: _Optional[str] = ...) -> None: ...

class JoinGroupResponseMember(_message.Message):
    __slots__ = ("member_id", "group_instance_id", "metadata")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    group_instance_id: str
    metadata: ConnectWorkerMetadata
    def __init__(self, member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., metadata: _Optional[_Union[ConnectWorkerMetadata, _Mapping]] = ...) -> None: ...

class JoinGroupResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "generation_id", "protocol_type", "protocol_name", "leader", "skip_assignment", "member_id", "members", "catalogue", "withheld", "group_configs", "coordinator_time_ms")
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
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    SKIP_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    CATALOGUE_FIELD_NUMBER: _ClassVar[int]
    WITHHELD_FIELD_NUMBER: _ClassVar[int]
    GROUP_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    generation_id: int
    protocol_type: str
    protocol_name: str
    leader: str
    skip_assignment: bool
    member_id: str
    members: _containers.RepeatedCompositeFieldContainer[JoinGroupResponseMember]
    catalogue: _containers.RepeatedCompositeFieldContainer[_common_pb2.ConnectorSpec]
    withheld: _common_pb2.ConnectorsAndTasks
    group_configs: _containers.ScalarMap[str, str]
    coordinator_time_ms: int
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., generation_id: _Optional[int] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., leader: _Optional[str] = ..., skip_assignment: _Optional[bool] = ..., member_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[JoinGroupResponseMember, _Mapping]]] = ..., catalogue: _Optional[_Iterable[_Union[_common_pb2.ConnectorSpec, _Mapping]]] = ..., withheld: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., group_configs: _Optional[_Mapping[str, str]] = ..., coordinator_time_ms: _Optional[int] = ...) -> None: ...

class SyncGroupRequestAssignment(_message.Message):
    __slots__ = ("member_id", "assignment")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    assignment: ConnectWorkerAssignment
    def __init__(self, member_id: _Optional[str] = ..., assignment: _Optional[_Union[ConnectWorkerAssignment, _Mapping]] = ...) -> None: ...

class SyncGroupRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "group_instance_id", "protocol_type", "protocol_name", "assignments")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str
    protocol_type: str
    protocol_name: str
    assignments: _containers.RepeatedCompositeFieldContainer[SyncGroupRequestAssignment]
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., assignments: _Optional[_Iterable[_Union[SyncGroupRequestAssignment, _Mapping]]] = ...) -> None: ...

class SyncGroupResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "protocol_type", "protocol_name", "assignment", "lifecycle_revision")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    protocol_type: str
    protocol_name: str
    assignment: ConnectWorkerAssignment
    lifecycle_revision: int
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., assignment: _Optional[_Union[ConnectWorkerAssignment, _Mapping]] = ..., lifecycle_revision: _Optional[int] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "lifecycle_revision")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LIFECYCLE_REVISION_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    lifecycle_revision: int
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., lifecycle_revision: _Optional[int] = ...) -> None: ...

class MemberIdentity(_message.Message):
    __slots__ = ("member_id", "group_instance_id", "reason")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    group_instance_id: str
    reason: str
    def __init__(self, member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("group_id", "members")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    members: _containers.RepeatedCompositeFieldContainer[MemberIdentity]
    def __init__(self, group_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[MemberIdentity, _Mapping]]] = ...) -> None: ...

class LeaveGroupMemberResponse(_message.Message):
    __slots__ = ("member_id", "group_instance_id", "error_code", "error_message")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    group_instance_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ("throttle_time_ms", "error_code", "error_message", "members")
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    throttle_time_ms: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    members: _containers.RepeatedCompositeFieldContainer[LeaveGroupMemberResponse]
    def __init__(self, throttle_time_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., members: _Optional[_Iterable[_Union[LeaveGroupMemberResponse, _Mapping]]] = ...) -> None: ...
