"""Timer wiring: the keyed timers of the groups this process owns (`TimerService`), the timer
operations a committed request returns applied to them, and a timer that fires run as a request
of its group (Kafka's shape: timers produce records like any request, and a superseded timer does
nothing). A timer whose run could not be committed (the database did not answer) is armed again
shortly, as the state it would have changed was taken back."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from connect_protocol.errors import CoordinatorError, CoordinatorNotAvailable

from ..core.model import GroupConfigDefaults, GroupState
from ..core.results import CancelTimer, Result, ScheduleTimer, TimerKey, TimerOp
from ..core.timers import on_timer
from .owned_group import Handler, OwnedGroup
from .timer_service import TimerService

log = logging.getLogger("coordinator")

#: A timer whose run failed to commit is fired again after this long.
TIMER_RETRY_MS = 500

Execute = Callable[[str, Handler[Any]], Any]


class GroupTimers:
    """The timers of owned groups. `execute` runs a handler on a group (`GroupManager.execute`);
    `current` tells the group served now, if any."""

    def __init__(
        self,
        now_ms: Callable[[], int],
        defaults: GroupConfigDefaults,
        current: Callable[[str], OwnedGroup | None],
    ) -> None:
        self.now_ms = now_ms
        self.defaults = defaults
        self.current = current
        self.execute: Execute | None = None  # set once the commit side exists
        self.service = TimerService(now_ms, self.fire)

    def start(self) -> None:
        self.service.start()

    def stop(self) -> None:
        self.service.stop()

    def apply(self, group_id: str, ops: Iterable[TimerOp | ScheduleTimer]) -> None:
        for op in ops:
            if isinstance(op, CancelTimer):
                self.service.cancel(group_id, op.key)
            elif not (op.unless_armed and self.service.deadline(group_id, op.key) is not None):
                self.service.schedule(group_id, op.key, op.deadline_ms)

    def cancel_group(self, group_id: str) -> None:
        self.service.cancel_group(group_id)

    def pending(self, group_id: str) -> dict[TimerKey, int]:
        return self.service.pending(group_id)

    def fire(self, group_id: str, key: TimerKey) -> None:
        owned = self.current(group_id)
        if owned is None or owned.state is None or self.execute is None:
            return
        state = owned.state

        def handle(s: GroupState | None, now: int) -> Result[None]:
            # Under the group's lock: if a request re-armed this timer after it popped (a
            # heartbeat that was answered normally), it is superseded and must not act.
            if self.service.deadline(group_id, key) is not None:
                return Result([], None)
            return on_timer(s or state, key, now, self.defaults)

        try:
            self.execute(group_id, handle)
        except CoordinatorError as error:
            log.warning("timer %s of group %s not handled: %s", key, group_id, error.message)
            if (
                isinstance(error, CoordinatorNotAvailable)
                and self.current(group_id) is owned
                and self.service.deadline(group_id, key) is None
            ):
                # Its change was taken back with the failed commit: try again soon.
                self.service.schedule(group_id, key, self.now_ms() + TIMER_RETRY_MS)
