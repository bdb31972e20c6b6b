"""The coordinator's tables (SQLAlchemy 2 declarative). The schema is created only by Alembic
(`migrations/`); `alembic check` compares this metadata with the database, so a change here needs
a migration.

One row per entity of the core's state (model.py): a group's metadata, its members, catalogue,
target assignment and configurations; plus the group leases (ownership, DESIGN 3.16) and the
append-only audit trail (DESIGN 3.17). Sets of resources are stored as `ResourceSet.to_json`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

GROUP_ID_LENGTH = 249
#: The longest principal name kept (a certificate subject mapped by the rules).
PRINCIPAL_LENGTH = 1024
GROUP_TYPE_CONNECT = "connect"
GROUP_TYPE_CLASSIC = "classic"
#: The group types the schema takes (DESIGN 3.19); also each member's `group_protocol`.
GROUP_TYPES = (GROUP_TYPE_CONNECT, GROUP_TYPE_CLASSIC)
MEMBER_STATES = ("STABLE", "UNREVOKED", "UNRELEASED", "LEFT")
#: What a resource's status row may hold (UNASSIGNED is derived when read, never stored).
RESOURCE_STATES = ("RUNNING", "PAUSED", "FAILED", "STOPPED", "RESTARTING")
#: The connectors' target states (`connect_protocol.lifecycle_messages.TargetState`).
TARGET_STATES = ("STARTED", "PAUSED", "STOPPED")
CLASSIC_STATES = ("EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE")


def _one_of(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


#: The CHECK constraints of migration 0007 (written once: the migration uses them too).
GROUP_TYPE_CHECK = _one_of("group_type", GROUP_TYPES)
CLASSIC_STATE_CHECK = "classic_state IS NULL OR " + _one_of("classic_state", CLASSIC_STATES)
GROUP_PROTOCOL_CHECK = _one_of("group_protocol", GROUP_TYPES)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_N_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
"""JSON everywhere; JSONB on PostgreSQL."""

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""A 64-bit surrogate key; plain INTEGER on SQLite so that it is the auto-incrementing rowid."""


class UtcDateTime(sa.TypeDecorator[datetime]):
    """A timezone-aware timestamp, always handed out in UTC.

    PostgreSQL stores `timestamptz`; SQLite stores naive UTC text (which sorts and compares
    correctly as text), so values are converted to UTC on the way in and marked UTC on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        return value.astimezone(UTC)

    def process_result_value(self, value: Any | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime from the database, got {value!r}")
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)


def _group_fk(table: str = "groups") -> sa.ForeignKey:
    return sa.ForeignKey(f"{table}.group_id", ondelete="CASCADE")


class Group(Base):
    """A group's metadata (`GroupMeta`)."""

    __tablename__ = "groups"
    __table_args__ = (
        sa.CheckConstraint(GROUP_TYPE_CHECK, name="group_type"),
        sa.CheckConstraint(CLASSIC_STATE_CHECK, name="classic_state"),
    )

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), primary_key=True)
    group_type: Mapped[str] = mapped_column(sa.String(16))
    group_epoch: Mapped[int] = mapped_column(sa.Integer)
    created_at_ms: Mapped[int] = mapped_column(sa.BigInteger)
    assignor_member_id: Mapped[str | None] = mapped_column(sa.String)
    compute_requested_epoch: Mapped[int | None] = mapped_column(sa.Integer)
    excluded_assignors: Mapped[list[str]] = mapped_column(JSON)
    compute_not_before_ms: Mapped[int | None] = mapped_column(sa.BigInteger)
    last_assignment_error: Mapped[int] = mapped_column(sa.Integer)
    last_assignment_error_message: Mapped[str] = mapped_column(sa.Text)
    prepared: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    holds: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    session_floor_ms: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    session_floor_until_ms: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    # The last fencing token granted in the group (DESIGN 3.18); never goes down.
    last_fencing_token: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    # The principal whose request created the group (NULL: created before migration 0005, counted
    # only against --max-groups); --max-groups-per-principal counts by it.
    created_by: Mapped[str | None] = mapped_column(sa.String(PRINCIPAL_LENGTH), index=True)
    # When a target computation was last requested (coordinator ms; NULL: never), from which
    # `assignment.interval.ms` paces the next request (DESIGN 3.21).
    compute_requested_at_ms: Mapped[int | None] = mapped_column(sa.BigInteger)
    # Classic groups (DESIGN 3.19; NULL for connect groups): the classic state, the current
    # generation's protocol and leader. The generation is `group_epoch` (one counter).
    classic_state: Mapped[str | None] = mapped_column(sa.String(24))
    protocol_name: Mapped[str | None] = mapped_column(sa.String(32))
    leader_id: Mapped[str | None] = mapped_column(sa.String)


class GroupLease(Base):
    """Which coordinator process owns a group, until when (DESIGN 3.16). No foreign key: a lease
    is taken before the group exists (the request that creates it needs the lease)."""

    __tablename__ = "group_leases"

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), primary_key=True)
    owner_id: Mapped[str] = mapped_column(sa.String)
    advertised_address: Mapped[str] = mapped_column(sa.String)
    token: Mapped[int] = mapped_column(sa.BigInteger)
    lease_until: Mapped[datetime] = mapped_column(UtcDateTime)
    acquired_at: Mapped[datetime] = mapped_column(UtcDateTime)


class MemberRow(Base):
    """A member and its current assignment (`Member`)."""

    __tablename__ = "members"
    __table_args__ = (
        sa.Index("ix_members_group_id_instance_id", "group_id", "instance_id", unique=True),
        sa.CheckConstraint(
            "state IN (" + ", ".join(f"'{s}'" for s in MEMBER_STATES) + ")", name="state"
        ),
        sa.CheckConstraint(GROUP_PROTOCOL_CHECK, name="group_protocol"),
    )

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), _group_fk(), primary_key=True)
    member_id: Mapped[str] = mapped_column(sa.String, primary_key=True)
    instance_id: Mapped[str | None] = mapped_column(sa.String)
    url: Mapped[str] = mapped_column(sa.Text)
    member_epoch: Mapped[int] = mapped_column(sa.Integer)
    previous_epoch: Mapped[int] = mapped_column(sa.Integer)
    state: Mapped[str] = mapped_column(sa.String(16))
    rebalance_timeout_ms: Mapped[int] = mapped_column(sa.Integer)
    assignors: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    assigned: Mapped[dict[str, Any]] = mapped_column(JSON)
    pending_revocation: Mapped[dict[str, Any]] = mapped_column(JSON)
    # Who created the member (DESIGN 3.2): only that principal may act as it.
    principal: Mapped[str] = mapped_column(sa.String(PRINCIPAL_LENGTH), server_default="")
    # The fencing token of each assigned resource (`FencingTokens.to_json`), and when the member
    # was last given a resource it did not hold (DESIGN 3.18).
    fencing_tokens: Mapped[dict[str, Any]] = mapped_column(JSON, server_default="{}")
    last_grant_at_ms: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    # The member epoch at which it was last sent its current assignment (DESIGN 3.21): written
    # when its assignment, pending set or state changes, never by an install's epoch-only move.
    stable_since_epoch: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    # Classic members (DESIGN 3.19; NULL for connect-protocol members): the protocol the member
    # speaks, its protocols with its metadata for each ([{name, version, url, config_offset,
    # allocation?}]), its own session timeout, the last generation it joined, and its share of
    # the last accepted assignments ({generation, version, assignment, revoked?, delay,
    # answered}), answered to SyncGroup retries after a takeover.
    group_protocol: Mapped[str] = mapped_column(sa.String(16), server_default=GROUP_TYPE_CONNECT)
    classic_protocols: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    session_timeout_ms: Mapped[int | None] = mapped_column(sa.Integer)
    last_joined_generation: Mapped[int | None] = mapped_column(sa.Integer)
    classic_assignment: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Raised in the transaction of any change to what the member must know about what it holds
    # (DESIGN 3.20): a grant, a held connector's config or target state, a restart.
    lifecycle_revision: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")


class ConnectorRow(Base):
    """One connector of the catalogue (`Connector`)."""

    __tablename__ = "connectors"
    __table_args__ = (
        sa.CheckConstraint(
            "target_state IN (" + ", ".join(f"'{s}'" for s in TARGET_STATES) + ")",
            name="target_state",
        ),
    )

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), _group_fk(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String, primary_key=True)
    task_count: Mapped[int] = mapped_column(sa.Integer)
    config: Mapped[dict[str, str]] = mapped_column(JSON)
    # `connect_protocol.configs.config_digest(config)`: what the audit export keeps instead of
    # the values (configs carry secrets).
    config_digest: Mapped[str] = mapped_column(sa.String(80), server_default="")
    # Pause/Resume/StopConnector's target state (DESIGN 3.20); a put keeps it.
    target_state: Mapped[str] = mapped_column(sa.String(16), server_default="STARTED")


class ResourceStatusRow(Base):
    """What a resource's holder last reported (DESIGN 3.20, `core.model.ResourceStatus`): one
    row per connector (task -1) or task that was ever reported or restarted. Whether it counts
    is derived when read (the member and token must still be its holder's grant), so a
    rebalance writes none; deleted with the connector."""

    __tablename__ = "resource_statuses"
    __table_args__ = (
        sa.CheckConstraint(
            "state IN (" + ", ".join(f"'{s}'" for s in RESOURCE_STATES) + ")", name="state"
        ),
    )

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), _group_fk(), primary_key=True)
    connector: Mapped[str] = mapped_column(sa.String, primary_key=True)
    task: Mapped[int] = mapped_column(sa.Integer, primary_key=True)  # -1: the connector itself
    state: Mapped[str] = mapped_column(sa.String(16))
    member_id: Mapped[str] = mapped_column(sa.String)  # who reported it ("" for a restart only)
    fencing_token: Mapped[int] = mapped_column(sa.BigInteger)
    restart_count: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    trace: Mapped[str] = mapped_column(sa.Text, server_default="")
    # The trace's keyed digest (`core.status.trace_digest`; "" for none): what the audit export
    # and the STATUS_CHANGED events carry instead of the text (traces may carry secrets).
    trace_digest: Mapped[str] = mapped_column(sa.String(80), server_default="")
    reported_at_ms: Mapped[int] = mapped_column(sa.BigInteger)
    # Automatic restarts (DESIGN 3.20): consecutive attempts, when the next is due (NULL: none
    # pending), and whether they gave up (attempts reached restart.failed.max.attempts).
    auto_attempts: Mapped[int] = mapped_column(sa.Integer, server_default="0")
    auto_restart_at_ms: Mapped[int | None] = mapped_column(sa.BigInteger)
    auto_exhausted: Mapped[bool] = mapped_column(sa.Boolean, server_default=sa.false())


class TargetAssignmentRow(Base):
    """A group's target assignment, without its per-member shares (`TargetAssignment`)."""

    __tablename__ = "target_assignments"

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), _group_fk(), primary_key=True)
    assignment_epoch: Mapped[int] = mapped_column(sa.Integer)
    assignor_state: Mapped[bytes] = mapped_column(sa.LargeBinary)
    scheduled_rebalance_at_ms: Mapped[int | None] = mapped_column(sa.BigInteger)
    # What the scheduled rebalance stands for (held-back lost work, the next paced wave).
    lost_work_rebalance_at_ms: Mapped[int | None] = mapped_column(sa.BigInteger)
    next_wave_at_ms: Mapped[int | None] = mapped_column(sa.BigInteger)


class TargetAssignmentMemberRow(Base):
    """One member's share of the target (`TargetEntry`). The member may have left since: no
    foreign key to `members`."""

    __tablename__ = "target_assignment_members"

    group_id: Mapped[str] = mapped_column(
        sa.String(GROUP_ID_LENGTH), _group_fk("target_assignments"), primary_key=True
    )
    member_id: Mapped[str] = mapped_column(sa.String, primary_key=True)
    resources: Mapped[dict[str, Any]] = mapped_column(JSON)
    version: Mapped[int] = mapped_column(sa.Integer)
    metadata_: Mapped[bytes] = mapped_column("metadata", sa.LargeBinary)


class GroupConfigRow(Base):
    """One group configuration set through AlterGroupConfigs (unset ones use server defaults)."""

    __tablename__ = "group_configs"

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), _group_fk(), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String, primary_key=True)
    value: Mapped[str] = mapped_column(sa.Text)


class EventRow(Base):
    """The append-only audit trail (DESIGN 3.17). No foreign key: the trail outlives its group.
    Ids increase in commit order per group (commits of a group are serialised by its lease row)."""

    __tablename__ = "events"
    __table_args__ = (
        sa.Index("ix_events_group_id_id", "group_id", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    occurred_at: Mapped[datetime] = mapped_column(UtcDateTime)
    at_ms: Mapped[int] = mapped_column(sa.BigInteger)
    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH))
    group_epoch: Mapped[int] = mapped_column(sa.Integer)
    event_type: Mapped[str] = mapped_column(sa.String(64))
    member_id: Mapped[str | None] = mapped_column(sa.String)
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)


class AclRow(Base):
    """One access control entry (`core.acls.AclEntry`), managed by `coordinator-svc acl`. Ids
    are never reused; a trigger raises `acl_audit.revision` on every change (see AclAudit)."""

    __tablename__ = "acls"
    __table_args__ = ({"sqlite_autoincrement": True},)

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    principal: Mapped[str] = mapped_column(sa.String(PRINCIPAL_LENGTH))
    operation: Mapped[str] = mapped_column(sa.String(32))
    resource_type: Mapped[str] = mapped_column(sa.String(16))
    pattern_type: Mapped[str] = mapped_column(sa.String(16))
    pattern: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH))
    permission: Mapped[str] = mapped_column(sa.String(8))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime)


class AclAudit(Base):
    """The one row that says how far the ACL table has changed and how far that was audited.
    `revision` is raised by a database trigger on every INSERT, UPDATE or DELETE of `acls`
    (migration 0005), so an edit made in place is noticed as surely as an add; the coordinators
    re-read the ACLs when it moved. `audited_revision` and `audited_entries` are the revision
    and the entries the audit trail last accounted for: a change found beyond them was made
    directly in the database and is recorded once as ACL_CHANGED."""

    __tablename__ = "acl_audit"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    revision: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    audited_revision: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    audited_entries: Mapped[list[dict[str, Any]]] = mapped_column(JSON)


class CoordinatorSecret(Base):
    """Secrets of this database's coordinators, never exported (`audit_export` withholds the
    table): `config_digest_key`, the HMAC key of connector config digests (migration 0005)."""

    __tablename__ = "coordinator_secrets"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[bytes] = mapped_column(sa.LargeBinary)


class CoordinatorSetting(Base):
    """Settings every coordinator of this database reads at start (migration 0008):
    `stored_set_form`, how large resource sets are written (`store/stored_sets.py`)."""

    __tablename__ = "coordinator_settings"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    value: Mapped[str] = mapped_column(sa.String(64))


class FeatureRow(Base):
    """A cluster feature's finalized level (migration 0010, `core/features.py`): every
    coordinator of the database re-reads it within --acl-refresh-ms; UpdateFeatures sets it (with
    a FEATURE_UPDATED event). `updated_by`: the principal that set it last (`migration`)."""

    __tablename__ = "features"

    name: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    level: Mapped[int] = mapped_column(sa.Integer)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime)
    updated_by: Mapped[str] = mapped_column(sa.String(PRINCIPAL_LENGTH))


class GroupTombstone(Base):
    """What DeleteGroup keeps of a deleted group (migration 0013, DESIGN 3.20): its epoch and
    fencing-token counters, which a group re-created under the same id continues. Counts
    against no group limit."""

    __tablename__ = "group_tombstones"

    group_id: Mapped[str] = mapped_column(sa.String(GROUP_ID_LENGTH), primary_key=True)
    group_epoch: Mapped[int] = mapped_column(sa.Integer)
    last_fencing_token: Mapped[int] = mapped_column(sa.BigInteger)
    deleted_at: Mapped[datetime] = mapped_column(UtcDateTime)
    deleted_by: Mapped[str] = mapped_column(sa.String(PRINCIPAL_LENGTH))


class AuditExportProgress(Base):
    """One committed audit export run (migration 0013), appended by the export after its
    watermark: the event range it read and the lowest id it found unfilled. The event pruner
    keeps everything an export's latest row still needs (DESIGN 3.20 "Event retention")."""

    __tablename__ = "audit_export_progress"
    __table_args__ = (
        sa.Index("ix_audit_export_progress_export_name_id", "export_name", "id"),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(BIG_ID, primary_key=True, autoincrement=True)
    export_name: Mapped[str] = mapped_column(sa.String(128))
    since_event_id: Mapped[int] = mapped_column(sa.BigInteger)
    until_event_id: Mapped[int] = mapped_column(sa.BigInteger)
    lowest_unfilled_id: Mapped[int] = mapped_column(sa.BigInteger)
    at: Mapped[datetime] = mapped_column(UtcDateTime)


class EventPruning(Base):
    """The one row of the event pruner (migration 0013): the highest event id pruned (an
    export run starting at or below it refuses) and the lease that lets one coordinator prune
    at a time."""

    __tablename__ = "event_pruning"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    pruned_through_event_id: Mapped[int] = mapped_column(sa.BigInteger, server_default="0")
    pruned_at: Mapped[datetime | None] = mapped_column(UtcDateTime)
    owner_id: Mapped[str | None] = mapped_column(sa.String)
    lease_until: Mapped[datetime | None] = mapped_column(UtcDateTime)


#: The one row of `acl_audit`.
ACL_AUDIT_ROW_ID = 1
#: The one row of `event_pruning`.
EVENT_PRUNING_ROW_ID = 1
#: The `coordinator_secrets` row that holds the config digest key.
CONFIG_DIGEST_KEY = "config_digest_key"
#: The `coordinator_settings` row that says how large sets are stored ("plain" or "ranges").
STORED_SET_FORM = "stored_set_form"


def _table(model: type[Base]) -> sa.Table:
    table = model.__table__
    assert isinstance(table, sa.Table)
    return table


groups = _table(Group)
group_leases = _table(GroupLease)
members = _table(MemberRow)
resource_statuses = _table(ResourceStatusRow)
connectors = _table(ConnectorRow)
target_assignments = _table(TargetAssignmentRow)
target_assignment_members = _table(TargetAssignmentMemberRow)
group_configs = _table(GroupConfigRow)
events = _table(EventRow)
acls = _table(AclRow)
acl_audit = _table(AclAudit)
coordinator_secrets = _table(CoordinatorSecret)
coordinator_settings = _table(CoordinatorSetting)
features = _table(FeatureRow)
group_tombstones = _table(GroupTombstone)
audit_export_progress = _table(AuditExportProgress)
event_pruning = _table(EventPruning)

STATE_TABLES = (
    groups,
    members,
    connectors,
    target_assignments,
    target_assignment_members,
    group_configs,
    resource_statuses,
)
"""Tables that hold group state (not leases, not events), in foreign-key order."""
