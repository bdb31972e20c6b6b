"""What a handler returns: records to persist and replay, the response, and timer changes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

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
