"""Automatic restarts of resources reported FAILED (DESIGN 3.20 "Automatic restarts"; beyond
Connect, which never restarts a failed task by itself): the fields a holder's report stores,
the backoff, and the per-resource timers. What a due timer does is `control`'s.

Two numbers per resource: the restart count (raised by every restart request, manual or
automatic, never lowered: what the agent compares) and the automatic attempts (at most
restart.failed.max.attempts in a row, reset only by a RUNNING report that has lasted
restart.failed.backoff.ms, so a task that crashes a second after each start is not restarted
for ever). The group configurations are read through the change (group override, else the
server's default). Everything here is O(1) but `auto_restart_timers` (a takeover's)."""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.configs import (
    RESTART_BACKOFF_CAP_MS,
    RESTART_FAILED_BACKOFF,
    RESTART_FAILED_MAX_ATTEMPTS,
)
from connect_protocol.lifecycle_messages import TargetState

from .change import GroupChange
from .model import GroupState, ResourceStatus, StatusState
from .results import AUTO_RESTART, ScheduleTimer, TimerKey


def auto_restart_key(connector: str, task: int) -> TimerKey:
    """The timer of one resource's pending automatic restart (names never hold NUL)."""
    return (AUTO_RESTART, f"{connector}\x00{task}")


def resource_of_key(key: TimerKey) -> tuple[str, int]:
    connector, _, task = key[1].rpartition("\x00")
    return connector, int(task)


def backoff_ms(attempts_done: int, base_ms: int) -> int:
    """The wait before automatic attempt `attempts_done + 1`: the base, doubled per attempt
    already made, at most RESTART_BACKOFF_CAP_MS."""
    doubled: int = base_ms << min(attempts_done, 32)
    return min(doubled, max(base_ms, RESTART_BACKOFF_CAP_MS))


def attempts_before(stored: ResourceStatus | None, now_ms: int, base_ms: int) -> int:
    """The automatic attempts a new report continues from: 0 once RUNNING has lasted the
    backoff (a task that crashes a second after each start is not restarted for ever)."""
    if stored is None:
        return 0
    if stored.state is StatusState.RUNNING and now_ms - stored.reported_at_ms >= base_ms:
        return 0
    return stored.auto_attempts


def with_auto_restart(
    change: GroupChange,
    connector: str,
    task: int,
    stored: ResourceStatus | None,
    status: ResourceStatus,
) -> ResourceStatus:
    """The status a holder's report stores, with its automatic-restart fields: the attempts
    continued (or reset), and for a FAILED report of a STARTED connector with attempts left,
    the next attempt armed (the same holder's repeated FAILED keeps the time already armed).
    O(1)."""
    base = change.config(RESTART_FAILED_BACKOFF)
    attempts = attempts_before(stored, change.now_ms, base)
    status = replace(status, auto_attempts=attempts, auto_restart_at_ms=None, auto_exhausted=False)
    pending = None if stored is None else stored.auto_restart_at_ms
    spec = change.connector(connector)
    if (
        status.state is not StatusState.FAILED
        or spec is None
        or spec.target_state is not TargetState.STARTED
    ):
        if pending is not None:
            change.cancel(auto_restart_key(connector, task))
        return status
    max_attempts = change.config(RESTART_FAILED_MAX_ATTEMPTS)
    if attempts >= max_attempts:
        return replace(status, auto_exhausted=max_attempts > 0)
    if (
        pending is not None
        and stored is not None
        and stored.state is StatusState.FAILED
        and (stored.member_id, stored.token) == (status.member_id, status.token)
    ):
        due = pending  # already pending for this grant: a repeated FAILED keeps its time
    else:
        due = change.now_ms + backoff_ms(attempts, base)
    change.schedule(auto_restart_key(connector, task), due)
    return replace(status, auto_restart_at_ms=due)


def auto_restart_timers(state: GroupState) -> list[ScheduleTimer]:
    """The pending automatic restarts to re-arm when a coordinator takes the group over (their
    times are persisted). O(the group's stored statuses)."""
    return [
        ScheduleTimer(auto_restart_key(connector, task), status.auto_restart_at_ms)
        for connector, by_task in state.statuses.items()
        for task, status in by_task.items()
        if status.auto_restart_at_ms is not None
    ]
