"""Group type conversions (DESIGN 3.19 "Empty conversions"): an EMPTY group with no holds takes
its first joiner's protocol, keeping its catalogue, configurations and fencing token counter.
Group epoch and generation are one counter that never goes down: to classic, generation = group
epoch; to connect, group epoch = assignment epoch = max(generation, 1).

This module owns the rule (`convertible`) and the two conversions; the join handlers call them
(a classic JoinGroup into an empty connect group, P1; a connect join into an empty classic
group, `heartbeat.py`). Conversions of non-empty groups are issue 27. Each costs O(1) but for
dropping a classic group's pending ids (O(pending ids)).
"""

from __future__ import annotations

from dataclasses import replace

from .change import GroupChange
from .classic_model import ClassicGroupMeta, ClassicState, GroupType
from .errors import IllegalStateError
from .model import GroupState
from .records import EventType
from .results import (
    ASSIGNOR,
    CLASSIC_JOIN,
    CLASSIC_PENDING,
    CLASSIC_SYNC,
    SCHEDULED_REBALANCE,
)

TO_CLASSIC = "to_classic"
TO_CONNECT = "to_connect"


def convertible(group: GroupChange | GroupState) -> bool:
    """Whether the group may change type: no members at all (a static member that LEFT is
    still a member) and no holds (a removed member may still run held work). O(1) for a
    `GroupState`, O(members changed) for a `GroupChange`."""
    if isinstance(group, GroupChange):
        return not group.has_members() and not group.meta.holds
    return not group.members and not group.meta.holds


def _require_convertible(change: GroupChange, direction: str) -> None:
    if not convertible(change):
        raise IllegalStateError(
            f"group {change.group_id!r} cannot be converted {direction}: it has members or holds"
        )


def _emptied_target(change: GroupChange, epoch: int) -> None:
    """The target of an empty group at `epoch`: no shares, no scheduled rebalance (its timer
    cancelled), the assignor's state kept (it is the connect assignor's memory; harmless)."""
    target = change.target
    if target.scheduled_rebalance_at_ms is not None:
        change.cancel((SCHEDULED_REBALANCE, ""))
    changed = None if target.members else ()
    change.set_target(
        replace(
            target,
            assignment_epoch=epoch,
            members={},
            scheduled_rebalance_at_ms=None,
            lost_work_rebalance_at_ms=None,
            next_wave_at_ms=None,
        ),
        changed,
    )


def _no_computation(change: GroupChange) -> None:
    """Nothing of the connect protocol's computation survives a conversion."""
    meta = change.meta
    if meta.compute_requested_epoch is not None:
        change.cancel((ASSIGNOR, ""))
    change.set_meta(
        assignor_member_id=None,
        compute_requested_epoch=None,
        excluded_assignors=frozenset(),
        compute_not_before_ms=None,
        prepared=None,
    )


def to_classic(change: GroupChange) -> None:
    """Make the (convertible) connect group classic: type classic, state EMPTY, generation =
    group epoch, any scheduled rebalance dropped, GROUP_CONVERTED (direction to_classic).
    IllegalStateError if it is not convertible or already classic (a caller's bug)."""
    _require_convertible(change, TO_CLASSIC)
    if change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is already classic")
    epoch = change.group_epoch
    _emptied_target(change, epoch)
    _no_computation(change)
    change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta(ClassicState.EMPTY))
    change.event(
        EventType.GROUP_CONVERTED,
        direction=TO_CLASSIC,
        group_epoch_before=epoch,
        generation=epoch,
        members={GroupType.CLASSIC.value: 0, GroupType.CONNECT.value: 0},
    )


def to_connect(change: GroupChange) -> None:
    """Make the (convertible) classic group connect: group epoch = assignment epoch =
    max(generation, 1), classic state and round dropped (pending ids too, with their timers and
    the join and sync deadlines), GROUP_CONVERTED (direction to_connect). IllegalStateError if
    it is not convertible or not classic (a caller's bug)."""
    _require_convertible(change, TO_CONNECT)
    if not change.meta.is_classic:
        raise IllegalStateError(f"group {change.group_id!r} is not classic")
    generation = change.group_epoch
    epoch = max(generation, 1)
    change.cancel((CLASSIC_JOIN, ""))
    change.cancel((CLASSIC_SYNC, ""))
    if change.state is not None and change.state.round is not None:
        for pending_id in change.round.pending_ids():
            change.drop_pending_id(pending_id)
            change.cancel((CLASSIC_PENDING, pending_id))
        if not change.state.round.is_idle():
            change.clear_round()
        change.set_round(
            initial=False,
            initial_remaining_ms=0,
            new_member_added=False,
            leader_unavailable_reason="",
        )
    change.set_meta(group_type=GroupType.CONNECT, classic=None, group_epoch=epoch)
    _emptied_target(change, epoch)
    _no_computation(change)
    change.event(
        EventType.GROUP_CONVERTED,
        direction=TO_CONNECT,
        group_epoch_before=generation,
        generation=generation,
        members={GroupType.CLASSIC.value: 0, GroupType.CONNECT.value: 0},
    )
