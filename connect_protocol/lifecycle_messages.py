"""The connector lifecycle's member calls (DESIGN 3.20) as plain values: ConnectGroupConfigs
(the configs, target states and restart counts of what a member holds) and
ConnectGroupReportStatus (the states its holder reports). Shared by the coordinator and the
agent; `lifecycle_wire` converts them to and from protobuf."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from .errors import ErrorCode
from .tokens import Resource


class TargetState(StrEnum):
    """What a connector and its tasks should do (KIP-875)."""

    STARTED = "STARTED"
    PAUSED = "PAUSED"
    STOPPED = "STOPPED"


class ReportedState(StrEnum):
    """The states a holder may report (UNASSIGNED and RESTARTING are the coordinator's)."""

    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"  # connectors only


def _empty() -> Mapping[str, str]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class ConfigsRequest:
    group_id: str
    member_id: str
    member_epoch: int
    #: connector -> the config digest the caller has (answered without values if unchanged).
    known_digests: Mapping[str, str] = field(default_factory=_empty)


@dataclass(frozen=True, slots=True)
class HeldConnector:
    """One connector the member holds (its connector or any of its tasks)."""

    connector: str
    config_digest: str
    #: None: the caller has this digest already (it sent it in `known_digests`).
    config: Mapping[str, str] | None
    target_state: TargetState = TargetState.STARTED


@dataclass(frozen=True, slots=True)
class ConfigsResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    lifecycle_revision: int = 0
    connectors: tuple[HeldConnector, ...] = ()
    #: The restart counts above 0 of the resources it holds.
    restart_counts: Mapping[Resource, int] = field(default_factory=lambda: MappingProxyType({}))
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class StatusEntry:
    resource: Resource
    token: int
    state: ReportedState
    trace: str = ""


@dataclass(frozen=True, slots=True)
class ReportStatusRequest:
    group_id: str
    member_id: str
    member_epoch: int
    entries: tuple[StatusEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class EntryResult:
    resource: Resource
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""


@dataclass(frozen=True, slots=True)
class ReportStatusResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    lifecycle_revision: int = 0
    results: tuple[EntryResult, ...] = ()
    throttle_time_ms: int = 0


# --- the operator's calls (ConnectGroupAdmin): target states and restarts -----------------------


@dataclass(frozen=True, slots=True)
class TargetStateRequest:
    """PauseConnector, ResumeConnector or StopConnector: `target` says which."""

    group_id: str
    connector: str
    target: TargetState
    caller: str = ""


@dataclass(frozen=True, slots=True)
class TargetStateResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    group_epoch: int = 0
    previous_target_state: TargetState = TargetState.STARTED
    changed: bool = False
    rebalance_triggered: bool = False
    holders_told: int = 0


@dataclass(frozen=True, slots=True)
class RestartRequest:
    """RestartConnector (Connect's RestartRequest, KIP-745): the connector and, with
    `include_tasks`, its tasks, or the one `task`; `only_failed` skips what is not FAILED."""

    group_id: str
    connector: str
    task: int | None = None
    include_tasks: bool = False
    only_failed: bool = False
    caller: str = ""


@dataclass(frozen=True, slots=True)
class PlannedRestart:
    """One resource a restart selected, its restart count after it, and its holder ("": none)."""

    resource: Resource
    restart_count: int
    worker_id: str = ""


@dataclass(frozen=True, slots=True)
class RestartResponse:
    error_code: ErrorCode = ErrorCode.NONE
    error_message: str = ""
    restarts: tuple[PlannedRestart, ...] = ()
    group_epoch: int = 0
