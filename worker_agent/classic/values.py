"""What a classic group's leader sees and answers (DESIGN 3.19, "Connect today"), as plain values.

Connect's leader reads each member's `ExtendedWorkerState` (its REST url and the connectors and
tasks it runs, from `IncrementalCooperativeConnectProtocol.deserializeMetadata`) and answers
each member an `ExtendedAssignment` (connect/runtime/.../distributed/ExtendedWorkerState.java and
ExtendedAssignment.java in apache/kafka). This module owns those two shapes, the catalogue the
leader assigns from (connector name -> task count, as the coordinator shows the leader in its
JoinGroup answer), and Connect's protocol and error constants. No I/O, no protobuf: the ports in
`eager` and `incremental` take and return these values only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from connect_protocol.resources import EMPTY, ResourceSet, TaskId

__all__ = [
    "CONFIG_MISMATCH",
    "CONNECT_PROTOCOL_V0",
    "CONNECT_PROTOCOL_V1",
    "CONNECT_PROTOCOL_V2",
    "DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS",
    "NO_ERROR",
    "Catalogue",
    "WorkerAssignment",
    "WorkerState",
    "configured_resources",
    "union",
]

#: Embedded protocol versions (Connect's `ConnectProtocol.CONNECT_PROTOCOL_V0` for `default`,
#: `IncrementalCooperativeConnectProtocol.CONNECT_PROTOCOL_V1` / `_V2` for `compatible` /
#: `sessioned`). V1 and V2 differ only on the wire (V2 adds request signing), so the
#: incremental cooperative assignor behaves identically for both and only echoes the version.
CONNECT_PROTOCOL_V0 = 0
CONNECT_PROTOCOL_V1 = 1
CONNECT_PROTOCOL_V2 = 2

#: `ConnectProtocol.Assignment.NO_ERROR` / `CONFIG_MISMATCH`. The leader here always has the
#: catalogue (the coordinator gives it), so the ports only answer NO_ERROR.
NO_ERROR = 0
CONFIG_MISMATCH = 1

#: `DistributedConfig.SCHEDULED_REBALANCE_MAX_DELAY_MS_DEFAULT`: five minutes.
DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS = 300_000

#: Connector name -> number of tasks (tasks are numbered from 0).
Catalogue = Mapping[str, int]


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One member as the leader sees it (Connect's `ExtendedWorkerState`).

    Attributes:
        url: the worker's REST url; the leader's own is sent to everyone as `leader_url`.
        allocation: the connectors and tasks the worker runs now (Connect's
            `ExtendedWorkerState.assignment()`); empty for a new worker and under protocol V0.
        config_offset: Connect's config topic offset; carries no meaning here.
    """

    url: str
    allocation: ResourceSet = EMPTY
    config_offset: int = 0


@dataclass(frozen=True, slots=True)
class WorkerAssignment:
    """One member's answer for one generation (Connect's `ExtendedAssignment`).

    Attributes:
        version: the embedded protocol version (0 eager, 1 compatible, 2 sessioned).
        error: NO_ERROR (or CONFIG_MISMATCH, which these ports never produce).
        leader, leader_url: the generation's leader and its REST url.
        assignment: version 0: the whole set to run; versions 1-2: what is newly given (to
            start, on top of what the worker keeps).
        revoked: versions 1-2: what to stop; None under version 0 (absent on the wire).
        delay: versions 1-2: the leader's scheduled rebalance delay in ms (0: none); the worker
            rejoins when it ends.
        config_offset: always 0 here.
    """

    version: int
    error: int
    leader: str
    leader_url: str
    assignment: ResourceSet = EMPTY
    revoked: ResourceSet | None = None
    delay: int = 0
    config_offset: int = 0


def configured_resources(catalogue: Catalogue) -> ResourceSet:
    """Every connector of the catalogue and its tasks 0..n-1 (Connect reads the same from its
    `ClusterConfigState`: `connectors()` and `tasks(connector)`)."""
    return ResourceSet(
        frozenset(catalogue),
        frozenset(TaskId(name, n) for name, count in catalogue.items() for n in range(count)),
    )


def union(sets: Iterable[ResourceSet]) -> ResourceSet:
    """All resources of `sets`."""
    connectors: set[str] = set()
    tasks: set[TaskId] = set()
    for s in sets:
        connectors |= s.connectors
        tasks |= s.tasks
    return ResourceSet(frozenset(connectors), frozenset(tasks))
