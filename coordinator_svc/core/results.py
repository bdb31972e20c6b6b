"""What a handler returns: records to persist and replay, the response, and timer changes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from connect_protocol.errors import CoordinatorError, ErrorCode

from .records import Record

R = TypeVar("R")

SESSION = "session"
REVOCATION = "revocation"
ASSIGNOR = "assignor"
SCHEDULED_REBALANCE = "scheduled-rebalance"
HOLD = "hold"
#: A resource's pending automatic restart (DESIGN 3.20), keyed "<connector>\x00<task>" (task -1:
#: the connector itself); in groups of either type.
AUTO_RESTART = "auto-restart"
#: Classic groups (DESIGN 3.19; SESSION, REVOCATION and HOLD keep their kinds, with the classic
#: meaning in a classic group): the join phase's deadline (the initial delay's steps, then the
#: barrier at the largest member rebalance timeout), the sync deadline of a generation, and
#: the lapse of a MEMBER_ID_REQUIRED id (keyed by it).
CLASSIC_JOIN = "classic-join"
CLASSIC_SYNC = "classic-sync"
CLASSIC_PENDING = "classic-pending"
#: A classic-protocol member of a connect group (DESIGN 3.19): its SyncGroup after a JoinGroup,
#: or its JoinGroup after a heartbeat answered REBALANCE_IN_PROGRESS, must come by then.
CLASSIC_MEMBER_DEADLINE = "classic-member-deadline"

TimerKey = tuple[str, str]
"""(kind, member id or ""): e.g. ("session", "w1"), ("scheduled-rebalance", "")."""


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    key: TimerKey
    deadline_ms: int
    #: Arm only if the key is not armed already (a deadline that the first of several
    #: answers starts, DESIGN 3.19).
    unless_armed: bool = False


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: TimerKey


TimerOp = ScheduleTimer | CancelTimer

#: The kinds of call a classic member parks (DESIGN 3.19 "Long polls hold no thread").
WAKE_JOIN = "join"
WAKE_SYNC = "sync"


@dataclass(frozen=True, slots=True)
class Wakeup:
    """The answer to a parked call: the member's parked `kind` ("join" or "sync") call is
    answered `response`. Delivered only after the batch that made it is committed."""

    kind: str
    member_id: str
    response: Any


@dataclass(frozen=True, slots=True)
class Parked:
    """A handler's response that says "not yet": the caller waits for a `Wakeup` of the same
    kind and member (or the end of its park limit)."""

    kind: str
    member_id: str


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    """What a handler returns. `wakeups`: answers to other members' parked calls, delivered
    after the records are committed (never before, never when the commit fails)."""

    records: list[Record]
    response: R
    timers: list[TimerOp] = field(default_factory=list)
    wakeups: list[Wakeup] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        return bool(self.records)


def refused(answer: Callable[..., R], error: CoordinatorError, **fields: Any) -> Result[R]:
    """The one way a handler answers a refused request: nothing written, no timer changed, the
    response `answer(code, message, **fields)` carrying the error."""
    code: ErrorCode = error.code
    return Result([], answer(code, error.message, **fields))
