"""The Eager assignor: Kafka Connect's original round-robin (protocol version 0, DESIGN 3.15)."""

from __future__ import annotations

from itertools import cycle

from connect_protocol.resources import ResourceSet, TaskId
from worker_agent.assignor import AssignmentResult, ConnectAssignor, GroupView

__all__ = ["EagerAssignor"]


class EagerAssignor(ConnectAssignor):
    """`eager`, version 0: a fresh, non-sticky target each round.

    As Kafka Connect's leader does it: connectors in name order are dealt round-robin over the
    members in member-id order, then tasks in (connector, task number) order are dealt on by the
    same rotation, continuing where the connectors stopped. Every member gets an entry.
    """

    name = "eager"
    minimum_version = 0
    maximum_version = 0

    def assign(self, group: GroupView) -> AssignmentResult:
        member_ids = sorted({m.member_id for m in group.members})
        if not member_ids:
            return AssignmentResult(members={})
        connectors: dict[str, list[str]] = {m: [] for m in member_ids}
        tasks: dict[str, list[TaskId]] = {m: [] for m in member_ids}
        rotation = cycle(member_ids)
        for name in sorted(group.catalogue):
            connectors[next(rotation)].append(name)
        for name in sorted(group.catalogue):
            for task in range(group.catalogue[name]):
                tasks[next(rotation)].append(TaskId(name, task))
        return AssignmentResult(
            members={m: ResourceSet.of(connectors[m], tasks[m]) for m in member_ids}
        )
