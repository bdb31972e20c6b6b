"""One test per branch of `reconciliation.reconcile` (DESIGN 3.11), comparing whole Members, after
Kafka's CurrentAssignmentBuilderTest."""

from __future__ import annotations

from dataclasses import replace

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core.model import Member, MemberState
from coordinator_svc.core.reconciliation import (
    IsFree,
    acknowledges_revocation,
    free_in,
    reconcile,
)
from tests.core.harness import rs


def everything_free(resources: ResourceSet) -> ResourceSet:
    return resources


def held_elsewhere(*taken: str) -> IsFree:
    """Resources in `taken` are held by some other member (or a hold)."""
    busy = rs(*taken)

    def free(resources: ResourceSet) -> ResourceSet:
        return resources - busy

    return free


def member(
    epoch: int = 10,
    *,
    previous: int = 9,
    state: MemberState = MemberState.STABLE,
    assigned: ResourceSet = EMPTY,
    pending: ResourceSet = EMPTY,
) -> Member:
    return Member(
        member_id="w1",
        member_epoch=epoch,
        previous_epoch=previous,
        rebalance_timeout_ms=500,
        state=state,
        assigned=assigned,
        pending_revocation=pending,
    )


# --- the three phases --------------------------------------------------------------------------


def test_member_with_resources_to_revoke_stays_at_its_epoch_and_keeps_the_intersection() -> None:
    before = member(10, assigned=rs("A", "A-0", "B", "B-0"))

    after = reconcile(before, 11, rs("A", "A-0", "C"), rs("A", "A-0", "B", "B-0"), everything_free)

    assert after == member(
        10,
        state=MemberState.UNREVOKED,
        assigned=rs("A", "A-0"),
        pending=rs("B", "B-0"),
    )


def test_revoking_member_is_not_given_new_resources_in_the_same_step() -> None:
    before = member(10, assigned=rs("A", "B"))

    after = reconcile(before, 11, rs("A", "C"), None, everything_free)

    assert after.assigned == rs("A")
    assert after.pending_revocation == rs("B")
    assert "C" not in after.owned.connectors


def test_member_with_nothing_to_revoke_moves_to_the_target_epoch_with_every_free_resource() -> None:
    before = member(10, previous=9, assigned=rs("A"))

    after = reconcile(before, 11, rs("A", "B", "B-0"), rs("A"), everything_free)

    assert after == member(11, previous=10, assigned=rs("A", "B", "B-0"))


def test_member_with_nothing_to_revoke_moves_on_without_resources_others_hold() -> None:
    before = member(10, assigned=rs("A"))

    after = reconcile(before, 11, rs("A", "B", "B-0"), rs("A"), held_elsewhere("B"))

    assert after == member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A", "B-0"))


def test_member_that_gets_nothing_it_wants_still_moves_to_the_target_epoch() -> None:
    before = member(10, assigned=EMPTY)

    after = reconcile(before, 11, rs("B", "B-0"), EMPTY, held_elsewhere("B", "B-0"))

    assert after == member(11, previous=10, state=MemberState.UNRELEASED, assigned=EMPTY)


def test_unreleased_member_gets_a_resource_once_it_is_released() -> None:
    before = member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A"))

    after = reconcile(before, 11, rs("A", "B"), rs("A"), everything_free)

    assert after == member(11, previous=10, state=MemberState.STABLE, assigned=rs("A", "B"))


def test_unreleased_member_gets_what_is_released_and_keeps_waiting_for_the_rest() -> None:
    before = member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A"))

    after = reconcile(before, 11, rs("A", "B", "C"), rs("A"), held_elsewhere("C"))

    assert after == member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A", "B"))


def test_unreleased_member_whose_resources_are_still_held_is_returned_unchanged() -> None:
    before = member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A"))

    after = reconcile(before, 11, rs("A", "B"), rs("A"), held_elsewhere("B"))

    assert after is before


def test_unreleased_member_whose_new_target_drops_a_resource_must_revoke_it_first() -> None:
    before = member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A", "B"))

    after = reconcile(before, 12, rs("B", "C"), rs("A", "B"), everything_free)

    assert after == member(
        11, previous=10, state=MemberState.UNREVOKED, assigned=rs("B"), pending=rs("A")
    )


def test_stable_member_at_its_target_is_returned_unchanged() -> None:
    before = member(11, assigned=rs("A", "A-0"))

    after = reconcile(before, 11, rs("A", "A-0"), rs("A", "A-0"), everything_free)

    assert after is before


def test_stable_member_moves_to_a_new_target_epoch_with_the_same_resources() -> None:
    before = member(11, previous=10, assigned=rs("A"))

    after = reconcile(before, 12, rs("A"), rs("A"), everything_free)

    assert after == member(12, previous=11, assigned=rs("A"))


def test_a_stable_member_needs_no_owned_list_to_move_on() -> None:
    before = member(11, previous=10, assigned=rs("A"))

    after = reconcile(before, 12, rs("A", "B"), None, everything_free)

    assert after == member(12, previous=11, assigned=rs("A", "B"))


# --- acknowledging revocations ---------------------------------------------------------------


def test_unrevoked_member_without_an_owned_list_never_acknowledges() -> None:
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B"))

    after = reconcile(before, 11, rs("A"), None, everything_free)

    assert after is before


def test_unrevoked_member_still_owning_part_of_its_revocation_releases_the_rest_and_stays() -> None:
    """Partial release (DESIGN 3.11): what the owned list no longer holds goes at once; the
    member stays UNREVOKED at its epoch for the rest."""
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B", "B-0"))

    after = reconcile(before, 11, rs("A"), rs("A", "B-0"), everything_free)

    assert after == replace(before, pending_revocation=rs("B-0"))
    assert after.state is MemberState.UNREVOKED and after.member_epoch == 10


def test_unrevoked_member_still_owning_all_of_its_revocation_is_unchanged() -> None:
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B", "B-0"))

    after = reconcile(before, 11, rs("A"), rs("A", "B", "B-0"), everything_free)

    assert after is before


def test_unrevoked_member_that_acknowledges_moves_to_the_target_epoch() -> None:
    before = member(10, previous=9, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B"))

    after = reconcile(before, 11, rs("A", "C"), rs("A"), everything_free)

    assert after == member(11, previous=10, assigned=rs("A", "C"))


def test_acknowledging_member_is_reconciled_against_the_latest_target_and_may_revoke() -> None:
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A", "C"), pending=rs("B"))

    after = reconcile(before, 12, rs("C"), rs("A", "C"), everything_free)

    assert after == member(10, state=MemberState.UNREVOKED, assigned=rs("C"), pending=rs("A"))


def test_acknowledging_member_waits_for_target_resources_others_still_hold() -> None:
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B"))

    after = reconcile(before, 11, rs("A", "C"), rs("A"), held_elsewhere("C"))

    assert after == member(11, previous=10, state=MemberState.UNRELEASED, assigned=rs("A"))


def test_an_owned_list_reporting_nothing_acknowledges_a_revocation() -> None:
    before = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B"))

    after = reconcile(before, 11, rs("A"), EMPTY, everything_free)

    assert after == member(11, previous=10, assigned=rs("A"))


def test_a_member_in_another_state_with_a_pending_revocation_is_left_alone() -> None:
    before = member(10, state=MemberState.UNRELEASED, assigned=rs("A"), pending=rs("B"))

    after = reconcile(before, 11, rs("A", "C"), EMPTY, everything_free)

    assert after is before


def test_a_static_member_that_left_is_never_reconciled() -> None:
    before = member(10, state=MemberState.LEFT, assigned=rs("A", "B"))

    after = reconcile(before, 11, rs("C"), EMPTY, everything_free)

    assert after is before


def test_acknowledges_revocation_needs_an_owned_list_disjoint_from_the_pending_revocation() -> None:
    unrevoked = member(10, state=MemberState.UNREVOKED, assigned=rs("A"), pending=rs("B", "B-1"))

    assert acknowledges_revocation(unrevoked, rs("A"))
    assert acknowledges_revocation(unrevoked, EMPTY)
    assert not acknowledges_revocation(unrevoked, None)
    assert not acknowledges_revocation(unrevoked, rs("A", "B-1"))
    assert not acknowledges_revocation(member(10, assigned=rs("A")), EMPTY)


def test_free_in_treats_resources_owned_by_nobody_or_by_the_member_itself_as_free() -> None:
    owners: dict[str, str] = {"A": "w1", "B": "w2", "C": "hold:w3"}
    task_owners = {TaskId("A", 0): "w2", TaskId("A", 1): "w1"}
    free = free_in("w1", owners.get, task_owners.get)

    assert free(rs("A", "B", "C", "D", "A-0", "A-1", "A-2")) == rs("A", "D", "A-1", "A-2")
