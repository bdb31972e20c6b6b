"""The client-side assignor interface (seed 000's `ConnectAssignor`), pure and pluggable.

The coordinator chooses one member to compute each new target (DESIGN 3.4). That member's agent
asks PrepareAssignment for a `GroupView` (everything the assignor needs, including the opaque
state the previous install stored, 3.5), calls `assign`, and installs the `AssignmentResult`.
An assignor keeps no memory between rounds: anything it must remember goes into
`AssignmentResult.assignor_state`, since the next round may run on another member.

Implement `ConnectAssignor` to plug in your own; `worker_agent.assignors` holds the built-in
`eager` and `incremental_cooperative` ones.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field

from connect_protocol.configs import SCHEDULED_REBALANCE_MAX_DELAY_MS, config_int
from connect_protocol.resources import EMPTY, ResourceSet, TaskId

__all__ = [
    "SCHEDULED_REBALANCE_MAX_DELAY_MS",
    "AssignmentResult",
    "AssignorMetadata",
    "ConnectAssignor",
    "GroupView",
    "MemberView",
    "ResourceSet",
    "TaskId",
]


@dataclass(frozen=True, slots=True)
class AssignorMetadata:
    """What a member advertises for one assignor on join (seed: `ConnectAssignor.Metadata`)."""

    reason: int = 0
    version: int = 0
    metadata: bytes = b""


@dataclass(frozen=True, slots=True)
class MemberView:
    """One member as the assignor sees it (seed: `ConnectAssignor.GroupMember`).

    `owned` is what the member runs now plus whatever it was told to revoke and has not yet
    acknowledged: the coordinator's current assignment of it, not the target.
    `last_grant_at_ms`: when (coordinator time) it was last given a resource it did not hold
    (0: never); a paced plan measures the pause between waves from it."""

    member_id: str
    instance_id: str | None = None
    url: str = ""
    member_epoch: int = 0
    reason: int = 0
    version: int = 0
    metadata: bytes = b""
    owned: ResourceSet = EMPTY
    last_grant_at_ms: int = 0


@dataclass(frozen=True, slots=True)
class GroupView:
    """The group as of `group_epoch` (a PrepareAssignment answer, decoded).

    Times are on the coordinator's clock (`coordinator_time_ms`); never compare them with the
    local clock."""

    group_epoch: int
    assignor_name: str
    assignor_version: int
    members: tuple[MemberView, ...]
    catalogue: Mapping[str, int]  # connector -> task count
    assignment_epoch: int = 0
    target: Mapping[str, ResourceSet] = field(default_factory=dict)  # member -> its target share
    assignor_state: bytes = b""
    configs: Mapping[str, str] = field(default_factory=dict)
    coordinator_time_ms: int = 0
    scheduled_rebalance_at_ms: int | None = None

    def all_resources(self) -> ResourceSet:
        """Every connector and task of the catalogue."""
        return ResourceSet.of(
            self.catalogue,
            (TaskId(name, task) for name, count in self.catalogue.items() for task in range(count)),
        )

    def config_int(self, name: str, default: int) -> int:
        """A group configuration as an integer (milliseconds), or `default` if absent/invalid."""
        return config_int(self.configs, name, default)


@dataclass(frozen=True, slots=True)
class AssignmentResult:
    """What `assign` returns (seed: `ConnectAssignor.Assignment`), installed as one target.

    `members` holds a full share per member (members left out get nothing). With
    `scheduled_rebalance_delay_ms > 0` some catalogue resources may be left unassigned: the
    coordinator bumps the group epoch when the delay (relative to the install) has passed
    (DESIGN 3.6, 3.7). A non-zero `error` reports that computing failed; the coordinator keeps
    the previous target and asks again later (3.10)."""

    members: Mapping[str, ResourceSet] = field(default_factory=dict)
    assignor_state: bytes = b""
    scheduled_rebalance_delay_ms: int = 0
    error: int = 0
    error_message: str = ""
    #: What the delay stands for (DESIGN 3.18), shown by `describe`: held-back lost work and
    #: the next wave of a paced plan (0: none); the delay is the smaller of those set.
    lost_work_delay_ms: int = 0
    next_wave_delay_ms: int = 0


class ConnectAssignor(abc.ABC):
    """A client-side assignor. Pure: no I/O and no clock (use `GroupView.coordinator_time_ms`)."""

    #: Unique name, as advertised in heartbeats and selected by the coordinator.
    name: str
    #: The metadata versions this implementation speaks.
    minimum_version: int
    maximum_version: int

    def metadata(self) -> AssignorMetadata:
        """What to advertise for this assignor when joining. Default: nothing, at the maximum
        version."""
        return AssignorMetadata(version=self.maximum_version)

    @abc.abstractmethod
    def assign(self, group: GroupView) -> AssignmentResult:
        """Compute the group's next target assignment from `group`."""

    def on_assignment(self, member_id: str, assignment: ResourceSet) -> None:  # noqa: B027
        """Called when this member receives a new assignment. Default: nothing."""
