"""The agent's classic mode: ports of the leader-side assignors Kafka Connect workers run on
Kafka's classic group protocol (DESIGN 3.19, "Connect today").

- `values`: what the leader sees (`WorkerState`) and answers (`WorkerAssignment`), the
  catalogue, Connect's protocol and error constants.
- `eager`: Connect's `EagerAssignor` (protocol `default`, version 0).
- `incremental`: Connect's `IncrementalCooperativeAssignor` (`compatible` and `sessioned`,
  versions 1 and 2), with its between-rounds leader memory.
- `messages`: from the leader's JoinGroup answer to the ports' inputs, and from their answers to
  the leader's SyncGroup assignments (`connect_protocol.classic_messages`).
- `leader`: the leader's turn (Connect's `onLeaderElected`): the port of the generation's
  protocol, the group's max delay, withheld resources left out.
- `membership`: the worker's classic membership machine (Connect's `WorkerCoordinator`,
  `AbstractCoordinator`, `DistributedHerder`'s rebalance handling, DESIGN 3.13's self-fence).

Pure: no I/O, no clock (time is passed in), no protobuf.
"""

from __future__ import annotations

from .eager import eager_assignment
from .incremental import (
    ClusterAssignment,
    IncrementalCooperativeAssignor,
    LeaderMemory,
    assign_round,
)
from .leader import ClassicLeader
from .membership import (
    ClassicAction,
    ClassicConfig,
    ClassicMembership,
    ClassicPhase,
    SendClassicHeartbeat,
    SendJoinGroup,
    SendLeaveGroup,
    SendSyncGroup,
)
from .values import (
    CONNECT_PROTOCOL_V0,
    CONNECT_PROTOCOL_V1,
    CONNECT_PROTOCOL_V2,
    DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
    WorkerAssignment,
    WorkerState,
)

__all__ = [
    "CONNECT_PROTOCOL_V0",
    "CONNECT_PROTOCOL_V1",
    "CONNECT_PROTOCOL_V2",
    "DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS",
    "ClassicAction",
    "ClassicConfig",
    "ClassicLeader",
    "ClassicMembership",
    "ClassicPhase",
    "ClusterAssignment",
    "IncrementalCooperativeAssignor",
    "LeaderMemory",
    "SendClassicHeartbeat",
    "SendJoinGroup",
    "SendLeaveGroup",
    "SendSyncGroup",
    "WorkerAssignment",
    "WorkerState",
    "assign_round",
    "eager_assignment",
]
