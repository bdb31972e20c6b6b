"""The state of a group, as the core sees it.

Values (members, target, metadata) are immutable dataclasses replaced whole; `GroupState` is the
one mutable container, changed only by `replay.apply`, and keeps an index of who owns each
resource so that the single-owner invariant is checked where state is applied.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import TypeVar

from connect_protocol.configs import (
    ASSIGNMENT_INTERVAL,
    ASSIGNOR_PRINCIPAL_LIST,
    GROUP_CONFIGS,
    HEARTBEAT_INTERVAL,
    MIGRATION_POLICY,
    REBALANCE_TIMEOUT,
    REBALANCE_WAVE_MAX,
    REBALANCE_WAVE_PAUSE,
    RESTART_FAILED_BACKOFF,
    RESTART_FAILED_MAX_ATTEMPTS,
    SCHEDULED_REBALANCE_MAX_DELAY,
    SESSION_TIMEOUT,
    Readable,
    read,
)
from connect_protocol.lifecycle_messages import TargetState
from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from connect_protocol.messages import Assignor
from connect_protocol.resources import (
    EMPTY,
    ResourceSet,
    TaskId,
    catalogue_resources,
    catalogue_with,
    connector_resources,
)
from connect_protocol.tokens import NO_TOKENS, FencingTokens

from .classic_model import (
    ClassicGroupMeta,
    ClassicMemberInfo,
    ClassicRound,
    GroupType,
)
from .errors import IllegalStateError
from .selection_index import Profile, SelectionIndex, profile_of
from .wire_size import config_bytes, connector_bytes

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GroupConfigDefaults:
    """Server-wide settings: the defaults of the group configurations (one field per row of
    `connect_protocol.configs.GROUP_CONFIGS`, named by its `field`; Kafka Connect's defaults),
    and the limits that are not group configurations."""

    session_timeout_ms: int = SESSION_TIMEOUT.default
    heartbeat_interval_ms: int = HEARTBEAT_INTERVAL.default
    rebalance_timeout_ms: int = REBALANCE_TIMEOUT.default
    scheduled_rebalance_max_delay_ms: int = SCHEDULED_REBALANCE_MAX_DELAY.default
    rebalance_wave_max_resources: int = REBALANCE_WAVE_MAX.default
    rebalance_wave_pause_ms: int = REBALANCE_WAVE_PAUSE.default
    assignment_interval_ms: int = ASSIGNMENT_INTERVAL.default
    #: Who may compute (DESIGN 3.4): comma-separated principals, "" for any.
    assignor_principals: str = ASSIGNOR_PRINCIPAL_LIST.default
    #: Which conversions of a non-empty group are allowed (DESIGN 3.19).
    group_protocol_migration_policy: str = MIGRATION_POLICY.default
    #: Automatic restarts of FAILED resources (DESIGN 3.20).
    restart_failed_max_attempts: int = RESTART_FAILED_MAX_ATTEMPTS.default
    restart_failed_backoff_ms: int = RESTART_FAILED_BACKOFF.default
    assignment_error_backoff_ms: int = 1_000
    max_group_size: int = 10_000
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: Limits that keep one group (or one caller) from costing others (issue 12); each is a
    #: `serve` flag, and a request over one is refused with POLICY_VIOLATION.
    max_id_length: int = 249  # at most the database's column width
    max_url_length: int = 2_048
    max_groups: int = 100_000
    #: Groups one principal may create (`groups.created_by`; 0: no limit beside max_groups).
    max_groups_per_principal: int = 10_000
    #: Group ids one DescribeGroups may name; the ids after it get error entries unread.
    max_describe_groups: int = 1_000
    max_connectors_per_group: int = 10_000
    max_tasks_per_group: int = 200_000
    max_config_bytes_per_connector: int = 1024 * 1024
    max_config_bytes_per_group: int = 64 * 1024 * 1024
    max_assignor_metadata_bytes: int = 64 * 1024
    max_assignor_state_bytes: int = 16 * 1024 * 1024
    #: The longest status trace kept per resource (DESIGN 3.20); a longer one is cut.
    status_trace_max_bytes: int = 4_096
    #: Classic groups (DESIGN 3.19): the bounds of a member's own session timeout (Kafka's
    #: group.min/max.session.timeout.ms), the delay before an EMPTY group's first generation
    #: (group.initial.rebalance.delay.ms), and how long a new member's parked JoinGroup keeps
    #: it without heartbeats (Kafka's CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS).
    classic_min_session_timeout_ms: int = 6_000
    classic_max_session_timeout_ms: int = 1_800_000
    classic_initial_rebalance_delay_ms: int = 3_000
    classic_new_member_join_timeout_ms: int = 300_000
    #: The database's config digest key (`SqlStore.config_digest_key`, loaded at start): every
    #: connector's `config_digest` is an HMAC under it. None (pure core tests): unkeyed digests.
    config_digest_key: bytes | None = field(default=None, repr=False)
    #: The group configurations' defaults as text, key -> value (derived; see `as_map`).
    _texts: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        texts = {row.name: str(getattr(self, row.field)) for row in GROUP_CONFIGS}
        object.__setattr__(self, "_texts", MappingProxyType(texts))

    def as_map(self) -> dict[str, str]:
        """Every group configuration's default, as text (what DescribeGroups and
        AlterGroupConfigs show for a key the group does not set)."""
        return dict(self._texts)

    def read(self, row: Readable[T], configs: Mapping[str, str]) -> T:
        """The typed value of `row` in a group's `configs`, else this server's default."""
        return read(row, configs, self._texts[row.name])


class MemberState(StrEnum):
    """What a member waits on (Kafka's names, for connectors and tasks)."""

    STABLE = "STABLE"
    UNREVOKED = "UNREVOKED"  # must give resources up before it moves to the target epoch
    UNRELEASED = "UNRELEASED"  # at the target epoch, waits for resources others still hold
    LEFT = "LEFT"  # a static member that left with epoch -2, held until its session expires


class GroupStatus(StrEnum):
    EMPTY = "EMPTY"
    ASSIGNING = "ASSIGNING"
    RECONCILING = "RECONCILING"
    STABLE = "STABLE"


@dataclass(frozen=True, slots=True)
class Member:
    """A worker in the group, with its current assignment.

    Attributes:
        assigned: what the member was last told it may run.
        pending_revocation: what it was told to give up and has not yet acknowledged.
        previous_epoch: the epoch held before the last epoch change (lost-response retries).
        principal: the caller that created the member; only it may act as the member
            ("" for members from before principals existed: the next caller adopts it).
        tokens: the fencing token of each resource of `assigned` (DESIGN 3.18).
        last_grant_at_ms: when it was last given a resource it did not hold (0: never).
        stable_since_epoch: the member epoch at which it was last sent its current assignment
            (DESIGN 3.21); changed only when its assignment, pending set or state changes,
            never when an install moves it to a new epoch with its share unchanged.
        lifecycle_revision: raised whenever what it must know about what it holds changes
            (DESIGN 3.20): a grant, a held connector's config. A level its answers carry.
        classic: what a member of the classic protocol has besides (DESIGN 3.19); None for a
            connect-protocol member. A classic member's `assigned` is what it holds,
            `pending_revocation` what it must still release, `member_epoch` the last
            generation it joined.
    """

    member_id: str
    member_epoch: int
    previous_epoch: int = 0
    instance_id: str | None = None
    url: str = ""
    rebalance_timeout_ms: int = 0
    assignors: tuple[Assignor, ...] = ()
    state: MemberState = MemberState.STABLE
    assigned: ResourceSet = EMPTY
    pending_revocation: ResourceSet = EMPTY
    principal: str = ""
    tokens: FencingTokens = NO_TOKENS
    last_grant_at_ms: int = 0
    stable_since_epoch: int = 0
    lifecycle_revision: int = 0
    classic: ClassicMemberInfo | None = None

    @property
    def group_protocol(self) -> GroupType:
        """The protocol the member speaks."""
        return GroupType.CONNECT if self.classic is None else GroupType.CLASSIC

    @property
    def owned(self) -> ResourceSet:
        """Everything the member may still be running: assigned plus pending revocation."""
        return self.assigned | self.pending_revocation

    def metadata_bytes(self) -> int:
        """The bytes of its client assignors' metadata (each is in a Prepare answer)."""
        return sum(len(a.metadata) for a in self.assignors)

    def assignor(self, name: str) -> Assignor | None:
        for a in self.assignors:
            if a.name == name:
                return a
        return None


class StatusState(StrEnum):
    """A resource's state (Kafka Connect's). UNASSIGNED is never stored: it is what a resource
    reads as when its holder has not reported under its grant (DESIGN 3.20)."""

    UNASSIGNED = "UNASSIGNED"
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"
    RESTARTING = "RESTARTING"


#: The task number a connector's own status is kept under.
CONNECTOR_TASK = -1


@dataclass(frozen=True, slots=True)
class ResourceStatus:
    """What a resource's holder last reported (DESIGN 3.20): the state, who reported it under
    which grant's fencing token, when, and the trace (cut to --status-trace-max-bytes). It
    counts only while `member_id` holds the resource under `token` (`core.status.read`)."""

    state: StatusState
    member_id: str
    token: int
    reported_at_ms: int
    trace: str = ""
    restart_count: int = 0
    #: The trace's keyed digest ("" for none; `core.status.trace_digest`).
    trace_digest: str = ""
    #: Consecutive automatic restarts (DESIGN 3.20): never above restart.failed.max.attempts,
    #: reset by a RUNNING report that has lasted restart.failed.backoff.ms (`core.restarts`).
    auto_attempts: int = 0
    #: When the pending automatic restart is due (None: none pending). It counts only while
    #: this status counts (its reporter holds the resource under `token`) and its connector
    #: is STARTED; otherwise it is cancelled.
    auto_restart_at_ms: int | None = None
    #: Whether automatic restarts gave up on it: reported FAILED with its attempts at
    #: restart.failed.max.attempts (> 0). Counted by `GroupState.exhausted` for /metrics.
    auto_exhausted: bool = False


@dataclass(frozen=True, slots=True)
class Connector:
    """A connector of the catalogue. `config_digest` is computed once, when it is put
    (`connect_protocol.configs.config_digest` under `GroupConfigDefaults.config_digest_key`),
    and read back from the store; it is no part of equality (the config is).

    `target_state` (DESIGN 3.20, KIP-875) is set by Pause/Resume/StopConnector and kept by a
    put. A STOPPED connector keeps `task_count` for resume; its tasks leave the group: every
    assignment input (the catalogue's resources, Prepare, the classic leader's catalogue) sees
    `effective_task_count`."""

    name: str
    task_count: int
    config: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    config_digest: str = field(default="", compare=False)
    target_state: TargetState = TargetState.STARTED

    @property
    def effective_task_count(self) -> int:
        """The tasks that exist for assignment: 0 while STOPPED, else `task_count`."""
        return 0 if self.target_state is TargetState.STOPPED else self.task_count

    def resources(self) -> ResourceSet:
        return connector_resources(self.name, self.effective_task_count)

    def wire_bytes(self) -> int:
        """What this connector adds to a PrepareAssignment answer, at most."""
        return connector_bytes(self.name, self.effective_task_count, self.config)

    def config_bytes(self) -> int:
        """The UTF-8 bytes of its config's keys and values (what the config limits count)."""
        return config_bytes(self.config)


@dataclass(frozen=True, slots=True)
class TargetEntry:
    """One member's share of a target assignment, with the assignor's per-member metadata."""

    resources: ResourceSet = EMPTY
    version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class TargetAssignment:
    assignment_epoch: int
    members: Mapping[str, TargetEntry] = field(default_factory=lambda: MappingProxyType({}))
    assignor_state: bytes = b""
    scheduled_rebalance_at_ms: int | None = None
    #: What the scheduled rebalance stands for, as the install declared (DESIGN 3.18).
    lost_work_rebalance_at_ms: int | None = None
    next_wave_at_ms: int | None = None

    def of(self, member_id: str) -> TargetEntry:
        return self.members.get(member_id, _EMPTY_ENTRY)

    def owner_map(self) -> dict[str, str]:
        """Display name of each resource -> member that the target gives it to."""
        owners: dict[str, str] = {}
        for member_id, entry in self.members.items():
            for name in entry.resources.names():
                owners[name] = member_id
        return owners


_EMPTY_ENTRY = TargetEntry()


@dataclass(frozen=True, slots=True)
class Hold:
    """Resources of a removed member that nobody may take before `until_ms` (DESIGN 3.13).

    While it lasts, the member's id and its instance id (a static member's, else None) stay
    bound to `principal`: no other principal may join with either (DESIGN 3.14).
    """

    member_id: str
    resources: ResourceSet
    until_ms: int
    principal: str = ""
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What DeleteGroup keeps of a deleted group (DESIGN 3.20): its last epoch (generation) and
    its last fencing token. A group created again under the same id continues both: its epoch
    starts above `group_epoch` (so (group, epoch) stays unique in the events) and every token
    it grants is above `last_fencing_token` (tokens only ever increase, DESIGN 3.18)."""

    group_id: str
    group_epoch: int
    last_fencing_token: int


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    """The group as a PrepareAssignment showed it: what the install is validated against."""

    group_epoch: int
    member_ids: frozenset[str]
    catalogue: ResourceSet


@dataclass(frozen=True, slots=True)
class GroupMeta:
    """Group-level bookkeeping besides members, catalogue, target and configurations.

    Attributes:
        assignor_member_id: the member chosen to compute targets (sticky while it qualifies).
        compute_requested_epoch: group epoch at which COMPUTE_ASSIGNMENT was first sent to the
            assignor member and not yet answered (its rebalance timeout runs from then).
        excluded_assignors: members passed over for this computation (timed out or failed).
        compute_not_before_ms: after a failed assignment, the backoff before asking again.
        session_floor_ms, session_floor_until_ms: after session.timeout.ms was lowered, the
            higher value members may still have been told (and fence themselves by), and until
            when (coordinator time) session expiry and holds must use at least it.
        last_fencing_token: the last fencing token granted in the group (DESIGN 3.18): every
            grant takes the next one, so a resource's tokens only ever increase. A deleted
            group's tombstone keeps it, and a group re-created under its id continues it.
        created_by: the principal whose request created the group (None: before that was
            recorded); --max-groups-per-principal counts by it.
        compute_requested_at_ms: when a target computation was last requested (None: never);
            `assignment.interval.ms` paces the next request from it (DESIGN 3.21).
        group_type: the protocol the group speaks (DESIGN 3.19).
        classic: a classic group's state, generation protocol and leader (its generation is
            `group_epoch`); None for connect groups.
    """

    group_id: str
    group_epoch: int
    created_at_ms: int = 0
    assignor_member_id: str | None = None
    compute_requested_epoch: int | None = None
    excluded_assignors: frozenset[str] = frozenset()
    compute_not_before_ms: int | None = None
    last_assignment_error: int = 0
    last_assignment_error_message: str = ""
    prepared: PreparedSnapshot | None = None
    holds: tuple[Hold, ...] = ()
    session_floor_ms: int = 0
    session_floor_until_ms: int = 0
    last_fencing_token: int = 0
    created_by: str | None = None
    compute_requested_at_ms: int | None = None
    group_type: GroupType = GroupType.CONNECT
    classic: ClassicGroupMeta | None = None

    @property
    def is_classic(self) -> bool:
        return self.group_type is GroupType.CLASSIC

    def session_floor(self, now_ms: int) -> int:
        """The session timeout some member may still believe in, if above the configured one."""
        return self.session_floor_ms if now_ms < self.session_floor_until_ms else 0


class GroupState:
    """All of one group's state, plus derived indexes. Mutated only by `replay.apply`."""

    def __init__(self, meta: GroupMeta, target: TargetAssignment) -> None:
        self.meta = meta
        self._target = target
        #: Members not settled on the target (`settled`), kept as members and the target
        #: change, so that `status()` is O(1) (a metrics scrape asks it of every group).
        self.unsettled: set[str] = set()
        self.members: dict[str, Member] = {}
        self.catalogue: dict[str, Connector] = {}
        self.configs: dict[str, str] = {}
        self.connector_owner: dict[str, str] = {}
        self.task_owner: dict[TaskId, str] = {}
        self.instance_owner: dict[str, str] = {}
        # Group-wide facts handlers need, kept as members and connectors change (so that no
        # handler looks at every member): selection profiles, the static members that left,
        # and the catalogue's resources (built when a Prepare or an Install first needs them;
        # after a catalogue change, the last ones built plus the connectors changed since, so a
        # PutConnector costs O(1) and the next Prepare O(tasks changed) in Python).
        self.selection_index = SelectionIndex()
        self.left_members: set[str] = set()
        self._catalogue_resources: ResourceSet | None = None
        self._catalogue_base: ResourceSet | None = None
        self._catalogue_changed: dict[str, int | None] = {}  # name -> task count in the base
        self.catalogue_wire_bytes = 0  # what the catalogue adds to a Prepare answer, at most
        self.catalogue_tasks = 0
        self.catalogue_config_bytes = 0
        self.assignor_metadata_bytes = 0  # of every member's client assignors, together
        #: A classic group's volatile join round (DESIGN 3.19): never persisted, changed only
        #: by `ClassicRoundRecord`s; None until the first one (and for connect groups).
        self.round: ClassicRound | None = None
        #: Classic members by protocol name they support, and how many classic members there
        #: are: the protocols every member supports are the names counted by all of them, so a
        #: JoinGroup checks its protocols against the group in O(1) (Kafka's ClassicGroup
        #: `supportedProtocols`), not by looking at every member.
        self.classic_protocol_counts: dict[str, int] = {}
        self.classic_members = 0
        #: Resources' statuses as reported (DESIGN 3.20): connector -> task (CONNECTOR_TASK for
        #: the connector itself) -> status. Kept per connector so that deleting one is O(1).
        self.statuses: dict[str, dict[int, ResourceStatus]] = {}
        #: How many stored statuses are in each state (a metrics scrape reads it: O(1)).
        self.status_counts: dict[StatusState, int] = {}
        #: How many stored statuses automatic restarts gave up on (`auto_exhausted`).
        self.exhausted = 0

    @property
    def target(self) -> TargetAssignment:
        return self._target

    @target.setter
    def target(self, target: TargetAssignment) -> None:
        """A new target: O(members), each member's share compared once (an install's cost)."""
        self._target = target
        self.unsettled = {m for m, member in self.members.items() if not self.settled(member)}

    def settled(self, member: Member) -> bool:
        """Whether `member` runs exactly its share of the target at the target's epoch (a
        static member that left counts as settled: it runs nothing the group waits on)."""
        if member.state is MemberState.LEFT:
            return True
        return (
            member.member_epoch == self._target.assignment_epoch
            and member.state is MemberState.STABLE
            and member.assigned == self._target.of(member.member_id).resources
        )

    @property
    def group_id(self) -> str:
        return self.meta.group_id

    @property
    def group_epoch(self) -> int:
        return self.meta.group_epoch

    @property
    def assignment_epoch(self) -> int:
        return self.target.assignment_epoch

    def catalogue_resources(self) -> ResourceSet:
        """Every connector and task of the catalogue (cached; after a catalogue change, the
        cached set updated by the connectors changed since: O(tasks changed) in Python)."""
        if self._catalogue_resources is None:
            base = self._catalogue_base
            if base is None:
                self._catalogue_resources = catalogue_resources(self.catalogue.values())
            else:
                changes = [
                    (name, was, self._task_count(name))
                    for name, was in self._catalogue_changed.items()
                ]
                self._catalogue_resources = catalogue_with(base, changes)
            self._catalogue_base = None
            self._catalogue_changed = {}
        return self._catalogue_resources

    def _task_count(self, name: str) -> int | None:
        """The connector's effective task count (what its resources are built from)."""
        connector = self.catalogue.get(name)
        return None if connector is None else connector.effective_task_count

    def _catalogue_changing(self, name: str) -> None:
        """Before connector `name` changes: keep the resources built so far as the base of the
        next build, with the connector's task count in it. O(1)."""
        if self._catalogue_resources is not None:
            self._catalogue_base = self._catalogue_resources
            self._catalogue_resources = None
            self._catalogue_changed = {}
        if self._catalogue_base is not None and name not in self._catalogue_changed:
            self._catalogue_changed[name] = self._task_count(name)

    def read_view(self) -> GroupState:
        """A copy that later changes to this state do not reach, for reading after the group's
        lock is released (DescribeGroups): the maps are copied (O(members + connectors) pointer
        copies), their values are immutable. The indexes are shared: do not use them on it."""
        view = copy.copy(self)
        view.members = dict(self.members)
        view.catalogue = dict(self.catalogue)
        view.configs = dict(self.configs)
        view.statuses = {c: dict(by_task) for c, by_task in self.statuses.items()}
        view.status_counts = dict(self.status_counts)
        view.unsettled = set(self.unsettled)
        view._catalogue_changed = dict(self._catalogue_changed)
        view.round = None if self.round is None else self.round.copy()
        return view

    def cached_catalogue_resources(self) -> ResourceSet | None:
        """The catalogue's resources if already built, else None. Never builds them, so it is
        safe to call without the group's lock (it reads one attribute)."""
        return self._catalogue_resources

    def put_connector(self, connector: Connector) -> None:
        """O(1): the running sums are updated, the catalogue's resources built when needed."""
        old = self.catalogue.get(connector.name)
        if old is not None:
            self._count(old, -1)
        if old is None or old.effective_task_count != connector.effective_task_count:
            self._catalogue_changing(connector.name)
        self.catalogue[connector.name] = connector
        self._count(connector, 1)

    def remove_connector(self, name: str) -> None:
        """The connector and its statuses go (the store deletes their rows with it)."""
        if name in self.catalogue:
            self._catalogue_changing(name)
        for status in self.statuses.pop(name, {}).values():
            self._count_status(status, -1)
        old = self.catalogue.pop(name, None)
        if old is not None:
            self._count(old, -1)

    def _count(self, connector: Connector, sign: int) -> None:
        self.catalogue_wire_bytes += sign * connector.wire_bytes()
        self.catalogue_tasks += sign * connector.task_count
        self.catalogue_config_bytes += sign * connector.config_bytes()

    def profile(self, member_id: str) -> Profile | None:
        """The selection profile of a member of the committed state."""
        member = self.members.get(member_id)
        return None if member is None else profile_of(member)

    def principal_of(self, member_id: str) -> str | None:
        """The principal of a member of the committed state."""
        member = self.members.get(member_id)
        return None if member is None else member.principal

    def assignor_principals(self, defaults: GroupConfigDefaults) -> frozenset[str] | None:
        """Who may compute (`assignor.principals`, DESIGN 3.4); None: any principal."""
        return assignor_principals(self.configs, defaults)

    def status(self) -> GroupStatus:
        """O(1): the unsettled members are kept as members and the target change."""
        if not self.members:
            return GroupStatus.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupStatus.ASSIGNING
        return GroupStatus.RECONCILING if self.unsettled else GroupStatus.STABLE

    def display_state(self) -> str:
        """The state ListGroups and DescribeGroups show: a classic group's classic state, a
        connect group's status. O(1)."""
        classic = self.meta.classic
        if self.meta.is_classic and classic is not None:
            return classic.state.value
        return self.status().value

    def config(self, row: Readable[T], defaults: GroupConfigDefaults) -> T:
        """The typed value of a group configuration: the group's, else the server's default."""
        return defaults.read(row, self.configs)

    def fencing_session_ms(self, now_ms: int, defaults: GroupConfigDefaults) -> int:
        """The session timeout the coordinator's own timers use (expiry, holds): the configured
        one, or a higher one members may still fence themselves by after it was lowered."""
        return fencing_session_ms(self.configs, self.meta, now_ms, defaults)

    # --- owner index, maintained by replay ---

    def _reindex_member(self, old: Member | None, new: Member | None) -> None:
        """Move the owner index from `old` to `new` (the same member id; None: absent).

        Only the difference is touched: a reconciling member's share changes by a few tasks
        while it owns 10,000, and re-indexing the whole share on every change (a Python step
        per task, twice) was a large part of its heartbeat (issue 24). The differences are
        computed in C; every conflict is found before anything changes, so a refused put
        leaves the index as it was.
        """
        member_id = (new or old).member_id  # type: ignore[union-attr]
        before = EMPTY if old is None else old.owned
        after = EMPTY if new is None else new.owned
        if before is not after:
            # By connector when the sets are kept so: O(connectors + the changed ones' tasks).
            added, removed = after - before, before - after
            added_connectors, added_tasks = added.connectors, added.tasks
            for c in self.connector_owner.keys() & added_connectors:
                holder = self.connector_owner[c]
                if holder != member_id:
                    raise IllegalStateError(
                        f"connector {c} would be owned by {member_id} and {holder}"
                    )
            for t in self.task_owner.keys() & added_tasks:
                holder = self.task_owner[t]
                if holder != member_id:
                    raise IllegalStateError(f"task {t} would be owned by {member_id} and {holder}")
            connector_owner, task_owner = self.connector_owner, self.task_owner
            for c in removed.connectors:
                if connector_owner.get(c) == member_id:
                    del connector_owner[c]
            for t in removed.tasks:
                if task_owner.get(t) == member_id:
                    del task_owner[t]
            connector_owner.update(dict.fromkeys(added_connectors, member_id))
            task_owner.update(dict.fromkeys(added_tasks, member_id))
        old_instance = None if old is None else old.instance_id
        new_instance = None if new is None else new.instance_id
        if (
            old_instance is not None
            and old_instance != new_instance
            and self.instance_owner.get(old_instance) == member_id
        ):
            del self.instance_owner[old_instance]
        if new_instance is not None:
            self.instance_owner[new_instance] = member_id

    def put_member(self, member: Member) -> None:
        old = self.members.get(member.member_id)
        self._reindex_member(old, member)
        self.members[member.member_id] = member
        self._index_selection(old, member)
        self._index_classic(old, member)
        if self.settled(member):
            self.unsettled.discard(member.member_id)
        else:
            self.unsettled.add(member.member_id)

    def resource_status(self, connector: str, task: int) -> ResourceStatus | None:
        """The stored status of a connector (task CONNECTOR_TASK) or task. O(1)."""
        by_task = self.statuses.get(connector)
        return None if by_task is None else by_task.get(task)

    def put_status(self, connector: str, task: int, status: ResourceStatus | None) -> None:
        """Store (None: forget) a resource's status. O(1)."""
        by_task = self.statuses.setdefault(connector, {})
        old = by_task.pop(task, None)
        if old is not None:
            self._count_status(old, -1)
        if status is not None:
            by_task[task] = status
            self._count_status(status, 1)
        elif not by_task:
            del self.statuses[connector]

    def _count_status(self, status: ResourceStatus, sign: int) -> None:
        self.status_counts[status.state] = self.status_counts.get(status.state, 0) + sign
        if status.auto_exhausted:
            self.exhausted += sign

    def put_member_epoch(self, member: Member) -> None:
        """Replace a member whose epoch alone changed (an install's epoch-only move, DESIGN
        3.21, or its undo): what it owns, its instance id and its assignors are as they were,
        so only its settledness is looked at again. O(1) but for comparing its share."""
        self.members[member.member_id] = member
        if self.settled(member):
            self.unsettled.discard(member.member_id)
        else:
            self.unsettled.add(member.member_id)

    def remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is not None:
            self._reindex_member(old, None)
            self._index_selection(old, None)
            self._index_classic(old, None)
        self.unsettled.discard(member_id)

    def _index_classic(self, old: Member | None, new: Member | None) -> None:
        """Keep `classic_protocol_counts` and `classic_members` as members come, change and
        go. O(protocols of the member)."""
        for member, sign in ((old, -1), (new, 1)):
            if member is None or member.classic is None:
                continue
            self.classic_members += sign
            counts = self.classic_protocol_counts
            for name in member.classic.protocol_names():
                counts[name] = counts.get(name, 0) + sign
                if counts[name] == 0:
                    del counts[name]

    def _index_selection(self, old: Member | None, new: Member | None) -> None:
        member_id = (new or old).member_id  # type: ignore[union-attr]
        self.assignor_metadata_bytes += (0 if new is None else new.metadata_bytes()) - (
            0 if old is None else old.metadata_bytes()
        )
        moved = (
            old is None
            or new is None
            or old.assignors != new.assignors
            or old.principal != new.principal
        )
        if old is not None and moved:
            self.selection_index.remove(member_id, profile_of(old), old.principal)
        if new is not None and moved:
            self.selection_index.add(member_id, profile_of(new), new.principal)
        if new is not None and new.state is MemberState.LEFT:
            self.left_members.add(member_id)
        else:
            self.left_members.discard(member_id)

    def held_by(self, resources: ResourceSet) -> dict[str, str]:
        """Display name -> holder, for resources of `resources` that a hold keeps from anyone."""
        held: dict[str, str] = {}
        for hold in self.meta.holds:
            for name in (hold.resources & resources).names():
                held[name] = f"hold:{hold.member_id}"
        return held


def assignor_principals(
    configs: Mapping[str, str], defaults: GroupConfigDefaults
) -> frozenset[str] | None:
    """The principals whose members may be chosen as assignor member (the group's
    `assignor.principals`, else the server's default); None when any may."""
    listed = defaults.read(ASSIGNOR_PRINCIPAL_LIST, configs)
    return frozenset(listed) if listed else None


def fencing_session_ms(
    configs: Mapping[str, str], meta: GroupMeta, now_ms: int, defaults: GroupConfigDefaults
) -> int:
    """The session timeout the coordinator's own timers use (expiry, holds): the configured one,
    or a higher one members may still fence themselves by after it was lowered."""
    configured = defaults.read(SESSION_TIMEOUT, configs)
    return max(configured, meta.session_floor(now_ms))


def next_compute_request_ms(meta: GroupMeta, interval_ms: int) -> int | None:
    """When a new target computation may next be requested (DESIGN 3.21): the last request
    plus `assignment.interval.ms`, and after a failed assignment not before its backoff
    (DESIGN 3.10); None: at once (never requested, nothing to wait for)."""
    due = meta.compute_not_before_ms
    if meta.compute_requested_at_ms is not None:
        after_last = meta.compute_requested_at_ms + interval_ms
        due = after_last if due is None else max(due, after_last)
    return due
