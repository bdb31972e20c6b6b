from connect.group.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeleteGroupRequest(_message.Message):
    __slots__ = ("group_id", "with_catalogue")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    WITH_CATALOGUE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    with_catalogue: bool
    def __init__(self, group_id: _Optional[str] = ..., with_catalogue: _Optional[bool] = ...) -> None: ...

class DeleteGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch", "last_fencing_token", "connectors_deleted", "tasks_deleted", "configs_deleted")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    LAST_FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CONNECTORS_DELETED_FIELD_NUMBER: _ClassVar[int]
    TASKS_DELETED_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_DELETED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    last_fencing_token: int
    connectors_deleted: int
    tasks_deleted: int
    configs_deleted: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., last_fencing_token: _Optional[int] = ..., connectors_deleted: _Optional[int] = ..., tasks_deleted: _Optional[int] = ..., configs_deleted: _Optional[int] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("group_id", "member_id", "instance_id", "reason")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_id: str
    instance_id: str
    reason: str
    def __init__(self, group_id: _Optional[str] = ..., member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RemoveMemberResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "member_id", "group_epoch", "resources_held", "held_until_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_HELD_FIELD_NUMBER: _ClassVar[int]
    HELD_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    member_id: str
    group_epoch: int
    resources_held: int
    held_until_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., member_id: _Optional[str] = ..., group_epoch: _Optional[int] = ..., resources_held: _Optional[int] = ..., held_until_ms: _Optional[int] = ...) -> None: ...

class PauseConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ...) -> None: ...

class PauseConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch", "previous_target_state", "changed", "rebalance_triggered", "holders_told")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TARGET_STATE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_TOLD_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    previous_target_state: _common_pb2.TargetState
    changed: bool
    rebalance_triggered: bool
    holders_told: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., previous_target_state: _Optional[_Union[_common_pb2.TargetState, str]] = ..., changed: _Optional[bool] = ..., rebalance_triggered: _Optional[bool] = ..., holders_told: _Optional[int] = ...) -> None: ...

class ResumeConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ...) -> None: ...

class ResumeConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch", "previous_target_state", "changed", "rebalance_triggered", "holders_told")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TARGET_STATE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_TOLD_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    previous_target_state: _common_pb2.TargetState
    changed: bool
    rebalance_triggered: bool
    holders_told: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., previous_target_state: _Optional[_Union[_common_pb2.TargetState, str]] = ..., changed: _Optional[bool] = ..., rebalance_triggered: _Optional[bool] = ..., holders_told: _Optional[int] = ...) -> None: ...

class StopConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ...) -> None: ...

class StopConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch", "previous_target_state", "changed", "rebalance_triggered", "holders_told")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_TARGET_STATE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_TOLD_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    previous_target_state: _common_pb2.TargetState
    changed: bool
    rebalance_triggered: bool
    holders_told: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., previous_target_state: _Optional[_Union[_common_pb2.TargetState, str]] = ..., changed: _Optional[bool] = ..., rebalance_triggered: _Optional[bool] = ..., holders_told: _Optional[int] = ...) -> None: ...

class RestartConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector", "task", "include_tasks", "only_failed")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_TASKS_FIELD_NUMBER: _ClassVar[int]
    ONLY_FAILED_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    task: int
    include_tasks: bool
    only_failed: bool
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ..., task: _Optional[int] = ..., include_tasks: _Optional[bool] = ..., only_failed: _Optional[bool] = ...) -> None: ...

class PlannedRestart(_message.Message):
    __slots__ = ("connector", "task", "restart_count", "worker_id")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    restart_count: int
    worker_id: str
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., restart_count: _Optional[int] = ..., worker_id: _Optional[str] = ...) -> None: ...

class RestartConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "restarts", "group_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    restarts: _containers.RepeatedCompositeFieldContainer[PlannedRestart]
    group_epoch: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., restarts: _Optional[_Iterable[_Union[PlannedRestart, _Mapping]]] = ..., group_epoch: _Optional[int] = ...) -> None: ...

class DescribeFeaturesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeFeaturesResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "features")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    features: _containers.RepeatedCompositeFieldContainer[DescribedFeature]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., features: _Optional[_Iterable[_Union[DescribedFeature, _Mapping]]] = ...) -> None: ...

class DescribedFeature(_message.Message):
    __slots__ = ("name", "finalized_level", "min_supported_level", "max_supported_level")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MIN_SUPPORTED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    MAX_SUPPORTED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    name: str
    finalized_level: int
    min_supported_level: int
    max_supported_level: int
    def __init__(self, name: _Optional[str] = ..., finalized_level: _Optional[int] = ..., min_supported_level: _Optional[int] = ..., max_supported_level: _Optional[int] = ...) -> None: ...

class UpdateFeaturesRequest(_message.Message):
    __slots__ = ("feature", "level", "validate_only")
    FEATURE_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    feature: str
    level: int
    validate_only: bool
    def __init__(self, feature: _Optional[str] = ..., level: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class UpdateFeaturesResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "previous_level", "finalized_level", "changed")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_LEVEL_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    previous_level: int
    finalized_level: int
    changed: bool
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., previous_level: _Optional[int] = ..., finalized_level: _Optional[int] = ..., changed: _Optional[bool] = ...) -> None: ...

class AclEntry(_message.Message):
    __slots__ = ("principal", "operation", "resource_type", "pattern_type", "pattern", "permission")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    operation: str
    resource_type: str
    pattern_type: str
    pattern: str
    permission: str
    def __init__(self, principal: _Optional[str] = ..., operation: _Optional[str] = ..., resource_type: _Optional[str] = ..., pattern_type: _Optional[str] = ..., pattern: _Optional[str] = ..., permission: _Optional[str] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("principal", "page_size", "page_token")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    principal: str
    page_size: int
    page_token: str
    def __init__(self, principal: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "entries", "next_page_token")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    entries: _containers.RepeatedCompositeFieldContainer[AclEntry]
    next_page_token: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class AddAclRequest(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: AclEntry
    def __init__(self, entry: _Optional[_Union[AclEntry, _Mapping]] = ...) -> None: ...

class AddAclResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "changed")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    changed: bool
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., changed: _Optional[bool] = ...) -> None: ...

class RemoveAclRequest(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: AclEntry
    def __init__(self, entry: _Optional[_Union[AclEntry, _Mapping]] = ...) -> None: ...

class RemoveAclResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "changed")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    changed: bool
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., changed: _Optional[bool] = ...) -> None: ...

class PutConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector", "task_count", "config")
    class ConfigEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_COUNT_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    task_count: int
    config: _containers.ScalarMap[str, str]
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ..., task_count: _Optional[int] = ..., config: _Optional[_Mapping[str, str]] = ...) -> None: ...

class PutConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch", "created", "rebalance_triggered")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TRIGGERED_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    created: bool
    rebalance_triggered: bool
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ..., created: _Optional[bool] = ..., rebalance_triggered: _Optional[bool] = ...) -> None: ...

class DeleteConnectorRequest(_message.Message):
    __slots__ = ("group_id", "connector")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    connector: str
    def __init__(self, group_id: _Optional[str] = ..., connector: _Optional[str] = ...) -> None: ...

class DeleteConnectorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "group_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_epoch: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_epoch: _Optional[int] = ...) -> None: ...

class AlterGroupConfigsRequest(_message.Message):
    __slots__ = ("group_id", "set", "unset")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    UNSET_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    set: _containers.ScalarMap[str, str]
    unset: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., unset: _Optional[_Iterable[str]] = ...) -> None: ...

class AlterGroupConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "effective_configs")
    class EffectiveConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    effective_configs: _containers.ScalarMap[str, str]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., effective_configs: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "groups", "next_page_token")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    groups: _containers.RepeatedCompositeFieldContainer[ListedGroup]
    next_page_token: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ListedGroup, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListedGroup(_message.Message):
    __slots__ = ("group_id", "group_type", "state", "group_epoch", "member_count", "protocol_name")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    MEMBER_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    group_type: str
    state: str
    group_epoch: int
    member_count: int
    protocol_name: str
    def __init__(self, group_id: _Optional[str] = ..., group_type: _Optional[str] = ..., state: _Optional[str] = ..., group_epoch: _Optional[int] = ..., member_count: _Optional[int] = ..., protocol_name: _Optional[str] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids", "include_config_values", "include_status")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_CONFIG_VALUES_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STATUS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    include_config_values: bool
    include_status: bool
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., include_config_values: _Optional[bool] = ..., include_status: _Optional[bool] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DescribedGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[DescribedGroup, _Mapping]]] = ...) -> None: ...

class DescribedGroup(_message.Message):
    __slots__ = ("error_code", "error_message", "group_id", "group_type", "state", "group_epoch", "assignment_epoch", "assignor_name", "assignor_member_id", "assignor_unavailable_reason", "scheduled_rebalance_at_ms", "catalogue", "group_configs", "members", "last_assignment_error", "last_assignment_error_message", "coordinator_time_ms", "assignor_state", "lost_work_rebalance_at_ms", "next_wave_at_ms", "next_assignment_request_at_ms", "assignment_requested_epoch", "classic", "statuses")
    class GroupConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    SCHEDULED_REBALANCE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    CATALOGUE_FIELD_NUMBER: _ClassVar[int]
    GROUP_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_ASSIGNMENT_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_ASSIGNMENT_ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_STATE_FIELD_NUMBER: _ClassVar[int]
    LOST_WORK_REBALANCE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_WAVE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_ASSIGNMENT_REQUEST_AT_MS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_REQUESTED_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CLASSIC_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_id: str
    group_type: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor_name: str
    assignor_member_id: str
    assignor_unavailable_reason: str
    scheduled_rebalance_at_ms: int
    catalogue: _containers.RepeatedCompositeFieldContainer[_common_pb2.ConnectorSpec]
    group_configs: _containers.ScalarMap[str, str]
    members: _containers.RepeatedCompositeFieldContainer[DescribedMember]
    last_assignment_error: int
    last_assignment_error_message: str
    coordinator_time_ms: int
    assignor_state: bytes
    lost_work_rebalance_at_ms: int
    next_wave_at_ms: int
    next_assignment_request_at_ms: int
    assignment_requested_epoch: int
    classic: ClassicGroupDescription
    statuses: _containers.RepeatedCompositeFieldContainer[ResourceStatus]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_id: _Optional[str] = ..., group_type: _Optional[str] = ..., state: _Optional[str] = ..., group_epoch: _Optional[int] = ..., assignment_epoch: _Optional[int] = ..., assignor_name: _Optional[str] = ..., assignor_member_id: _Optional[str] = ..., assignor_unavailable_reason: _Optional[str] = ..., scheduled_rebalance_at_ms: _Optional[int] = ..., catalogue: _Optional[_Iterable[_Union[_common_pb2.ConnectorSpec, _Mapping]]] = ..., group_configs: _Optional[_Mapping[str, str]] = ..., members: _Optional[_Iterable[_Union[DescribedMember, _Mapping]]] = ..., last_assignment_error: _Optional[int] = ..., last_assignment_error_message: _Optional[str] = ..., coordinator_time_ms: _Optional[int] = ..., assignor_state: _Optional[bytes] = ..., lost_work_rebalance_at_ms: _Optional[int] = ..., next_wave_at_ms: _Optional[int] = ..., next_assignment_request_at_ms: _Optional[int] = ..., assignment_requested_epoch: _Optional[int] = ..., classic: _Optional[_Union[ClassicGroupDescription, _Mapping]] = ..., statuses: _Optional[_Iterable[_Union[ResourceStatus, _Mapping]]] = ...) -> None: ...

class ResourceStatus(_message.Message):
    __slots__ = ("connector", "task", "state", "worker_id", "worker_url", "trace", "restart_count", "fencing_token", "reported_at_ms", "auto_restart_attempts", "next_restart_at_ms", "auto_restarts_exhausted")
    CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_URL_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    RESTART_COUNT_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKEN_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESTART_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_RESTART_AT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTO_RESTARTS_EXHAUSTED_FIELD_NUMBER: _ClassVar[int]
    connector: str
    task: int
    state: _common_pb2.ResourceState
    worker_id: str
    worker_url: str
    trace: str
    restart_count: int
    fencing_token: int
    reported_at_ms: int
    auto_restart_attempts: int
    next_restart_at_ms: int
    auto_restarts_exhausted: bool
    def __init__(self, connector: _Optional[str] = ..., task: _Optional[int] = ..., state: _Optional[_Union[_common_pb2.ResourceState, str]] = ..., worker_id: _Optional[str] = ..., worker_url: _Optional[str] = ..., trace: _Optional[str] = ..., restart_count: _Optional[int] = ..., fencing_token: _Optional[int] = ..., reported_at_ms: _Optional[int] = ..., auto_restart_attempts: _Optional[int] = ..., next_restart_at_ms: _Optional[int] = ..., auto_restarts_exhausted: _Optional[bool] = ...) -> None: ...

class ClassicGroupDescription(_message.Message):
    __slots__ = ("state", "generation_id", "protocol_type", "protocol_name", "leader_id", "leader_unavailable_reason", "pending_member_ids", "members_joined", "members_awaiting_sync", "rebalance_reason")
    STATE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    PENDING_MEMBER_IDS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_JOINED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_AWAITING_SYNC_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_REASON_FIELD_NUMBER: _ClassVar[int]
    state: str
    generation_id: int
    protocol_type: str
    protocol_name: str
    leader_id: str
    leader_unavailable_reason: str
    pending_member_ids: _containers.RepeatedScalarFieldContainer[str]
    members_joined: _containers.RepeatedScalarFieldContainer[str]
    members_awaiting_sync: _containers.RepeatedScalarFieldContainer[str]
    rebalance_reason: str
    def __init__(self, state: _Optional[str] = ..., generation_id: _Optional[int] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., leader_id: _Optional[str] = ..., leader_unavailable_reason: _Optional[str] = ..., pending_member_ids: _Optional[_Iterable[str]] = ..., members_joined: _Optional[_Iterable[str]] = ..., members_awaiting_sync: _Optional[_Iterable[str]] = ..., rebalance_reason: _Optional[str] = ...) -> None: ...

class DescribedMember(_message.Message):
    __slots__ = ("member_id", "instance_id", "url", "member_epoch", "state", "current_assignment", "pending_revocation", "target_assignment", "assignors", "rebalance_timeout_ms", "fencing_tokens", "group_protocol", "classic")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MEMBER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    PENDING_REVOCATION_FIELD_NUMBER: _ClassVar[int]
    TARGET_ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNORS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    FENCING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GROUP_PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    CLASSIC_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    instance_id: str
    url: str
    member_epoch: int
    state: str
    current_assignment: _common_pb2.ConnectorsAndTasks
    pending_revocation: _common_pb2.ConnectorsAndTasks
    target_assignment: _common_pb2.ConnectorsAndTasks
    assignors: _containers.RepeatedCompositeFieldContainer[_common_pb2.Assignor]
    rebalance_timeout_ms: int
    fencing_tokens: _containers.RepeatedCompositeFieldContainer[_common_pb2.FencingToken]
    group_protocol: str
    classic: ClassicMemberDescription
    def __init__(self, member_id: _Optional[str] = ..., instance_id: _Optional[str] = ..., url: _Optional[str] = ..., member_epoch: _Optional[int] = ..., state: _Optional[str] = ..., current_assignment: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., pending_revocation: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., target_assignment: _Optional[_Union[_common_pb2.ConnectorsAndTasks, _Mapping]] = ..., assignors: _Optional[_Iterable[_Union[_common_pb2.Assignor, _Mapping]]] = ..., rebalance_timeout_ms: _Optional[int] = ..., fencing_tokens: _Optional[_Iterable[_Union[_common_pb2.FencingToken, _Mapping]]] = ..., group_protocol: _Optional[str] = ..., classic: _Optional[_Union[ClassicMemberDescription, _Mapping]] = ...) -> None: ...

class ClassicMemberDescription(_message.Message):
    __slots__ = ("protocols", "session_timeout_ms", "last_joined_generation", "synced")
    PROTOCOLS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_JOINED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    SYNCED_FIELD_NUMBER: _ClassVar[int]
    protocols: _containers.RepeatedScalarFieldContainer[str]
    session_timeout_ms: int
    last_joined_generation: int
    synced: bool
    def __init__(self, protocols: _Optional[_Iterable[str]] = ..., session_timeout_ms: _Optional[int] = ..., last_joined_generation: _Optional[int] = ..., synced: _Optional[bool] = ...) -> None: ...

class FindCoordinatorRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class FindCoordinatorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "host", "port", "node_id")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    host: str
    port: int
    node_id: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...
