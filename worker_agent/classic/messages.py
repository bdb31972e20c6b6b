"""Between the classic protocol's values (`connect_protocol.classic_messages`) and the ports'
own shapes (`values`): what a leader's JoinGroup answer shows becomes the ports' inputs, and
their answers become the assignments of the leader's SyncGroup. Pure; no protobuf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from connect_protocol.classic_messages import (
    ConnectWorkerAssignment,
    JoinGroupMember,
    SyncGroupAssignment,
)
from connect_protocol.messages import ConnectorInfo
from connect_protocol.resources import EMPTY

from .values import Catalogue, WorkerAssignment, WorkerState

__all__ = ["catalogue_of", "sync_assignments", "worker_states"]


def worker_states(members: Iterable[JoinGroupMember]) -> dict[str, WorkerState]:
    """Each member's url and allocation, by member id; an absent allocation (version 0, or a
    cooperative worker's first join) is empty, as Connect's `ExtendedAssignment.empty()`."""
    return {
        m.member_id: WorkerState(
            url=m.metadata.url,
            allocation=m.metadata.allocation if m.metadata.allocation is not None else EMPTY,
            config_offset=m.metadata.config_offset,
        )
        for m in members
    }


def catalogue_of(connectors: Iterable[ConnectorInfo]) -> Catalogue:
    """Connector name -> task count, from the catalogue of the leader's JoinGroup answer."""
    return {c.name: c.task_count for c in connectors}


def sync_assignments(answers: Mapping[str, WorkerAssignment]) -> tuple[SyncGroupAssignment, ...]:
    """The leader's SyncGroup assignments, by member id."""
    return tuple(
        SyncGroupAssignment(
            member_id=member,
            assignment=ConnectWorkerAssignment(
                version=a.version,
                error=a.error,
                leader=a.leader,
                leader_url=a.leader_url,
                config_offset=a.config_offset,
                assignment=a.assignment,
                revoked=a.revoked,
                delay=a.delay,
            ),
        )
        for member, a in sorted(answers.items())
    )
