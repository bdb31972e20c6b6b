"""Incremental assignor selection against the frozen quadratic one (issue 10): identical choices
on random groups, both through `select` and through a `GroupChange` over a committed state (the
index of the state plus the change's own members)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.messages import Assignor
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.model import (
    GroupConfigDefaults,
    GroupMeta,
    GroupState,
    Member,
    MemberState,
    TargetAssignment,
)
from coordinator_svc.core.selection import NoSelection, Selection, select, select_with
from tests.core.frozen import selection_v1 as frozen

IDS = [f"w{i:02d}" for i in range(12)]
NAMES = ["eager", "incremental_cooperative", "x"]


@st.composite
def assignor_lists(draw: st.DrawFn) -> tuple[Assignor, ...]:
    names = draw(st.lists(st.sampled_from(NAMES), min_size=0, max_size=3, unique=True))
    out = []
    for name in names:
        low = draw(st.integers(0, 3))
        high = draw(st.integers(low, 4))
        out.append(Assignor(name, low, high, version=high))
    return tuple(out)


@st.composite
def members(draw: st.DrawFn) -> list[Member]:
    ids = draw(st.lists(st.sampled_from(IDS), min_size=0, max_size=10, unique=True))
    # Few distinct lists, as in real groups: members share them.
    pool = draw(st.lists(assignor_lists(), min_size=1, max_size=3))
    return [
        Member(
            member_id=member_id,
            member_epoch=1,
            assignors=draw(st.sampled_from(pool)),
            state=draw(st.sampled_from([MemberState.STABLE, MemberState.LEFT])),
        )
        for member_id in ids
    ]


def same(new: Selection | NoSelection, old: frozen.Selection | frozen.NoSelection) -> bool:
    if isinstance(new, NoSelection) or isinstance(old, frozen.NoSelection):
        return isinstance(new, NoSelection) and isinstance(old, frozen.NoSelection)
    return (new.assignor_name, new.version, new.assignor_member_id) == (
        old.assignor_name,
        old.version,
        old.assignor_member_id,
    )


@settings(max_examples=1500, deadline=None)
@given(
    members(),
    st.one_of(st.none(), st.sampled_from(IDS)),
    st.frozensets(st.sampled_from(IDS), max_size=4),
)
def test_select_chooses_what_the_quadratic_selection_chose(
    group: list[Member], previous: str | None, excluded: frozenset[str]
) -> None:
    assert same(select(group, previous, excluded), frozen.select(group, previous, excluded))


@settings(max_examples=1000, deadline=None)
@given(
    members(),
    members(),
    st.lists(st.sampled_from(IDS), max_size=4),
    st.one_of(st.none(), st.sampled_from(IDS)),
    st.frozensets(st.sampled_from(IDS), max_size=3),
)
def test_a_change_over_the_committed_index_chooses_what_the_quadratic_selection_chose(
    committed: list[Member],
    changed: list[Member],
    removed: list[str],
    previous: str | None,
    excluded: frozenset[str],
) -> None:
    state = GroupState(GroupMeta("g", 3, assignor_member_id=previous), TargetAssignment(3))
    for member in committed:
        state.put_member(member)
    change = GroupChange(state, "g", 0, GroupConfigDefaults())
    for member in changed[:4]:
        change.put_member(member)
    for member_id in removed:
        change.remove_member(member_id)
    present = change.members()
    left = frozenset(m for m, member in present.items() if member.state is MemberState.LEFT)

    new = select_with(change.profiles(), previous, excluded | change.left_members())

    assert change.left_members() == left
    assert change.member_count() == len(present)
    assert same(new, frozen.select(present.values(), previous, excluded | left))


def test_removing_members_keeps_the_index_exact() -> None:
    state = GroupState(GroupMeta("g", 1), TargetAssignment(1))
    a = (Assignor("incremental_cooperative", 1, 2),)
    for i in range(200):
        state.put_member(Member(f"m{i:03d}", 1, assignors=a))
    for i in range(0, 199):
        state.remove_member(f"m{i:03d}")
    result = select_with(
        GroupChange(state, "g", 0, GroupConfigDefaults()).profiles(), None, frozenset()
    )
    assert isinstance(result, Selection)
    assert result.assignor_member_id == "m199"
    assert dict(state.selection_index.counts) == {(("incremental_cooperative", 1, 2),): 1}


# --- with assignor.principals (issue 23) --------------------------------------------------------

PRINCIPALS = ["", "User:a", "User:b", "User:c"]


def reference(
    group: list[Member],
    previous: str | None,
    excluded: frozenset[str],
    principals: frozenset[str] | None,
) -> frozen.Selection | frozen.NoSelection:
    """The frozen selection, with the assignor member chosen among the covering members of a
    listed principal (DESIGN 3.4): the same rules, quadratic, over the filtered list."""
    old = frozen.select(group, previous, excluded)
    if principals is None or isinstance(old, frozen.NoSelection):
        return old
    ordered = sorted(group, key=lambda m: m.member_id)
    ranges = [m.assignor(old.assignor_name) for m in ordered]
    covering = [
        m
        for m, mine in zip(ordered, ranges, strict=True)
        if mine is not None and all(other is not None and mine.covers(other) for other in ranges)
    ]
    allowed = [m for m in covering if m.principal in principals]
    if not allowed:
        return frozen.NoSelection("no listed principal's member covers every range")
    eligible = [m for m in allowed if m.member_id not in excluded] or allowed
    chosen = next((m for m in eligible if m.member_id == previous), eligible[0])
    return frozen.Selection(old.assignor_name, old.version, chosen.member_id)


@st.composite
def members_of_principals(draw: st.DrawFn) -> list[Member]:
    return [
        replace(member, principal=draw(st.sampled_from(PRINCIPALS))) for member in draw(members())
    ]


listed = st.one_of(st.none(), st.frozensets(st.sampled_from(PRINCIPALS[1:]), min_size=1))


@settings(max_examples=300, deadline=None)
@given(
    members_of_principals(),
    st.one_of(st.none(), st.sampled_from(IDS)),
    st.frozensets(st.sampled_from(IDS), max_size=4),
    listed,
)
def test_select_with_a_principal_list_chooses_what_the_reference_chose(
    group: list[Member],
    previous: str | None,
    excluded: frozenset[str],
    principals: frozenset[str] | None,
) -> None:
    assert same(
        select(group, previous, excluded, principals),
        reference(group, previous, excluded, principals),
    )


@settings(max_examples=300, deadline=None)
@given(
    members_of_principals(),
    members_of_principals(),
    st.lists(st.sampled_from(IDS), max_size=4),
    st.one_of(st.none(), st.sampled_from(IDS)),
    st.frozensets(st.sampled_from(IDS), max_size=3),
    listed,
)
def test_a_change_with_a_principal_list_chooses_what_the_reference_chose(
    committed: list[Member],
    changed: list[Member],
    removed: list[str],
    previous: str | None,
    excluded: frozenset[str],
    principals: frozenset[str] | None,
) -> None:
    """Also members whose principal changed (adopted) in the change or in the committed
    state: the index keeps each member under its current principal."""
    state = GroupState(GroupMeta("g", 3, assignor_member_id=previous), TargetAssignment(3))
    for member in committed:
        state.put_member(member)
    for member in committed[::3]:
        state.put_member(replace(member, principal="User:a"))  # re-indexed in the state
    change = GroupChange(state, "g", 0, GroupConfigDefaults())
    for member in changed[:4]:
        change.put_member(member)
    for member_id in removed:
        change.remove_member(member_id)
    present = change.members()
    left = frozenset(m for m, member in present.items() if member.state is MemberState.LEFT)

    new = select_with(change.profiles(), previous, excluded | left, principals)

    assert same(new, reference(list(present.values()), previous, excluded | left, principals))
