"""A port of Kafka Connect's `EagerAssignor` (connect/runtime/.../distributed/EagerAssignor.java,
`performTaskAssignment`), the leader's assignor under the `default` protocol (version 0).

Under the eager protocol every worker stops all its connectors and tasks before it rejoins
(Connect's `WorkerCoordinator.onJoinPrepare` revokes everything), so the leader assigns the whole
catalogue from scratch each generation, ignoring what members report running: connectors first,
sorted by name, then every connector's tasks (connectors in the same order, tasks by number),
dealt round-robin over the members sorted by id, with one rotation shared by connectors and tasks
(the class comment explains why connectors go first: with many one-task connectors, dealing a
connector and its task together would leave some workers only connectors). Each member's answer
is its whole set (`assignment`), with no `revoked` and no delay.

Pure: no I/O, no clock, no state between rounds.
"""

from __future__ import annotations

from collections.abc import Mapping
from itertools import cycle

from connect_protocol.resources import ResourceSet, TaskId

from .values import CONNECT_PROTOCOL_V0, NO_ERROR, Catalogue, WorkerAssignment, WorkerState

__all__ = ["eager_assignment"]


def eager_assignment(
    leader_id: str, members: Mapping[str, WorkerState], catalogue: Catalogue
) -> dict[str, WorkerAssignment]:
    """Every member's assignment for one eager generation.

    Args:
        leader_id: the generation's leader (a key of `members`).
        members: every member of the generation, by member id.
        catalogue: connector name -> task count.

    Raises:
        ValueError: the leader is not a member.
    """
    if leader_id not in members:
        raise ValueError(f"the leader {leader_id!r} is not a member of the generation")
    order = sorted(members)
    connectors: dict[str, list[str]] = {m: [] for m in order}
    tasks: dict[str, list[TaskId]] = {m: [] for m in order}
    dealer = cycle(order)  # Connect's CircularIterator, shared by connectors and tasks
    names = sorted(catalogue)
    for name, member in zip(names, dealer, strict=False):
        connectors[member].append(name)
    for task, member in zip(
        (TaskId(name, n) for name in names for n in range(catalogue[name])), dealer, strict=False
    ):
        tasks[member].append(task)
    leader_url = members[leader_id].url
    return {
        m: WorkerAssignment(
            version=CONNECT_PROTOCOL_V0,
            error=NO_ERROR,
            leader=leader_id,
            leader_url=leader_url,
            assignment=ResourceSet.of(connectors[m], tasks[m]),
        )
        for m in order
    }
