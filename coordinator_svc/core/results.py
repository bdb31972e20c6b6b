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

TimerKey = tuple[str, str]
"""(kind, member id or ""): e.g. ("session", "w1"), ("scheduled-rebalance", "")."""


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    key: TimerKey
    deadline_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    key: TimerKey


TimerOp = ScheduleTimer | CancelTimer


@dataclass(frozen=True, slots=True)
class Result(Generic[R]):
    records: list[Record]
    response: R
    timers: list[TimerOp] = field(default_factory=list)

    @property
    def writes(self) -> bool:
        return bool(self.records)


def refused(answer: Callable[..., R], error: CoordinatorError, **fields: Any) -> Result[R]:
    """The one way a handler answers a refused request: nothing written, no timer changed, the
    response `answer(code, message, **fields)` carrying the error."""
    code: ErrorCode = error.code
    return Result([], answer(code, error.message, **fields))
