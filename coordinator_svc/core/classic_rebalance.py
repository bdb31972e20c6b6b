"""The classic group's rebalance (DESIGN 3.19): entering PREPARING_REBALANCE, the join barrier
with the initial delay, and completing the join phase into a new generation (Kafka's
GroupMetadataManager prepareRebalance / maybeCompleteJoinElseSchedule / completeClassicGroupJoin,
read for behaviour; nothing is ported yet).

P0 of issue 25 fixes these signatures only; issue 25's P1 implements them. Every function works
on a `GroupChange` of a classic group and changes it through its writes (records, timers,
wakeups, the round), never the state underneath.
"""

from __future__ import annotations

from typing import Any

from connect_protocol.resources import ResourceSet

from .change import GroupChange
from .model import Connector


def prepare_rebalance(
    change: GroupChange, reason: str, member_id: str | None = None, **details: Any
) -> None:
    """Start a rebalance: parked SyncGroups answered REBALANCE_IN_PROGRESS (wakeups), the sync
    deadline cancelled, state PREPARING_REBALANCE, CLASSIC_REBALANCE_STARTED (`reason`,
    `generation`, `from_state`, `details`; `member_id` the trigger), then from EMPTY the
    initial delay (`classic_initial_rebalance_delay_ms`), else the barrier completed at once or
    armed at the largest member rebalance timeout (timer CLASSIC_JOIN). Does nothing more than
    record the reason when the group is already PREPARING_REBALANCE."""
    raise NotImplementedError("classic rebalances are issue 25's P1")


def maybe_complete_join(change: GroupChange) -> None:
    """Complete the join phase if every member and every pending id has joined (and the
    initial delay is not running); otherwise leave the barrier armed."""
    raise NotImplementedError("classic rebalances are issue 25's P1")


def complete_join(change: GroupChange) -> None:
    """End the join phase: members that did not rejoin removed with a hold (MEMBER_FENCED,
    reason join_timeout), the leader elected (the previous one if it rejoined, else the
    earliest to join, among `assignor.principals`), the protocol voted (ties to the lowest
    name), the generation (group epoch) bumped and persisted before any answer,
    CLASSIC_JOIN_COMPLETED, COMPLETING_REBALANCE with everyone awaiting sync (timer
    CLASSIC_SYNC), and each joined member's parked JoinGroup answered (wakeups). With no
    member left: a new generation with no protocol, state EMPTY."""
    raise NotImplementedError("classic rebalances are issue 25's P1")


def shown_catalogue(change: GroupChange) -> tuple[tuple[Connector, ...], ResourceSet]:
    """What the leader is shown: the catalogue's connectors (names, task counts) in name order,
    and the resources withheld from it because a hold keeps them (DESIGN 3.13, 3.19)."""
    raise NotImplementedError("classic rebalances are issue 25's P1")
