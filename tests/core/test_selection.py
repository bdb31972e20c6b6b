"""Assignor selection and the choice of the assignor member (DESIGN 3.4, 3.15)."""

from __future__ import annotations

from connect_protocol.messages import Assignor
from coordinator_svc.core.model import Member
from coordinator_svc.core.selection import NoSelection, Selection, select
from tests.core.harness import COMPATIBLE, EAGER, SESSIONED


def m(member_id: str, *assignors: Assignor) -> Member:
    return Member(member_id=member_id, member_epoch=1, assignors=assignors)


def a(name: str, low: int = 0, high: int = 0) -> Assignor:
    return Assignor(name, low, high, version=high)


def test_the_only_assignor_every_member_lists_is_selected() -> None:
    members = [m("w1", a("x"), a("y")), m("w2", a("y"))]

    assert select(members) == Selection("y", 0, "w1")


def test_an_assignor_not_listed_by_every_member_is_no_candidate() -> None:
    members = [m("w1", a("x")), m("w2", a("y"))]

    result = select(members)

    assert isinstance(result, NoSelection)
    assert "no client assignor is supported by every member" in result.reason
    assert "'w1': ['x']" in result.reason


def test_an_assignor_whose_version_ranges_do_not_overlap_is_no_candidate() -> None:
    members = [m("w1", a("x", 1, 2)), m("w2", a("x", 3, 4))]

    assert isinstance(select(members), NoSelection)


def test_each_member_votes_for_its_most_preferred_candidate_and_most_votes_win() -> None:
    members = [m("w1", a("a"), a("b")), m("w2", a("b"), a("a")), m("w3", a("b"), a("a"))]

    result = select(members)

    assert isinstance(result, Selection)
    assert result.assignor_name == "b"


def test_a_member_votes_for_its_first_candidate_skipping_names_others_lack() -> None:
    members = [m("w1", a("only-mine"), a("b"), a("a")), m("w2", a("a"), a("b"))]

    result = select(members)

    # w1 votes b (its first candidate), w2 votes a: a tie, broken by name.
    assert isinstance(result, Selection)
    assert result.assignor_name == "a"


def test_a_tie_in_votes_is_broken_by_name() -> None:
    members = [m("w1", a("zeta"), a("alpha")), m("w2", a("alpha"), a("zeta"))]

    result = select(members)

    assert isinstance(result, Selection)
    assert result.assignor_name == "alpha"


def test_the_assignor_member_covers_every_other_members_version_range() -> None:
    # Seed 000: A[1-5], B[3-4], C[2-4] selects A, wherever A sorts.
    members = [m("wa", a("x", 3, 4)), m("wb", a("x", 2, 4)), m("wc", a("x", 1, 5))]

    assert select(members) == Selection("x", 4, "wc")


def test_the_selected_version_is_the_highest_every_member_supports() -> None:
    members = [m("w1", a("x", 1, 5)), m("w2", a("x", 3, 4)), m("w3", a("x", 2, 4))]

    result = select(members)

    assert isinstance(result, Selection)
    assert result.version == 4


def test_among_covering_members_the_first_by_id_is_chosen() -> None:
    members = [m("w2", a("x", 1, 2)), m("w1", a("x", 1, 2))]

    assert select(members) == Selection("x", 2, "w1")


def test_the_previous_assignor_member_is_kept_while_it_qualifies() -> None:
    members = [m("w1", a("x", 1, 2)), m("w2", a("x", 1, 2)), m("w3", a("x", 1, 2))]

    assert select(members, previous_assignor_member="w3") == Selection("x", 2, "w3")


def test_the_previous_assignor_member_is_dropped_once_it_no_longer_covers_everyone() -> None:
    members = [m("w1", a("x", 1, 3)), m("w2", a("x", 1, 2)), m("w3", a("x", 1, 3))]

    assert select(members, previous_assignor_member="w2") == Selection("x", 2, "w1")


def test_an_excluded_member_is_passed_over_when_another_covers_everyone() -> None:
    members = [m("w1", a("x", 1, 2)), m("w2", a("x", 1, 2))]

    result = select(members, previous_assignor_member="w1", excluded=frozenset({"w1"}))

    assert result == Selection("x", 2, "w2")


def test_an_excluded_member_is_still_chosen_when_it_is_the_only_one_that_covers() -> None:
    members = [m("w1", a("x", 1, 3)), m("w2", a("x", 1, 2))]

    assert select(members, excluded=frozenset({"w1"})) == Selection("x", 2, "w1")


def test_no_member_covering_every_range_means_no_selection_and_says_why() -> None:
    members = [m("w1", a("x", 1, 3)), m("w2", a("x", 2, 4))]

    result = select(members)

    assert isinstance(result, NoSelection)
    assert "covers every other member" in result.reason
    assert "[1-3]" in result.reason and "[2-4]" in result.reason


def test_a_group_without_members_has_no_selection() -> None:
    assert select([]) == NoSelection("the group has no members")


def test_compatible_and_sessioned_members_run_version_1_computed_by_the_sessioned_member() -> None:
    members = [m("w1", *COMPATIBLE), m("w2", *SESSIONED), m("w3", *COMPATIBLE)]

    assert select(members) == Selection("incremental_cooperative", 1, "w2")


def test_a_group_of_sessioned_members_runs_version_2() -> None:
    members = [m("w1", *SESSIONED), m("w2", *SESSIONED)]

    assert select(members) == Selection("incremental_cooperative", 2, "w1")


def test_one_eager_only_member_makes_the_group_fall_back_to_eager() -> None:
    members = [m("w1", *SESSIONED), m("w2", *EAGER), m("w3", *COMPATIBLE)]

    assert select(members) == Selection("eager", 0, "w1")


def test_an_id_removed_and_added_again_is_listed_once() -> None:
    """A leave and rejoin (or an undone removal) leaves the id's old heap entry behind; the
    smallest ids must still name it once."""
    from coordinator_svc.core.selection_index import _IdHeap

    members = _IdHeap()
    for member_id in ("a", "b", "c"):
        members.add(member_id)
    members.remove("a")
    members.add("a")
    assert members.smallest(lambda _m: False, limit=3) == ["a", "b", "c"]
    assert members.smallest(lambda _m: False, limit=3) == ["a", "b", "c"]
