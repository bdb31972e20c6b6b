"""GroupHarness: drives the core's handlers against one group, like Kafka's
GroupMetadataManagerTestContext.

Every call runs a handler on the current state, checks that the handler did not touch that state,
applies the records with `replay` (which must never raise), applies the timer operations to a
fake timer wheel, and returns the response. `sleep(ms)` moves the fake clock forward and fires the
timers that fall due, in deadline order, through `on_timer`, applying their records the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import (
    ConfigsRequest,
    ConfigsResponse,
    ReportStatusRequest,
    ReportStatusResponse,
    RestartRequest,
    RestartResponse,
    StatusEntry,
    TargetState,
    TargetStateRequest,
    TargetStateResponse,
)
from connect_protocol.messages import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    Assignor,
    DeleteConnectorRequest,
    DeleteConnectorResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    InstallRequest,
    InstallResponse,
    MemberTarget,
    PrepareRequest,
    PrepareResponse,
    PutConnectorRequest,
    PutConnectorResponse,
    RemoveMemberRequest,
    RemoveMemberResponse,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core import replay
from coordinator_svc.core.admin import alter_configs, delete_connector, put_connector
from coordinator_svc.core.assignment import install_assignment, plan_install, prepare_assignment
from coordinator_svc.core.change import continuing
from coordinator_svc.core.control import restart_connector, set_target_state
from coordinator_svc.core.group_removal import delete_group, remove_member
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.lifecycle import configs
from coordinator_svc.core.model import (
    GroupConfigDefaults,
    GroupState,
    GroupStatus,
    Member,
    Tombstone,
)
from coordinator_svc.core.records import EventRecord, EventType, GroupDeletedRecord, Record
from coordinator_svc.core.results import CancelTimer, Result, ScheduleTimer, TimerKey
from coordinator_svc.core.status import report_status
from coordinator_svc.core.timers import on_timer

R = TypeVar("R")

GROUP = "g"

# Scaled-down configurations (DESIGN 2.1: tests use small values).
SESSION_MS = 1_000
INTERVAL_MS = 100
REBALANCE_MS = 500
MAX_DELAY_MS = 3_000
BACKOFF_MS = 50

DEFAULTS = GroupConfigDefaults(
    session_timeout_ms=SESSION_MS,
    heartbeat_interval_ms=INTERVAL_MS,
    rebalance_timeout_ms=60_000,
    scheduled_rebalance_max_delay_ms=MAX_DELAY_MS,
    assignment_error_backoff_ms=BACKOFF_MS,
    # The seeds' step tables ask for a computation at every epoch bump (DESIGN 3.21: test
    # harnesses that replay them set the interval to 0; tests of batching set it).
    assignment_interval_ms=0,
)

# The agent's assignor lists (DESIGN 3.4, 3.15).
EAGER = (Assignor("eager", 0, 0),)
COMPATIBLE = (Assignor("incremental_cooperative", 1, 1, version=1), Assignor("eager", 0, 0))
SESSIONED = (Assignor("incremental_cooperative", 1, 2, version=2), Assignor("eager", 0, 0))

_TASK = re.compile(r"^(?P<connector>.+)-(?P<task>\d+)$")


def rs(*names: str) -> ResourceSet:
    """A resource set from display names: `A` is a connector, `A-0` is task 0 of A."""
    connectors: list[str] = []
    tasks: list[TaskId] = []
    for name in names:
        match = _TASK.match(name)
        if match:
            tasks.append(TaskId(match["connector"], int(match["task"])))
        else:
            connectors.append(name)
    return ResourceSet.of(connectors, tasks)


def names(resources: ResourceSet | None) -> list[str]:
    """Display names, sorted (connectors first): handy in assertion messages."""
    return [] if resources is None else list(resources.names())


class ReplayFailed(AssertionError):
    """Applying a handler's records raised: the core produced records that break an invariant."""


class GroupHarness:
    """One group, a fake clock and a fake timer wheel around the core's pure handlers.

    Attributes:
        state: the group's state, None until a call creates the group.
        now_ms: the fake clock.
        timers: armed timers, key -> (deadline, sequence number of the schedule).
        records_of_last_call: the records the last call (or the timers of the last sleep) made.
        log: every record applied so far, in order (a group can be rebuilt from it).
    """

    def __init__(
        self, group_id: str = GROUP, defaults: GroupConfigDefaults = DEFAULTS, now_ms: int = 0
    ) -> None:
        self.group_id = group_id
        self.defaults = defaults
        self.now_ms = now_ms
        self.state: GroupState | None = None
        #: What the last DeleteGroup kept (a group created afterwards continues it).
        self.tombstone: Tombstone | None = None
        self.timers: dict[TimerKey, tuple[int, int]] = {}
        self.records_of_last_call: list[Record] = []
        self.log: list[Record] = []
        self.fired: list[TimerKey] = []
        self._seq = 0
        self.last_prepare: PrepareResponse | None = None

    # --- plumbing ---

    def _run(self, handler: Callable[[GroupState | None], Result[R]]) -> R:
        before = self.dump()
        with continuing(self.tombstone if self.state is None else None):
            result = handler(self.state)
        assert self.dump() == before, "a handler changed the state it was given"
        self.records_of_last_call = list(result.records)
        self._apply(result)
        return result.response

    def _apply(self, result: Result[Any]) -> None:
        try:
            deleted = result.records[-1] if result.records else None
            if isinstance(deleted, GroupDeletedRecord):  # as the runtime: the state goes
                self.state, self.tombstone = None, deleted.tombstone
                self.timers.clear()
                self.log = []  # what a takeover would load: only what follows
                return
            if result.records:
                if self.state is None:
                    self.state = replay.new_state(result.records)
                else:
                    for record in result.records:
                        replay.apply(self.state, record)
        except AssertionError as error:
            raise ReplayFailed(f"replay raised {error!r} on {result.records!r}") from error
        self.log.extend(result.records)
        for op in result.timers:
            if isinstance(op, ScheduleTimer):
                if op.unless_armed and op.key in self.timers:
                    continue
                self._seq += 1
                self.timers[op.key] = (op.deadline_ms, self._seq)
            elif isinstance(op, CancelTimer):
                self.timers.pop(op.key, None)

    # --- the handlers ---

    def heartbeat(
        self,
        member_id: str,
        member_epoch: int,
        *,
        owned: ResourceSet | None = None,
        instance_id: str | None = None,
        rebalance_timeout_ms: int | None = None,
        assignors: tuple[Assignor, ...] | None = None,
        server_assignor: str | None = None,
        url: str | None = None,
        group_id: str | None = None,
    ) -> HeartbeatResponse:
        """A heartbeat with exactly the given fields (None = absent)."""
        return self.send(
            HeartbeatRequest(
                group_id=self.group_id if group_id is None else group_id,
                member_id=member_id,
                member_epoch=member_epoch,
                instance_id=instance_id,
                rebalance_timeout_ms=rebalance_timeout_ms,
                server_assignor=server_assignor,
                client_assignors=assignors,
                owned=owned,
                url=url,
            )
        )

    def send(self, req: HeartbeatRequest) -> HeartbeatResponse:
        return self._run(lambda s: heartbeat(s, req, self.now_ms, self.defaults))

    def join(
        self,
        member_id: str,
        *,
        assignors: tuple[Assignor, ...] = SESSIONED,
        owned: ResourceSet | None = EMPTY,
        instance_id: str | None = None,
        rebalance_timeout_ms: int = REBALANCE_MS,
        url: str | None = None,
    ) -> HeartbeatResponse:
        """An epoch-0 heartbeat with every field a joining agent sets."""
        return self.heartbeat(
            member_id,
            0,
            owned=owned,
            instance_id=instance_id,
            rebalance_timeout_ms=rebalance_timeout_ms,
            assignors=assignors,
            url=url,
        )

    def ack(self, member_id: str) -> HeartbeatResponse:
        """A heartbeat at the member's epoch reporting exactly what it was told to run."""
        m = self.member(member_id)
        return self.heartbeat(member_id, m.member_epoch, owned=m.assigned)

    def leave(self, member_id: str, *, instance_id: str | None = None) -> HeartbeatResponse:
        epoch = -1 if instance_id is None else -2
        return self.heartbeat(member_id, epoch, instance_id=instance_id)

    def prepare(self, member_id: str, member_epoch: int | None = None) -> PrepareResponse:
        epoch = self.member(member_id).member_epoch if member_epoch is None else member_epoch
        req = PrepareRequest(self.group_id, member_id, epoch)
        response = self._run(lambda s: prepare_assignment(s, req, self.now_ms, self.defaults))
        if response.error_code == ErrorCode.NONE:
            self.last_prepare = response
        return response

    def install(
        self,
        member_id: str,
        targets: Mapping[str, ResourceSet],
        *,
        group_epoch: int | None = None,
        member_epoch: int | None = None,
        delay_ms: int = 0,
        lost_work_delay_ms: int = 0,
        next_wave_delay_ms: int = 0,
        assignor_state: bytes = b"",
        error: int = 0,
        error_message: str = "",
        metadata: Mapping[str, tuple[int, bytes]] | None = None,
    ) -> InstallResponse:
        """Install `targets`; the group epoch defaults to the one the last Prepare returned."""
        if group_epoch is None:
            assert self.last_prepare is not None, "install without a prepare"
            group_epoch = self.last_prepare.group_epoch
        epoch = self.member(member_id).member_epoch if member_epoch is None else member_epoch
        meta = metadata or {}
        req = InstallRequest(
            group_id=self.group_id,
            member_id=member_id,
            member_epoch=epoch,
            group_epoch=group_epoch,
            error=error,
            error_message=error_message,
            members=tuple(
                MemberTarget(mid, resources, *meta.get(mid, (0, b"")))
                for mid, resources in targets.items()
            ),
            assignor_state=assignor_state,
            scheduled_rebalance_delay_ms=delay_ms,
            lost_work_delay_ms=lost_work_delay_ms,
            next_wave_delay_ms=next_wave_delay_ms,
        )
        # As the servicer does: planned before the lock, applied under it if still current.
        return self._run(
            lambda s: install_assignment(s, req, self.now_ms, self.defaults, plan_install(s, req))
        )

    def compute(
        self, member_id: str, targets: Mapping[str, ResourceSet], **install_args: Any
    ) -> PrepareResponse:
        """A scripted assignor: Prepare, then install `targets`; both must succeed."""
        prepared = self.prepare(member_id)
        assert prepared.error_code == ErrorCode.NONE, prepared
        installed = self.install(member_id, targets, **install_args)
        assert installed.error_code == ErrorCode.NONE, installed
        return prepared

    def put_connector(
        self, name: str, task_count: int, config: Mapping[str, str] | None = None
    ) -> PutConnectorResponse:
        req = PutConnectorRequest(self.group_id, name, task_count, dict(config or {}), "test")
        return self._run(lambda s: put_connector(s, req, self.now_ms, self.defaults))

    def delete_connector(self, name: str) -> DeleteConnectorResponse:
        req = DeleteConnectorRequest(self.group_id, name, "test")
        return self._run(lambda s: delete_connector(s, req, self.now_ms, self.defaults))

    def set_target_state(self, name: str, target: TargetState) -> TargetStateResponse:
        """Pause-, Resume- or StopConnector (DESIGN 3.20)."""
        req = TargetStateRequest(self.group_id, name, target, "test")
        return self._run(lambda s: set_target_state(s, req, self.now_ms, self.defaults))

    def restart(
        self,
        name: str,
        task: int | None = None,
        include_tasks: bool = False,
        only_failed: bool = False,
    ) -> RestartResponse:
        """RestartConnector (DESIGN 3.20)."""
        req = RestartRequest(self.group_id, name, task, include_tasks, only_failed, "test")
        return self._run(lambda s: restart_connector(s, req, self.now_ms, self.defaults))

    def delete_group(self, with_catalogue: bool = False) -> DeleteGroupResponse:
        """DeleteGroup (DESIGN 3.20); on success the state goes, the tombstone stays."""
        req = DeleteGroupRequest(self.group_id, with_catalogue, "test")
        return self._run(lambda s: delete_group(s, req, self.now_ms, self.defaults))

    def remove_member(
        self, member_id: str = "", instance_id: str = "", reason: str = ""
    ) -> RemoveMemberResponse:
        """RemoveMember (DESIGN 3.20)."""
        req = RemoveMemberRequest(self.group_id, member_id, instance_id, reason, "test")
        return self._run(lambda s: remove_member(s, req, self.now_ms, self.defaults))

    def alter_configs(
        self, set: Mapping[str, str] | None = None, unset: Iterable[str] = ()
    ) -> AlterConfigsResponse:
        req = AlterConfigsRequest(self.group_id, dict(set or {}), tuple(unset), "test")
        return self._run(lambda s: alter_configs(s, req, self.now_ms, self.defaults))

    def configs(
        self,
        member_id: str,
        member_epoch: int | None = None,
        known: Mapping[str, str] | None = None,
    ) -> ConfigsResponse:
        """ConnectGroupConfigs at the member's epoch (unless given)."""
        epoch = self.member(member_id).member_epoch if member_epoch is None else member_epoch
        req = ConfigsRequest(self.group_id, member_id, epoch, dict(known or {}))
        return self._run(lambda s: configs(s, req, self.now_ms, self.defaults))

    def report(
        self, member_id: str, *entries: StatusEntry, member_epoch: int | None = None
    ) -> ReportStatusResponse:
        """ConnectGroupReportStatus at the member's epoch (unless given)."""
        epoch = self.member(member_id).member_epoch if member_epoch is None else member_epoch
        req = ReportStatusRequest(self.group_id, member_id, epoch, tuple(entries))
        return self._run(lambda s: report_status(s, req, self.now_ms, self.defaults))

    def keepalive(self, member_id: str) -> HeartbeatResponse:
        """A heartbeat with only the member's epoch: liveness, never an acknowledgement."""
        return self.heartbeat(member_id, self.member(member_id).member_epoch)

    # --- time ---

    def run_for(self, ms: int, *member_ids: str, step_ms: int = INTERVAL_MS) -> None:
        """Advance the clock by `ms` in steps of `step_ms`; after each step every named member
        that is still in the group sends a keepalive (so only other members' sessions expire)."""
        end = self.now_ms + ms
        while self.now_ms < end:
            self.sleep(min(step_ms, end - self.now_ms))
            for member_id in member_ids:
                if self.has_member(member_id):
                    self.keepalive(member_id)

    def sleep(self, ms: int) -> None:
        """Advance the clock by `ms`, firing due timers in deadline order (ties: schedule order)."""
        until = self.now_ms + ms
        fired: list[Record] = []
        while True:
            due = [(d, seq, key) for key, (d, seq) in self.timers.items() if d <= until]
            if not due:
                break
            deadline, _, key = min(due)
            del self.timers[key]
            self.now_ms = max(self.now_ms, deadline)
            self.fire(key)
            fired.extend(self.records_of_last_call)
        self.now_ms = until
        self.records_of_last_call = fired

    def fire(self, key: TimerKey) -> None:
        """Run the timer `key` now, whether or not it is armed (stale timers must do nothing)."""
        self.fired.append(key)
        if self.state is None:
            self.records_of_last_call = []
            return
        state = self.state
        self._run(lambda _s: on_timer(state, key, self.now_ms, self.defaults))

    def next_deadline(self) -> int | None:
        return min((d for d, _ in self.timers.values()), default=None)

    def deadline(self, key: TimerKey) -> int | None:
        armed = self.timers.get(key)
        return None if armed is None else armed[0]

    # --- reads ---

    def member(self, member_id: str) -> Member:
        assert self.state is not None, "no group"
        assert member_id in self.state.members, f"{member_id} is not a member"
        return self.state.members[member_id]

    def has_member(self, member_id: str) -> bool:
        return self.state is not None and member_id in self.state.members

    @property
    def group_epoch(self) -> int:
        assert self.state is not None
        return self.state.group_epoch

    @property
    def assignment_epoch(self) -> int:
        assert self.state is not None
        return self.state.assignment_epoch

    def status(self) -> GroupStatus:
        assert self.state is not None
        return self.state.status()

    def target_of(self, member_id: str) -> ResourceSet:
        assert self.state is not None
        return self.state.target.of(member_id).resources

    def events_of_last_call(self) -> list[EventType]:
        return [r.event_type for r in self.records_of_last_call if isinstance(r, EventRecord)]

    def last_events(self, event_type: EventType) -> list[EventRecord]:
        """The events of `event_type` the last call recorded."""
        return [
            r
            for r in self.records_of_last_call
            if isinstance(r, EventRecord) and r.event_type is event_type
        ]

    def logged_events(self, event_type: EventType) -> list[EventRecord]:
        """Every event of `event_type` recorded so far."""
        return [r for r in self.log if isinstance(r, EventRecord) and r.event_type is event_type]

    def state_records_of_last_call(self) -> list[Record]:
        return [r for r in self.records_of_last_call if not isinstance(r, EventRecord)]

    def dump(self) -> dict[str, Any]:
        """Everything in the group's state, as plain comparable values."""
        s = self.state
        if s is None:
            return {}
        return {
            "meta": s.meta,
            "target": (
                s.target.assignment_epoch,
                dict(s.target.members),
                s.target.assignor_state,
                s.target.scheduled_rebalance_at_ms,
                s.target.lost_work_rebalance_at_ms,
                s.target.next_wave_at_ms,
            ),
            "members": dict(s.members),
            "catalogue": {
                name: (c.task_count, dict(c.config), c.target_state)
                for name, c in s.catalogue.items()
            },
            "configs": dict(s.configs),
            "connector_owner": dict(s.connector_owner),
            "task_owner": dict(s.task_owner),
            "instance_owner": dict(s.instance_owner),
            "statuses": {c: dict(by_task) for c, by_task in s.statuses.items()},
            "status_counts": {k: v for k, v in s.status_counts.items() if v},
            "exhausted": s.exhausted,
        }

    def rebuilt(self) -> dict[str, Any]:
        """The dump of a group rebuilt from every record so far (what a takeover loads)."""
        if not self.log:
            return {}
        shadow = GroupHarness(self.group_id, self.defaults)
        shadow.state = replay.new_state(self.log)
        return shadow.dump()


# --- scenarios shared by the test modules ---------------------------------------------------

ALL = rs("A", "A-0", "A-1", "B", "B-0")
W1_SHARE = rs("A", "A-0", "A-1")
W2_SHARE = rs("B", "B-0")


def catalogue_group() -> GroupHarness:
    """Connectors A (2 tasks) and B (1 task), no members: group and assignment epoch 3."""
    h = GroupHarness()
    h.put_connector("A", 2)
    h.put_connector("B", 1)
    assert (h.group_epoch, h.assignment_epoch) == (3, 3)
    return h


def stable_group() -> GroupHarness:
    """w1 runs A, A-0, A-1 and w2 runs B, B-0, both STABLE at epoch 5; w1 is the assignor."""
    h = catalogue_group()
    h.join("w1")
    h.join("w2")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE})
    h.ack("w1")
    h.ack("w2")
    assert h.status() is GroupStatus.STABLE
    assert (h.group_epoch, h.assignment_epoch) == (5, 5)
    assert h.member("w1").assigned == W1_SHARE
    assert h.member("w2").assigned == W2_SHARE
    return h


def ok(response: Any) -> None:
    """Assert a response carries no error (COMPUTE_ASSIGNMENT is a signal, not an error)."""
    assert response.error_code in (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT), response
