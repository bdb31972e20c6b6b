"""Assignor selection and the choice of the assignor member (DESIGN 3.4), kept incrementally.

Selection depends on members only through their *profiles*: the (name, minimum, maximum)
version ranges of the assignors they list, in order. A group has few distinct profiles (one per
agent version and protocol, typically one to three) however many members it has, so
`SelectionIndex` keeps a count per profile and, per profile, the member ids in a lazily pruned
heap; selecting costs O(profiles x assignors) plus O(log members) to find the smallest covering
member id, and a join or leave updates the index in O(log members).

`GroupChange` combines the index of the committed state with its own few changed members
(`select_with`), so handlers never look at every member. The group configuration
`assignor.principals` narrows who may be the assignor member (not who votes); the index keeps
each principal's ids apart, so that filter costs O(listed principals x profiles) lookups.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from connect_protocol.configs import ASSIGNOR_PRINCIPALS

from .model import Member
from .selection_index import Profile, SelectionIndex, computes, profile_of

#: How many example member ids a reason names per distinct profile or range.
_EXAMPLES = 3


@dataclass(frozen=True, slots=True)
class Selection:
    """The assignor the group runs, the version range all support, and who computes."""

    assignor_name: str
    version: int
    assignor_member_id: str | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class NoSelection:
    """Why no assignor can be chosen. `reason` is for operators (DescribeGroups) and may name
    members; `public`, when set, is the same without them, for the answer to a joining member
    (which must not learn the ids of the group's other members)."""

    reason: str
    public: str | None = None

    def for_member(self) -> str:
        return self.reason if self.public is None else self.public


@dataclass(frozen=True, slots=True)
class GroupProfiles:
    """The members as selection sees them: the committed index, less the ids a change touched,
    plus the touched members as they are now (`extra`, few)."""

    index: SelectionIndex
    hidden: frozenset[str]  # ids whose committed entry is out of date or gone
    extra: Mapping[str, Profile]  # touched members that are present, by id
    lookup: Callable[[str], Profile | None]  # the committed profile of a member id
    extra_principals: Mapping[str, str] = field(default_factory=dict)  # of the touched members
    principal_lookup: Callable[[str], str | None] = lambda _member_id: None  # committed ones

    def principal(self, member_id: str) -> str | None:
        if member_id in self.extra:
            return self.extra_principals.get(member_id, "")
        if member_id in self.hidden:
            return None
        return self.principal_lookup(member_id)

    def counts(self) -> Counter[Profile]:
        counts: Counter[Profile] = Counter(self.index.counts)
        for member_id in self.hidden:
            profile = self.lookup(member_id)
            if profile is not None:
                counts[profile] -= 1
        for profile in self.extra.values():
            counts[profile] += 1
        return +counts  # drop profiles counted down to zero

    def smallest(
        self,
        profiles: Iterable[Profile],
        skip: Callable[[str], bool],
        principals: frozenset[str] | None = None,
    ) -> str | None:
        """The smallest id of a member with one of `profiles` for which `skip` is false (and,
        if `principals` is given, whose principal is one of them: O(principals x profiles)
        heap lookups, never a look at other principals' members)."""
        wanted = set(profiles)
        best: str | None = None
        hidden = self.hidden

        def skipped(member_id: str) -> bool:
            return member_id in hidden or skip(member_id)

        owners: Iterable[str | None] = [None] if principals is None else sorted(principals)
        for owner in owners:
            for profile in wanted:
                found = self.index.smallest(profile, skipped, principal=owner)
                if found and (best is None or found[0] < best):
                    best = found[0]
        for member_id, profile in self.extra.items():
            if (
                profile in wanted
                and not skip(member_id)
                and (principals is None or self.extra_principals.get(member_id, "") in principals)
                and (best is None or member_id < best)
            ):
                best = member_id
        return best

    def examples(self, profile: Profile) -> list[str]:
        """A few member ids with `profile`, smallest first."""
        hidden = self.hidden
        ids = self.index.smallest(profile, lambda m: m in hidden, _EXAMPLES)
        ids.extend(m for m, p in self.extra.items() if p == profile)
        return sorted(ids)[:_EXAMPLES]


def _candidates(counts: Mapping[Profile, int]) -> dict[str, tuple[int, int]]:
    """Assignor names every member lists, with the version range common to all of them."""
    profiles = list(counts)
    common: dict[str, tuple[int, int]] = {name: (lo, hi) for name, lo, hi in profiles[0]}
    for profile in profiles[1:]:
        mine = {name: (lo, hi) for name, lo, hi in profile}
        common = {
            name: (max(lo, mine[name][0]), min(hi, mine[name][1]))
            for name, (lo, hi) in common.items()
            if name in mine
        }
    return {name: rng for name, rng in common.items() if rng[0] <= rng[1]}


def _range_of(profile: Profile, name: str) -> tuple[int, int]:
    for assignor, lo, hi in profile:
        if assignor == name:
            return lo, hi
    raise KeyError(name)  # a candidate is listed by every profile


def _summary(
    group: GroupProfiles, counts: Mapping[Profile, int], show: Callable[[Profile], str]
) -> str:
    """`{'w1': ..., 'w2': ..., '(+N more)': ...}`: a few members of each distinct profile."""
    parts: list[tuple[str, str]] = []
    for profile in sorted(counts, key=lambda p: group.examples(p)[:1]):
        examples = group.examples(profile)
        parts.extend((member_id, show(profile)) for member_id in examples)
        if counts[profile] > len(examples):
            parts.append((f"+{counts[profile] - len(examples)} more", show(profile)))
    return "{" + ", ".join(f"{m!r}: {shown}" for m, shown in parts) + "}"


def select_with(
    group: GroupProfiles,
    previous_assignor_member: str | None = None,
    excluded: frozenset[str] = frozenset(),
    principals: frozenset[str] | None = None,
) -> Selection | NoSelection:
    """Pick the group's assignor and the member that computes with it.

    Candidates are names every member lists with overlapping version ranges; each member votes
    for its most preferred candidate; most votes wins, ties by name. The assignor member's range
    covers every other member's, and its principal is one of `principals` when that is given
    (the group configuration `assignor.principals`: every member votes, only those compute);
    the previous assignor member is kept while it qualifies, and members in `excluded` are
    passed over unless no other qualifies; otherwise the smallest member id is chosen.
    """
    counts = group.counts()
    if not counts:
        return NoSelection("the group has no members")
    candidates = _candidates(counts)
    if not candidates:
        listed = _summary(group, counts, lambda p: repr([name for name, _, _ in p]))
        public = "no client assignor is supported by every member with overlapping versions"
        return NoSelection(f"{public} (members list: {listed})", public)
    votes: Counter[str] = Counter()
    for profile, count in counts.items():
        for name, _, _ in profile:
            if name in candidates:
                votes[name] += count
                break
    name = min(votes, key=lambda n: (-votes[n], n))
    ranges = {profile: _range_of(profile, name) for profile in counts}
    lowest = min(lo for lo, _ in ranges.values())
    highest = max(hi for _, hi in ranges.values())
    covering = [p for p, rng in ranges.items() if rng == (lowest, highest)]
    version = candidates[name][1]
    if covering and not any(computes(p) for p in covering):
        public = (
            f"no connect-protocol member's version range of assignor {name!r} covers every "
            "other member's (a classic-protocol worker cannot compute); the group stays "
            "ASSIGNING until one joins"
        )
        return NoSelection(public, public)
    covering = [p for p in covering if computes(p)]
    if not covering:
        spans = _summary(group, counts, lambda p: repr("[{}-{}]".format(*ranges[p])))
        public = f"no member's version range of assignor {name!r} covers every other member's"
        return NoSelection(f"{public} {spans}", public)
    first_eligible = group.smallest(covering, lambda m: m in excluded, principals)
    previous = previous_assignor_member
    if (
        previous is not None
        and _has_profile(group, previous, covering)
        and (principals is None or group.principal(previous) in principals)
        and (previous not in excluded or first_eligible is None)
    ):
        return Selection(name, version, previous)
    chosen = first_eligible or group.smallest(covering, lambda _m: False, principals)
    if chosen is None:
        public = (
            f"no member of a principal that {ASSIGNOR_PRINCIPALS} lists can compute: only "
            f"{_listed(principals)} may be the assignor member, and no such member covers "
            "every other member's version range; the group stays ASSIGNING until one joins"
        )
        return NoSelection(public, public)
    return Selection(name, version, chosen)


def _listed(principals: frozenset[str] | None) -> str:
    shown = sorted(principals or ())
    text = ", ".join(repr(p) for p in shown[:_EXAMPLES])
    return text + (f" (+{len(shown) - _EXAMPLES} more)" if len(shown) > _EXAMPLES else "")


def _has_profile(group: GroupProfiles, member_id: str, profiles: list[Profile]) -> bool:
    if member_id in group.extra:
        return group.extra[member_id] in profiles
    if member_id in group.hidden:
        return False
    return group.lookup(member_id) in profiles


def select(
    members: Iterable[Member],
    previous_assignor_member: str | None = None,
    excluded: frozenset[str] = frozenset(),
    principals: frozenset[str] | None = None,
) -> Selection | NoSelection:
    """`select_with` over a plain collection of members (O(members log members))."""
    index = SelectionIndex()
    profiles: dict[str, Profile] = {}
    owners: dict[str, str] = {}
    for member in members:
        profile = profile_of(member)
        profiles[member.member_id] = profile
        owners[member.member_id] = member.principal
        index.add(member.member_id, profile, member.principal)
    group = GroupProfiles(index, frozenset(), {}, profiles.get, {}, owners.get)
    return select_with(group, previous_assignor_member, excluded, principals)
