"""Sticky balancing of one kind of resource (connectors, or tasks) over a group's members.

Pure and deterministic: members are ordered by id and resources by name, so the order of the
inputs never matters.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from typing import TypeVar

from connect_protocol.resources import TaskId

__all__ = ["balance", "quotas"]

R = TypeVar("R", str, TaskId)


def quotas(counts: Mapping[str, int], total: int) -> dict[str, int]:
    """How many of `total` resources each member should hold: the floor or the ceiling.

    The ceilings go first to members that already hold more than the floor (the most loaded
    first), so that as few resources as possible move; the rest by member id.
    """
    if not counts:
        return {}
    floor, ceilings = divmod(total, len(counts))

    def rank(member: str) -> tuple[int, int, str]:
        count = counts[member]
        return (0, -count, member) if count > floor else (1, 0, member)

    ranked = sorted(counts, key=rank)
    return {member: floor + (1 if i < ceilings else 0) for i, member in enumerate(ranked)}


def balance(
    shares: Mapping[str, frozenset[R]],
    unassigned: Iterable[R],
    running: Mapping[str, frozenset[R]],
) -> dict[str, frozenset[R]]:
    """Give every member of `shares` the floor or the ceiling of all resources (theirs plus
    `unassigned`), moving the fewest possible from where `shares` puts them.

    A member above its quota gives up the surplus, preferring what it does not yet run
    (`running`: what it owns now), then the highest names. Freed and unassigned resources go,
    in name order, to the least loaded member below its quota (ties by member id), so an empty
    newcomer fills first. With no members there is nobody to give anything: `{}`.
    """
    if not shares:
        return {}
    pool = set(unassigned)
    total = len(pool) + sum(len(share) for share in shares.values())
    quota = quotas({m: len(share) for m, share in shares.items()}, total)
    result = {m: set(share) for m, share in shares.items()}
    for member in sorted(result):
        surplus = len(result[member]) - quota[member]
        if surplus > 0:
            mine = running.get(member, frozenset())
            given_up = sorted(result[member], key=lambda r: (r not in mine, r), reverse=True)
            for resource in given_up[:surplus]:
                result[member].discard(resource)
                pool.add(resource)
    below = [(len(result[m]), m) for m in sorted(result) if len(result[m]) < quota[m]]
    heapq.heapify(below)
    for resource in sorted(pool):
        count, member = heapq.heappop(below)
        result[member].add(resource)
        if count + 1 < quota[member]:
            heapq.heappush(below, (count + 1, member))
    return {m: frozenset(share) for m, share in result.items()}
