"""The classic group leader's turn (DESIGN 3.19, "Connect today"): from the leader's JoinGroup
answer to the assignments of its SyncGroup, as Connect's `WorkerCoordinator.onLeaderElected`
does: the `default` protocol (version 0) runs `EagerAssignor`, `compatible` and `sessioned`
(versions 1 and 2) run `IncrementalCooperativeAssignor`, whose between-rounds memory lives here
for as long as the worker runs (Connect's assignor object). Pure: the caller passes the time.

What the coordinator adds to Kafka's JoinGroup answer, and how it is used:

- `group_configs["scheduled.rebalance.max.delay.ms"]` is preferred over the worker's own
  configuration (Connect reads it from the worker's config; here the group holds it).
- `coordinator_time_ms` is the clock the incremental assignor measures its delay on (DESIGN
  section 2.1: the assignor measures deadlines on the coordinator's clock); absent (0), the
  caller's clock.
- `withheld` (resources under a hold, DESIGN 3.13/3.19) is treated as absent from the catalogue:
  a connector withheld whole (with all its tasks) is left out of the catalogue the ports see;
  any other withheld resource is removed from the answers and from the incremental leader's
  memory, so that the port takes it as new work when the hold ends (DESIGN 3.19: "a faithful
  Connect assignor sees them as new when they return").
"""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.classic_messages import (
    JoinGroupResponse,
    SyncGroupAssignment,
    protocol_version,
)
from connect_protocol.resources import ResourceSet, TaskId

from .eager import eager_assignment
from .incremental import IncrementalCooperativeAssignor
from .messages import catalogue_of, sync_assignments, worker_states
from .values import (
    CONNECT_PROTOCOL_V0,
    DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
    Catalogue,
    WorkerAssignment,
)

__all__ = ["MAX_DELAY_CONFIG", "ClassicLeader"]

#: The group configuration the coordinator hands a classic leader (DESIGN 3.19).
MAX_DELAY_CONFIG = "scheduled.rebalance.max.delay.ms"


def _whole_connectors_withheld(catalogue: Catalogue, withheld: ResourceSet) -> set[str]:
    """Connectors withheld with every one of their tasks."""
    return {
        name
        for name, count in catalogue.items()
        if name in withheld.connectors
        and all(TaskId(name, n) in withheld.tasks for n in range(count))
    }


class ClassicLeader:
    """The leader side of one worker (Connect's `onLeaderElected`), holding the incremental
    assignor's memory between the rounds this worker leads.

    Attributes:
        incremental: Connect's `IncrementalCooperativeAssignor` port with its leader memory.
        default_max_delay_ms: `scheduled.rebalance.max.delay.ms` used when the JoinGroup answer
            does not carry the group's value.
    """

    def __init__(self, max_delay_ms: int = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS) -> None:
        self.default_max_delay_ms = max_delay_ms
        self.incremental = IncrementalCooperativeAssignor(max_delay_ms)

    def max_delay_of(self, join: JoinGroupResponse) -> int:
        """The group's `scheduled.rebalance.max.delay.ms` if the answer carries a valid one,
        else the worker's own."""
        raw = join.group_configs.get(MAX_DELAY_CONFIG)
        try:
            value = int(raw) if raw is not None else -1
        except ValueError:
            value = -1
        return value if value >= 0 else self.default_max_delay_ms

    def assign(
        self, join: JoinGroupResponse, *, last_completed_generation: int, now_ms: int
    ) -> tuple[SyncGroupAssignment, ...]:
        """Every member's assignment for the generation `join` (the leader's JoinGroup answer)
        starts.

        Args:
            join: the leader's JoinGroup answer (members with their metadata, catalogue,
                withheld resources, group configurations, coordinator time).
            last_completed_generation: the last generation this worker completed (Connect's
                `WorkerCoordinator.lastCompletedGenerationId`, KAFKA-9848's check).
            now_ms: the caller's clock, used when the answer carries no coordinator time.

        Raises:
            ValueError: the protocol is not one of Connect's, or the leader is not a member.
        """
        version = protocol_version(join.protocol_name)
        if version is None:
            raise ValueError(f"unknown Connect protocol {join.protocol_name!r}")
        members = worker_states(join.members)
        full = catalogue_of(join.catalogue)
        whole = _whole_connectors_withheld(full, join.withheld)
        catalogue = {name: count for name, count in full.items() if name not in whole}
        partly = join.withheld - ResourceSet.of(
            whole, [TaskId(name, n) for name in whole for n in range(full[name])]
        )
        answers: dict[str, WorkerAssignment]
        if version == CONNECT_PROTOCOL_V0:
            answers = eager_assignment(join.leader, members, catalogue)
        else:
            self.incremental.max_delay_ms = self.max_delay_of(join)
            answers = self.incremental.perform_assignment(
                join.leader,
                members,
                catalogue,
                generation=join.generation_id,
                last_completed_generation=last_completed_generation,
                now_ms=join.coordinator_time_ms or now_ms,
                version=version,
            )
        if partly:
            answers = {m: replace(a, assignment=a.assignment - partly) for m, a in answers.items()}
            memory = self.incremental.memory
            if memory.previous_assignment & partly:
                self.incremental.memory = replace(
                    memory, previous_assignment=memory.previous_assignment - partly
                )
        return sync_assignments(answers)
