"""Group type conversions (DESIGN 3.19 "Empty conversions"): an EMPTY group with no holds takes
its first joiner's protocol, keeping its catalogue, configurations and fencing token counter.
Group epoch and generation are one counter that never goes down.

P0 of issue 25 fixes these signatures only; issue 25's P3 implements them (conversions of
non-empty groups are issue 27).
"""

from __future__ import annotations

from .change import GroupChange


def convertible(change: GroupChange) -> bool:
    """Whether the group may change type: no members (none LEFT either) and no holds."""
    raise NotImplementedError("empty conversions are issue 25's P3")


def to_classic(change: GroupChange) -> None:
    """Make the (convertible) connect group classic: type classic, state EMPTY, generation =
    group epoch, any scheduled rebalance dropped, GROUP_CONVERTED (direction to_classic)."""
    raise NotImplementedError("empty conversions are issue 25's P3")


def to_connect(change: GroupChange) -> None:
    """Make the (convertible) classic group connect: group epoch = assignment epoch =
    max(generation, 1), classic state and round dropped (pending ids too), GROUP_CONVERTED
    (direction to_connect)."""
    raise NotImplementedError("empty conversions are issue 25's P3")
