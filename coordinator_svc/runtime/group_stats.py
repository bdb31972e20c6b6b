"""The owned groups as a metrics scrape sees them: how many in each state, their members, and how
long the oldest unsettled one has been in its state (in seconds and in rebalance timeouts)."""

from __future__ import annotations

from collections.abc import Iterable

from connect_protocol.configs import REBALANCE_TIMEOUT

from ..core.model import GroupConfigDefaults, GroupStatus
from ..metrics import UNSETTLED, GroupStats
from .owned_group import OwnedGroup


def group_stats(
    groups: Iterable[OwnedGroup], now: int, defaults: GroupConfigDefaults
) -> GroupStats:
    """The groups this process owns, for a metrics scrape at coordinator time `now` (ms):
    O(groups), plus O(members) for each group not STABLE. Reads the states without their
    locks (a group changing meanwhile is counted as it was, or skipped). How long an unsettled
    group has been in its state runs from the commit that moved an epoch (ASSIGNING: the bump;
    RECONCILING: the target installed) or from when this process took the group over; the
    scrape clears it when it sees the group settled and starts it when it sees the group
    unsettled with no epoch moved (a member's change alone), so an age is at most a scrape
    interval short."""
    by_state: dict[GroupStatus, int] = {}
    members = 0
    oldest_ms: dict[GroupStatus, int] = {}
    overdue: dict[GroupStatus, float] = {}
    statuses: dict[str, int] = {}
    exhausted = 0
    for owned in groups:
        state = owned.state
        if state is None:
            continue
        epochs, since = owned.rebalance
        try:
            status = state.status()
            count = len(state.members)
            timeout_ms = 0
            if status in UNSETTLED:
                timeout_ms = max(
                    (m.rebalance_timeout_ms for m in list(state.members.values())), default=0
                )
        except RuntimeError:  # its members changed while being read: next scrape
            continue
        for resource_state, n in list(state.status_counts.items()):
            statuses[resource_state.value] = statuses.get(resource_state.value, 0) + n
        exhausted += state.exhausted
        by_state[status] = by_state.get(status, 0) + 1
        members += count
        if status not in UNSETTLED:
            if since is not None and owned.rebalance == (epochs, since):
                owned.rebalance = (epochs, None)  # unless a commit replaced it meanwhile
            continue
        if since is None:
            since = now
            if owned.rebalance == (epochs, None):
                owned.rebalance = (epochs, now)
        age_ms = max(0, now - since)
        if timeout_ms <= 0:
            timeout_ms = state.config(REBALANCE_TIMEOUT, defaults)
        oldest_ms[status] = max(oldest_ms.get(status, 0), age_ms)
        overdue[status] = max(overdue.get(status, 0.0), age_ms / max(1, timeout_ms))
    return GroupStats(
        by_state=by_state,
        members=members,
        oldest_rebalance_s={s: ms / 1000 for s, ms in oldest_ms.items()},
        oldest_rebalance_timeouts=overdue,
        statuses=statuses,
        restarts_exhausted=exhausted,
    )
