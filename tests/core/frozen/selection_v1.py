"""Frozen copy of assignor selection before issue 10 (quadratic): the differential oracle."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from coordinator_svc.core.model import Member


@dataclass(frozen=True, slots=True)
class Selection:
    """The assignor the group runs, the version range all support, and who computes."""

    assignor_name: str
    version: int
    assignor_member_id: str | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NoSelection:
    reason: str


def _candidates(members: Sequence[Member]) -> dict[str, tuple[int, int]]:
    """Assignor names every member lists, with the version range common to all of them."""
    if not members:
        return {}
    common: dict[str, tuple[int, int]] = {
        a.name: (a.minimum_version, a.maximum_version) for a in members[0].assignors
    }
    for m in members[1:]:
        mine = {a.name: (a.minimum_version, a.maximum_version) for a in m.assignors}
        common = {
            name: (max(lo, mine[name][0]), min(hi, mine[name][1]))
            for name, (lo, hi) in common.items()
            if name in mine
        }
    return {name: rng for name, rng in common.items() if rng[0] <= rng[1]}


def select(
    members: Iterable[Member],
    previous_assignor_member: str | None = None,
    excluded: frozenset[str] = frozenset(),
) -> Selection | NoSelection:
    """Pick the group's assignor and the member that computes with it.

    Candidates are names every member lists with overlapping version ranges; each member votes
    for its most preferred candidate; most votes wins, ties by name. The assignor member's range
    covers every other member's; the previous assignor member is kept while it qualifies, and
    members in `excluded` are passed over unless no other qualifies.
    """
    ordered = sorted(members, key=lambda m: m.member_id)
    if not ordered:
        return NoSelection("the group has no members")
    candidates = _candidates(ordered)
    if not candidates:
        listed = {m.member_id: [a.name for a in m.assignors] for m in ordered}
        return NoSelection(
            "no client assignor is supported by every member with overlapping versions "
            f"(members list: {listed})"
        )
    votes: Counter[str] = Counter()
    for m in ordered:
        for a in m.assignors:
            if a.name in candidates:
                votes[a.name] += 1
                break
    name = min(votes, key=lambda n: (-votes[n], n))
    ranges = [m.assignor(name) for m in ordered]
    covering = [
        m
        for m, mine in zip(ordered, ranges, strict=True)
        if mine is not None and all(other is not None and mine.covers(other) for other in ranges)
    ]
    version = candidates[name][1]
    if not covering:
        spans = {
            m.member_id: f"[{r.minimum_version}-{r.maximum_version}]"
            for m, r in zip(ordered, ranges, strict=True)
            if r is not None
        }
        return NoSelection(
            f"no member's version range of assignor {name!r} covers every other member's {spans}"
        )
    eligible = [m for m in covering if m.member_id not in excluded] or covering
    chosen = next((m for m in eligible if m.member_id == previous_assignor_member), eligible[0])
    return Selection(name, version, chosen.member_id)
