"""The Eager assignor: Kafka Connect's original round-robin (protocol version 0, DESIGN 3.15).

Linear: one sort of the connector names, then every member's share is a stride of the dealt
sequence.
"""

from __future__ import annotations

from connect_protocol.resources import ResourceSet, TaskId

from ..assignor import AssignmentResult, ConnectAssignor, GroupView

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
        names = sorted(group.catalogue)
        tasks = [TaskId(name, task) for name in names for task in range(group.catalogue[name])]
        # The rotation deals item k to member k mod n: connectors are items 0.., the tasks follow.
        n, offset = len(member_ids), len(names)
        return AssignmentResult(
            members={
                m: ResourceSet(frozenset(names[i::n]), frozenset(tasks[(i - offset) % n :: n]))
                for i, m in enumerate(member_ids)
            }
        )
