"""Records: the only way group state changes. Handlers emit them; replay applies them; the store
persists each one in the same transaction (one row upsert, delete or event append each)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, assert_never

from .classic_model import RoundDelta
from .model import Connector, GroupMeta, Member, ResourceStatus, TargetAssignment, Tombstone


class EventType(StrEnum):
    """Audit events (DESIGN 3.17), appended in the same transaction as the change."""

    GROUP_CREATED = "GROUP_CREATED"
    MEMBER_JOINED = "MEMBER_JOINED"
    MEMBER_REJOINED = "MEMBER_REJOINED"
    MEMBER_LEFT = "MEMBER_LEFT"
    MEMBER_FENCED = "MEMBER_FENCED"
    MEMBER_SESSION_EXPIRED = "MEMBER_SESSION_EXPIRED"
    REVOCATION_TIMED_OUT = "REVOCATION_TIMED_OUT"
    STATIC_MEMBER_REPLACED = "STATIC_MEMBER_REPLACED"
    GROUP_EPOCH_BUMPED = "GROUP_EPOCH_BUMPED"
    TARGET_INSTALLED = "TARGET_INSTALLED"
    ASSIGNMENT_DELIVERED = "ASSIGNMENT_DELIVERED"
    REVOCATION_REQUESTED = "REVOCATION_REQUESTED"
    REVOCATION_ACKNOWLEDGED = "REVOCATION_ACKNOWLEDGED"
    #: Some of a pending revocation released while the rest is still being stopped (3.11).
    REVOCATION_PARTIALLY_ACKNOWLEDGED = "REVOCATION_PARTIALLY_ACKNOWLEDGED"
    ASSIGNOR_CHOSEN = "ASSIGNOR_CHOSEN"
    ASSIGNOR_UNAVAILABLE = "ASSIGNOR_UNAVAILABLE"
    ASSIGNMENT_REQUESTED = "ASSIGNMENT_REQUESTED"
    ASSIGNOR_TIMED_OUT = "ASSIGNOR_TIMED_OUT"
    ASSIGNOR_FAILED = "ASSIGNOR_FAILED"
    SCHEDULED_REBALANCE_SET = "SCHEDULED_REBALANCE_SET"
    SCHEDULED_REBALANCE_FIRED = "SCHEDULED_REBALANCE_FIRED"
    HOLD_RELEASED = "HOLD_RELEASED"
    CONNECTOR_PUT = "CONNECTOR_PUT"
    CONNECTOR_DELETED = "CONNECTOR_DELETED"
    CONFIG_ALTERED = "CONFIG_ALTERED"
    #: Resources' statuses changed by a holder's report (DESIGN 3.20): `changes` [{connector,
    #: task?, state, previous_state, fencing_token, trace_digest?}]; traces only as digests.
    STATUS_CHANGED = "STATUS_CHANGED"
    #: Pause-, Resume- or StopConnector changed a connector's target state (DESIGN 3.20):
    #: target_state, previous_target_state, holders_told, auto_restarts_cancelled, and who.
    CONNECTOR_TARGET_STATE_CHANGED = "CONNECTOR_TARGET_STATE_CHANGED"
    #: Restarts requested (DESIGN 3.20): reason "manual" (RestartConnector: include_tasks,
    #: only_failed, task?, who) or "auto" (attempt); restarts [{connector, task?,
    #: restart_count, worker_id}].
    CONNECTOR_RESTART_REQUESTED = "CONNECTOR_RESTART_REQUESTED"
    #: Calls denied by authorization, aggregated per principal and operation per interval,
    #: with a count and a sample of the groups (written by the authorizer, outside any group's
    #: commit; group_epoch -1; group id the one group named, else "").
    AUTHORIZATION_DENIED = "AUTHORIZATION_DENIED"
    #: An ACL entry added or removed through AddAcl / RemoveAcl or `coordinator-svc acl`, with
    #: the caller's principal and address (cluster-level: group id "", group_epoch -1).
    ACL_ADDED = "ACL_ADDED"
    ACL_REMOVED = "ACL_REMOVED"
    #: ACL rows changed directly in the database (neither path): the rows added and removed,
    #: principal `database`; recorded once, by the first coordinator that notices.
    ACL_CHANGED = "ACL_CHANGED"
    #: A cluster feature's level set through UpdateFeatures (DESIGN 3.19): `feature`, `level`,
    #: `previous_level` and the caller's `principal` and `address` (group id "", epoch -1).
    FEATURE_UPDATED = "FEATURE_UPDATED"
    #: Classic groups (DESIGN 3.19). A rebalance started: `reason`, `generation` (the current
    #: one), `from_state`, and `connector` when a catalogue change started it.
    CLASSIC_REBALANCE_STARTED = "CLASSIC_REBALANCE_STARTED"
    #: A join phase completed (emitted at the new generation's epoch): `generation`,
    #: `leader`, `protocol`, `members` [ids], `removed` [ids], `withheld` (a resource set).
    CLASSIC_JOIN_COMPLETED = "CLASSIC_JOIN_COMPLETED"
    #: The leader's assignments were refused: `generation`, `reason`, `resources` [names].
    ASSIGNMENT_REFUSED = "ASSIGNMENT_REFUSED"
    #: A group changed type: `direction` (to_classic, to_connect), `group_epoch_before`,
    #: `generation`, `members` {classic: n, connect: n}.
    GROUP_CONVERTED = "GROUP_CONVERTED"
    #: DeleteGroup deleted the group (DESIGN 3.20), at its last epoch: `group_type`,
    #: `connectors_deleted`, `tasks_deleted`, `configs_deleted`, `last_fencing_token` (which
    #: the tombstone keeps with the epoch), and who. Its earlier events are kept.
    GROUP_DELETED = "GROUP_DELETED"
    #: RemoveMember removed a member (DESIGN 3.20), as a fence does: `reason`, `protocol`,
    #: `static_left` (a static member that had left: nothing held), `held` (a resource set)
    #: and `held_until_ms`, and who.
    MEMBER_REMOVED = "MEMBER_REMOVED"


@dataclass(frozen=True, slots=True)
class GroupMetaRecord:
    """The group's metadata. `prepared_changed`: whether `meta.prepared` (the Prepare snapshot,
    as large as the group and catalogue) differs from before; when not, the store leaves it."""

    meta: GroupMeta
    prepared_changed: bool = True


@dataclass(frozen=True, slots=True)
class TargetRecord:
    """A new target. `changed_members`: the only members whose entries differ from the target
    it replaces (None: any may), so the store rewrites just those rows."""

    group_id: str
    target: TargetAssignment
    changed_members: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class MemberRecord:
    """A member as it is now. `epoch_only`: it differs from the committed member only in its
    epochs, state and lifecycle revision (a member moving to a new epoch keeping its work, a
    holder told of a config change), so the store updates just those columns."""

    group_id: str
    member: Member
    epoch_only: bool = False


@dataclass(frozen=True, slots=True)
class MembersMovedRecord:
    """Members moved to `epoch` by an install with nothing else about them changed (DESIGN
    3.21): each was STABLE with nothing pending and its target share equal to its assignment.
    Only their `member_epoch` changes (not `previous_epoch`, not `stable_since_epoch`), so the
    store writes all of them with one statement."""

    group_id: str
    member_ids: tuple[str, ...]
    epoch: int


@dataclass(frozen=True, slots=True)
class MemberRemovedRecord:
    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ConnectorRecord:
    group_id: str
    connector: Connector


@dataclass(frozen=True, slots=True)
class ConnectorRemovedRecord:
    group_id: str
    name: str


@dataclass(frozen=True, slots=True)
class ConfigRecord:
    group_id: str
    configs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """Resources' statuses as they are now (DESIGN 3.20): (connector, task) -> status, task
    CONNECTOR_TASK for a connector; None: the row is gone. A connector's rows also go with the
    connector (ConnectorRemovedRecord)."""

    group_id: str
    statuses: Mapping[tuple[str, int], ResourceStatus | None]


@dataclass(frozen=True, slots=True)
class ClassicRoundRecord:
    """A change of a classic group's volatile round (DESIGN 3.19): applied by replay (and taken
    back with the rest of a failed batch), never written by the store (the round is not
    persisted: a new owner starts a new join phase)."""

    group_id: str
    delta: RoundDelta


@dataclass(frozen=True, slots=True)
class GroupDeletedRecord:
    """The group and all its state are gone (DESIGN 3.20); `tombstone` keeps its counters.
    The last state record of its commit: the runtime drops the group's state after it, and
    the store deletes the group's rows and writes the tombstone."""

    group_id: str
    tombstone: Tombstone
    at_ms: int
    deleted_by: str = ""


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One audit event. `payload` is JSON-serialisable."""

    group_id: str
    group_epoch: int
    event_type: EventType
    at_ms: int
    member_id: str | None = None
    payload: Mapping[str, Any] = field(default_factory=dict)


StateRecord = (
    GroupMetaRecord
    | TargetRecord
    | MemberRecord
    | MembersMovedRecord
    | MemberRemovedRecord
    | ConnectorRecord
    | ConnectorRemovedRecord
    | ConfigRecord
    | StatusRecord
    | GroupDeletedRecord
)
Record = StateRecord | ClassicRoundRecord | EventRecord


class RecordVisitor(Protocol):
    """What each interpreter of records handles: one method per record type. The two
    interpreters are `replay` (apply to the in-memory state) and the store's write plan (net
    row writes); `visit` is the one place that tells the types apart, so a new record type is
    a mypy error in both until they handle it."""

    def meta(self, record: GroupMetaRecord) -> None: ...

    def target(self, record: TargetRecord) -> None: ...

    def member(self, record: MemberRecord) -> None: ...

    def members_moved(self, record: MembersMovedRecord) -> None: ...

    def member_removed(self, record: MemberRemovedRecord) -> None: ...

    def connector(self, record: ConnectorRecord) -> None: ...

    def connector_removed(self, record: ConnectorRemovedRecord) -> None: ...

    def configs(self, record: ConfigRecord) -> None: ...

    def statuses(self, record: StatusRecord) -> None: ...

    def group_deleted(self, record: GroupDeletedRecord) -> None: ...

    def classic_round(self, record: ClassicRoundRecord) -> None: ...

    def event(self, record: EventRecord) -> None: ...


def visit(record: Record, visitor: RecordVisitor) -> None:
    """Hand `record` to the visitor's method for its type."""
    match record:
        case GroupMetaRecord():
            visitor.meta(record)
        case TargetRecord():
            visitor.target(record)
        case MemberRecord():
            visitor.member(record)
        case MembersMovedRecord():
            visitor.members_moved(record)
        case MemberRemovedRecord():
            visitor.member_removed(record)
        case ConnectorRecord():
            visitor.connector(record)
        case ConnectorRemovedRecord():
            visitor.connector_removed(record)
        case ConfigRecord():
            visitor.configs(record)
        case StatusRecord():
            visitor.statuses(record)
        case GroupDeletedRecord():
            visitor.group_deleted(record)
        case ClassicRoundRecord():
            visitor.classic_round(record)
        case EventRecord():
            visitor.event(record)
        case _:
            assert_never(record)


def record_group_id(record: Record) -> str:
    """The group a record belongs to."""
    return record.meta.group_id if isinstance(record, GroupMetaRecord) else record.group_id
