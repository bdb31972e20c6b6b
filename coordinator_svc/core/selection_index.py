"""The index behind incremental assignor selection: member profiles, counted, with their ids.

A member's *profile* is what selection sees of it: the (name, minimum, maximum) version ranges of
the assignors it lists, most preferred first. `GroupState` keeps a `SelectionIndex` up to date as
members come, go and change (O(log members) each); `selection.select_with` reads it. Members are
also kept per principal, for the group configuration `assignor.principals`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

Range = tuple[str, int, int]
"""(assignor name, minimum version, maximum version)."""
Profile = tuple[Range, ...]
"""What selection sees of a member: its assignors' ranges, most preferred first."""


class _AssignorLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def minimum_version(self) -> int: ...
    @property
    def maximum_version(self) -> int: ...


class _MemberLike(Protocol):
    @property
    def assignors(self) -> Sequence[_AssignorLike]: ...


#: The mark a classic-protocol member's profile ends with (DESIGN 3.19): such a member votes and
#: must be covered, but cannot compute (it has no Prepare or Install). An empty range, so never
#: a candidate assignor.
CLASSIC_MARK: Range = ("", 1, 0)


def profile_of(member: _MemberLike) -> Profile:
    ranges = tuple((a.name, a.minimum_version, a.maximum_version) for a in member.assignors)
    if getattr(member, "classic", None) is not None:
        return (*ranges, CLASSIC_MARK)
    return ranges


def computes(profile: Profile) -> bool:
    """Whether a member of `profile` can be the assignor member (a connect-protocol member)."""
    return CLASSIC_MARK not in profile


class _IdHeap:
    """Member ids of one profile: O(log n) add, O(1) remove, smallest id in amortised
    O(log n) (removed ids are pruned lazily when they reach the top)."""

    __slots__ = ("_heap", "_live")

    def __init__(self) -> None:
        self._heap: list[str] = []
        self._live: set[str] = set()

    def add(self, member_id: str) -> None:
        if member_id not in self._live:
            self._live.add(member_id)
            heapq.heappush(self._heap, member_id)

    def remove(self, member_id: str) -> None:
        self._live.discard(member_id)
        if len(self._heap) > 2 * len(self._live) + 16:  # keep dead entries bounded
            self._heap = sorted(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def smallest(self, skip: Callable[[str], bool], limit: int | None = None) -> list[str]:
        """Up to `limit` (default 1) smallest live ids for which `skip` is false, in order.
        Costs O((found + skipped) log n): callers skip only a few ids."""
        heap = self._heap
        while heap and heap[0] not in self._live:
            heapq.heappop(heap)
        want = 1 if limit is None else limit
        found: list[str] = []
        popped: list[str] = []
        while heap and len(found) < want:
            member_id = heapq.heappop(heap)
            if member_id not in self._live or (popped and popped[-1] == member_id):
                # Dead, or a second entry of an id removed and added again while its first
                # entry was still in the heap (equal ids pop one after the other): dropped.
                continue
            popped.append(member_id)
            if not skip(member_id):
                found.append(member_id)
        for member_id in popped:
            heapq.heappush(heap, member_id)
        return found


class SelectionIndex:
    """Member profiles of a group, counted, with the ids of each profile's members, and the
    same ids again per principal (for `assignor.principals`, DESIGN 3.4: the smallest id of a
    listed principal is then found without looking at the others' members)."""

    __slots__ = ("_by_principal", "_counts", "_ids")

    def __init__(self) -> None:
        self._counts: dict[Profile, int] = {}
        self._ids: dict[Profile, _IdHeap] = {}
        self._by_principal: dict[str, dict[Profile, _IdHeap]] = {}

    def add(self, member_id: str, profile: Profile, principal: str = "") -> None:
        self._counts[profile] = self._counts.get(profile, 0) + 1
        self._ids.setdefault(profile, _IdHeap()).add(member_id)
        self._by_principal.setdefault(principal, {}).setdefault(profile, _IdHeap()).add(member_id)

    def remove(self, member_id: str, profile: Profile, principal: str = "") -> None:
        mine = self._by_principal.get(principal)
        heap = None if mine is None else mine.get(profile)
        if mine is not None and heap is not None:
            heap.remove(member_id)
            if not heap:
                del mine[profile]
                if not mine:
                    del self._by_principal[principal]
        count = self._counts.get(profile, 0) - 1
        if count <= 0:
            self._counts.pop(profile, None)
            self._ids.pop(profile, None)
            return
        self._counts[profile] = count
        self._ids[profile].remove(member_id)

    @property
    def counts(self) -> Mapping[Profile, int]:
        return self._counts

    def smallest(
        self,
        profile: Profile,
        skip: Callable[[str], bool],
        limit: int | None = None,
        principal: str | None = None,
    ) -> list[str]:
        """Up to `limit` (default 1) smallest ids with `profile` (of `principal`'s members
        only, if given) for which `skip` is false."""
        if principal is None:
            ids = self._ids.get(profile)
        else:
            ids = self._by_principal.get(principal, {}).get(profile)
        return [] if ids is None else ids.smallest(skip, limit)
