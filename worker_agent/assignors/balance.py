"""Sticky balancing of one kind of resource (connectors, or tasks) over a group's members.

Pure and deterministic: members are ordered by id and resources by name, so the order of the
inputs never matters. Linear in members plus resources, apart from the sorts whose order shows
in the result: the members by id, the resources handed out, and what a member above its quota
gives up (only among that member's share, only as many as it gives up).

Paced waves (DESIGN 3.18) split `balance_sorted` in two: `plan_surplus` says what each member
above its quota would give up and how much of that it runs, and `balance_planned` carries the
plan out with at most `limit` running resources given up (the most loaded members give first),
reporting which running resources moved to whom. With no limit it is `balance_sorted` exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Generic, TypeVar

from connect_protocol.resources import TaskId

__all__ = [
    "TASK_ORDER",
    "SurplusPlan",
    "balance",
    "balance_planned",
    "balance_sorted",
    "place_sorted",
    "plan_surplus",
    "quotas",
]

R = TypeVar("R", str, TaskId)

#: A sort key that orders tasks exactly as `TaskId`'s own ordering does (connector, then task
#: number), but compares plain tuples instead of calling the dataclass's `__lt__`.
TASK_ORDER: Callable[[TaskId], tuple[str, int]] = attrgetter("connector", "task")


def quotas(counts: Mapping[str, int], total: int) -> dict[str, int]:
    """How many of `total` resources each member should hold: the floor or the ceiling.

    The ceilings go first to members that already hold more than the floor (the most loaded
    first), so that as few resources as possible move; the rest by member id.
    """
    return _quotas(sorted(counts), counts, total)


def _quotas(ids: Sequence[str], counts: Mapping[str, int], total: int) -> dict[str, int]:
    """`quotas`, with the members already sorted by id."""
    if not ids:
        return {}
    floor, ceilings = divmod(total, len(ids))
    quota = dict.fromkeys(ids, floor)
    if ceilings:
        above = [m for m in ids if counts[m] > floor]  # by id
        if len(above) > ceilings:  # which of them get a ceiling: the most loaded, ties by id
            above.sort(key=lambda m: -counts[m])  # stable, so ties stay in id order
        chosen = above[:ceilings]
        if len(chosen) < ceilings:
            rest = (m for m in ids if counts[m] <= floor)
            chosen.extend(m for m, _ in zip(rest, range(ceilings - len(chosen)), strict=False))
        for member in chosen:
            quota[member] = floor + 1
    return quota


def balance(
    shares: Mapping[str, frozenset[R]],
    unassigned: Iterable[R],
    running: Mapping[str, frozenset[R]],
    *,
    key: Callable[[R], Any] | None = None,
) -> dict[str, frozenset[R]]:
    """Give every member of `shares` the floor or the ceiling of all resources (theirs plus
    `unassigned`), moving the fewest possible from where `shares` puts them.

    A member above its quota gives up the surplus, preferring what it does not yet run
    (`running`: what it owns now), then the highest names. Freed and unassigned resources go,
    in name order, to the least loaded member below its quota (ties by member id), so an empty
    newcomer fills first. With no members there is nobody to give anything: `{}`.

    `key`, if given, must order the resources exactly as their natural order does (it only makes
    the sorting cheaper, e.g. `TASK_ORDER` for tasks).
    """
    if not shares:
        return {}
    return balance_sorted(
        sorted(shares), shares, list(set(unassigned)), running, key=key, distinct=False
    )


def balance_sorted(
    ids: Sequence[str],
    shares: Mapping[str, Collection[R]],
    pool: list[R],
    running: Mapping[str, Collection[R]],
    *,
    key: Callable[[R], Any] | None = None,
    presorted: bool = False,
    distinct: bool = True,
) -> dict[str, frozenset[R]]:
    """`balance`, for callers that already have the member ids sorted and the unassigned
    resources as a list (`pool`, which this consumes).

    With `distinct`, the caller promises that `pool` holds each resource once and none that a
    share holds; with `presorted`, that `pool` is already in name order. A member whose share
    does not change gets its own `shares` entry back (the same object, if it is a frozenset).
    """
    plan = plan_surplus(ids, shares, len(pool), running)
    out, _ = balance_planned(
        ids, shares, pool, plan, key=key, presorted=presorted, distinct=distinct
    )
    return out


@dataclass(frozen=True, slots=True)
class SurplusPlan(Generic[R]):
    """What balancing one kind of resource would take from whom (`plan_surplus`).

    Attributes:
        quota: each member's floor or ceiling.
        givers: per member above its quota: how many it gives up, its whole share and the part
            of it that it does not run (given up first, freely: nothing stops).
        running: per giver, how many of the resources it gives up it runs (moving them stops
            them there: the moves a paced wave counts), only those above 0.
    """

    quota: dict[str, int]
    givers: dict[str, tuple[int, frozenset[R], frozenset[R]]]
    running: dict[str, int]

    @property
    def running_total(self) -> int:
        """How many running resources balancing would move, in all."""
        return sum(self.running.values())


def plan_surplus(
    ids: Sequence[str],
    shares: Mapping[str, Collection[R]],
    pool_size: int,
    running: Mapping[str, Collection[R]],
) -> SurplusPlan[R]:
    """The quotas for `shares` plus `pool_size` unassigned resources, and what each member above
    its quota gives up: as many as it holds above it, those it does not run (`running`) first.
    Linear in the givers' shares."""
    counts = {m: len(shares[m]) for m in ids}
    quota = _quotas(ids, counts, pool_size + sum(counts.values()))
    givers: dict[str, tuple[int, frozenset[R], frozenset[R]]] = {}
    running_surplus: dict[str, int] = {}
    for member in ids:
        surplus = counts[member] - quota[member]
        if surplus > 0:
            whole: frozenset[R] = frozenset(shares[member])  # no copy if it is one already
            spare: frozenset[R] = whole.difference(running.get(member, frozenset()))
            givers[member] = (surplus, whole, spare)
            if surplus > len(spare):
                running_surplus[member] = surplus - len(spare)
    return SurplusPlan(quota, givers, running_surplus)


def balance_planned(
    ids: Sequence[str],
    shares: Mapping[str, Collection[R]],
    pool: list[R],
    plan: SurplusPlan[R],
    *,
    limit: int | None = None,
    key: Callable[[R], Any] | None = None,
    presorted: bool = False,
    distinct: bool = True,
) -> tuple[dict[str, frozenset[R]], dict[str, list[R]]]:
    """Carry out `plan` (from `plan_surplus` over the same `ids`, `shares` and `len(pool)`):
    the shares after balancing, and which running resources each receiver got (only computed
    with a `limit`; `{}` without).

    Without `limit`, `balance_sorted`. With one, the givers give up all they do not run but at
    most `limit` resources they run, in all: one at a time from the most loaded giver (ties by
    member id), each its highest names (the same ones an unlimited plan would take first); the
    rest stay where they run, above their quota, for a later wave. Everything given up and the
    pool still go, in name order, to the least loaded members below their quota. Costs
    O(limit x log(givers)) more than `balance_sorted`, plus the pool for the receivers' report.
    """
    quota = plan.quota
    counts = {m: len(shares[m]) for m in ids}
    taking = plan.running if limit is None else _level_from_top(plan, limit)
    given_up: dict[str, list[R]] = {}
    moved: set[R] = set()
    for member, (surplus, whole, spare) in plan.givers.items():
        free = min(surplus, len(spare))
        given = _highest(spare, free, key) if free < len(spare) else list(spare)
        take = taking.get(member, 0)
        if take:
            stopping = _highest(whole - spare, take, key)
            given.extend(stopping)
            if limit is not None:
                moved.update(stopping)
        if given:
            given_up[member] = given
            counts[member] -= len(given)
            pool.extend(given)
            presorted = False
    if not distinct:
        pool = list(set(pool))
        presorted = False
    if not presorted:
        pool.sort(key=key)
    received = _hand_out(pool, ids, counts, quota)
    out: dict[str, frozenset[R]] = {}
    for member in ids:
        share = shares[member]
        given = given_up.get(member, [])
        got = received.get(member, [])
        if given or got or not isinstance(share, frozenset):
            out[member] = frozenset(share).difference(given).union(got)
        else:
            out[member] = share
    report: dict[str, list[R]] = {}
    if moved:
        for member, got in received.items():
            arrived = [r for r in got if r in moved]
            if arrived:
                report[member] = arrived
    return out, report


def _level_from_top(plan: SurplusPlan[R], limit: int) -> dict[str, int]:
    """How many running resources each giver gives up when at most `limit` may move: one at a
    time from the giver that would hold the most (ties by member id), so that the most loaded
    are relieved first."""
    if limit >= plan.running_total:
        return plan.running
    heap = [(-(plan.quota[m] + n), m) for m, n in plan.running.items()]
    heapq.heapify(heap)
    taking: dict[str, int] = {}
    for _ in range(limit):
        load, member = heapq.heappop(heap)
        taking[member] = taking.get(member, 0) + 1
        if taking[member] < plan.running[member]:
            heapq.heappush(heap, (load + 1, member))
    return taking


def place_sorted(
    ids: Sequence[str],
    shares: Mapping[str, Collection[R]],
    pool: list[R],
    *,
    key: Callable[[R], Any] | None = None,
    presorted: bool = False,
) -> dict[str, frozenset[R]]:
    """Place `pool` without taking anything from anyone: each resource, in name order, to the
    least loaded member (ties by member id), so the members' counts end as even as they can be
    without revocations. Nobody gives up anything, whatever the imbalance.

    What `balance_sorted` does while a delay runs (KIP-415: no load-balancing revocations during
    a scheduled-rebalance delay). The same caller promises as `balance_sorted` with `distinct`
    (`pool` holds each resource once and none that a share holds; `presorted`: in name order),
    and the same pass-through of unchanged shares. When `balance_sorted` would give nothing up,
    both return the same. Sorts the members' counts once (not only the resources handed out).
    """
    counts = {m: len(shares[m]) for m in ids}
    quota = _fill_quotas(ids, counts, len(pool))
    if not presorted:
        pool.sort(key=key)
    received = _hand_out(pool, ids, counts, quota)
    out: dict[str, frozenset[R]] = {}
    for member in ids:
        share = shares[member]
        got = received.get(member, [])
        if got or not isinstance(share, frozenset):
            out[member] = frozenset(share).union(got)
        else:
            out[member] = share
    return out


def _fill_quotas(ids: Sequence[str], counts: Mapping[str, int], size: int) -> dict[str, int]:
    """Room for `size` more resources, the least loaded first: the level `size` fills the
    lowest members up to, and one more for each member at or below it (`_hand_out` gives the
    last, partial level in id order); members above the level get no room."""
    if not ids or not size:
        return dict(counts)
    ordered = sorted(counts.values())
    level, below, left = ordered[0], 0, size  # `below`: members at or below `level`
    while True:
        while below < len(ordered) and ordered[below] <= level:
            below += 1
        if below == len(ordered) or (ordered[below] - level) * below > left:
            level += left // below
            break
        left -= (ordered[below] - level) * below
        level = ordered[below]
    return {m: level + 1 if counts[m] <= level else counts[m] for m in ids}


def _highest(items: Collection[R], count: int, key: Callable[[R], Any] | None) -> list[R]:
    """The `count` highest of `items` (distinct), in no particular order."""
    if count >= len(items):
        return list(items)
    if count * 8 >= len(items):
        return sorted(items, key=key)[len(items) - count :]
    return heapq.nlargest(count, items, key=key)


def _hand_out(
    pool: Sequence[R], ids: Sequence[str], counts: Mapping[str, int], quota: Mapping[str, int]
) -> dict[str, list[R]]:
    """Hand out `pool`, in order, each resource to the least loaded member below its quota
    (ties by member id): what each member receives.

    The same as popping a heap of (count, member) per resource, but level by level: every
    member at the lowest count gets one, in id order, and then the level above (those still
    below quota, plus the members that started there) takes its turn."""
    received: dict[str, list[R]] = {}
    starting: dict[int, list[str]] = {}
    for member in ids:
        if counts[member] < quota[member]:
            starting.setdefault(counts[member], []).append(member)  # by id
            received[member] = []
    levels = sorted(starting)
    next_start = 0  # index into `levels` of the next level with members starting there
    level = levels[0] if levels else 0
    waiting: list[str] = []  # members moved up from the level below, by id
    position, end = 0, len(pool)
    while position < end:
        if not waiting:
            if next_start >= len(levels):
                raise AssertionError("more resources to hand out than room below the quotas")
            level = max(level, levels[next_start])
        if next_start < len(levels) and levels[next_start] == level:
            fresh = starting[level]
            next_start += 1
            turn = sorted(waiting + fresh) if waiting else fresh
        else:
            turn = waiting
        chunk = pool[position : position + len(turn)]
        for member, resource in zip(turn, chunk, strict=False):
            received[member].append(resource)
        position += len(chunk)
        level += 1
        waiting = [m for m in turn if level < quota[m]]
    return received
