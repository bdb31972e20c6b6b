"""Epoch-only moves at install and the heartbeat that follows them (DESIGN 3.21), one test per
case: who is moved, what is recorded, `stable_since_epoch`, and which old epochs are accepted."""

from __future__ import annotations

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import EMPTY
from coordinator_svc.core.model import GroupStatus, MemberState
from coordinator_svc.core.records import EventType, MemberRecord, MembersMovedRecord
from tests.core.harness import W1_SHARE, W2_SHARE, GroupHarness, rs, stable_group


def moved_twice() -> GroupHarness:
    """`stable_group` (w1, w2 STABLE at 5), then two catalogue changes each installed with every
    share kept (the new connector unassigned behind a delay): both moved 5 -> 6 -> 7 without a
    heartbeat."""
    h = stable_group()
    for name in ("X", "Y"):
        h.put_connector(name, 0)
        h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE}, delay_ms=1_000)
    assert (h.group_epoch, h.assignment_epoch) == (7, 7)
    return h


def test_an_install_moves_the_unchanged_members_in_one_record_and_names_them() -> None:
    h = stable_group()
    h.put_connector("X", 0)
    h.prepare("w1")

    h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE}, delay_ms=1_000)

    moved = [r for r in h.records_of_last_call if isinstance(r, MembersMovedRecord)]
    assert moved == [MembersMovedRecord("g", ("w1", "w2"), 6)]
    assert not [r for r in h.records_of_last_call if isinstance(r, MemberRecord)]
    [installed] = h.last_events(EventType.TARGET_INSTALLED)
    assert installed.payload["moved_members"] == ["w1", "w2"]
    w2 = h.member("w2")
    assert (w2.member_epoch, w2.previous_epoch, w2.stable_since_epoch) == (6, 3, 5)
    assert h.status() is GroupStatus.STABLE
    assert h.dump() == h.rebuilt()


def test_a_member_whose_share_changes_is_not_moved() -> None:
    h = stable_group()
    h.put_connector("X", 0)
    h.prepare("w1")

    h.install("w1", {"w1": W1_SHARE, "w2": W2_SHARE | rs("X")})

    [installed] = h.last_events(EventType.TARGET_INSTALLED)
    assert installed.payload["moved_members"] == ["w1"]
    assert h.member("w2").member_epoch == 5
    assert h.status() is GroupStatus.RECONCILING


def test_a_member_with_resources_pending_revocation_is_not_moved() -> None:
    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")})
    h.keepalive("w1")  # UNREVOKED at 5: A-1 to give up
    assert h.member("w1").state is MemberState.UNREVOKED
    h.put_connector("X", 0)
    h.prepare("w1")

    h.install("w1", {"w1": rs("A", "A-0"), "w2": W2_SHARE, "w3": rs("A-1")}, delay_ms=1_000)

    [installed] = h.last_events(EventType.TARGET_INSTALLED)
    assert installed.payload["moved_members"] == ["w2"]  # w3 waits for A-1: UNRELEASED
    assert h.member("w1").member_epoch == 5


def test_a_moved_member_heartbeating_at_its_old_epoch_is_answered_its_epoch_and_nothing_is_written(
) -> None:  # fmt: skip
    h = moved_twice()
    before = h.dump()

    response = h.heartbeat("w2", 5, owned=W2_SHARE)

    assert response.error_code == ErrorCode.NONE
    assert response.member_epoch == 7
    assert response.assignment is None  # what it reports is what it runs
    assert h.records_of_last_call == []
    assert h.dump() == before


def test_a_moved_member_that_reports_another_owned_list_is_sent_its_assignment() -> None:
    h = moved_twice()

    response = h.heartbeat("w2", 5, owned=rs("B"))

    assert response.member_epoch == 7
    assert response.assignment is not None and response.assignment.resources == W2_SHARE
    assert h.records_of_last_call == []


def test_a_moved_member_without_an_owned_list_is_accepted_too() -> None:
    h = moved_twice()
    response = h.heartbeat("w2", 6)
    assert (response.error_code, response.member_epoch) == (ErrorCode.NONE, 7)


def test_an_epoch_below_the_one_it_was_told_its_assignment_at_is_fenced() -> None:
    h = moved_twice()
    assert h.member("w2").stable_since_epoch == 5
    response = h.heartbeat("w2", 4, owned=W2_SHARE)
    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH
    assert not h.has_member("w2")


def test_an_epoch_above_the_members_is_fenced() -> None:
    h = moved_twice()
    response = h.heartbeat("w2", 8, owned=W2_SHARE)
    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH


@pytest.mark.parametrize("old", [5, 6, 7])
def test_a_member_whose_assignment_changed_is_not_accepted_at_an_epoch_before_the_change(
    old: int,
) -> None:
    h = moved_twice()
    h.put_connector("Z", 0)
    h.compute(
        "w1", {"w1": W1_SHARE, "w2": W2_SHARE | rs("Z")}, delay_ms=1_000
    )  # epoch 8: w2 gets Z
    assert h.heartbeat("w2", 7, owned=W2_SHARE).member_epoch == 8  # told Z at 8
    assert h.member("w2").stable_since_epoch == 8

    response = h.heartbeat("w2", old, owned=W2_SHARE)

    assert response.error_code == ErrorCode.FENCED_MEMBER_EPOCH or old == 7  # 7: lost response
    if old == 7:  # its previous epoch, owning a subset of its assignment (DESIGN 3.12)
        assert response.assignment is not None


def test_a_member_removed_and_back_is_not_accepted_at_an_epoch_of_before() -> None:
    h = moved_twice()
    h.leave("w2")
    h.join("w2", owned=EMPTY)
    epoch = h.member("w2").member_epoch
    assert h.member("w2").stable_since_epoch == epoch == 7

    assert h.heartbeat("w2", 6, owned=EMPTY).error_code == ErrorCode.FENCED_MEMBER_EPOCH


def test_the_lost_response_rule_still_holds_after_a_move() -> None:
    """w2 was told W2_SHARE at 5 (from 3); that answer lost, it retries at 3 after two moves."""
    h = moved_twice()
    response = h.heartbeat("w2", 3, owned=W2_SHARE)
    assert (response.error_code, response.member_epoch) == (ErrorCode.NONE, 7)
    assert response.assignment is not None and response.assignment.resources == W2_SHARE


def test_stable_since_moves_with_what_the_member_is_told_not_with_its_epoch() -> None:
    h = moved_twice()
    h.put_connector("Z", 0)
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE | rs("Z")}, delay_ms=1_000)
    h.heartbeat("w2", 5, owned=W2_SHARE)  # accepted: reconciled onto 8 with Z
    w2 = h.member("w2")
    assert (w2.member_epoch, w2.stable_since_epoch) == (8, 8)
    assert w2.assigned == W2_SHARE | rs("Z")
    assert h.dump() == h.rebuilt()


def test_a_group_whose_install_moved_every_member_is_stable_at_once() -> None:
    """The moved members are settled at the install (GroupState.status keeps its set of
    unsettled members in step with the move), as a group loaded from the records says too."""
    from coordinator_svc.core import replay

    h = stable_group()
    h.join("w3")
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": rs()})
    assert h.state is not None
    assert h.status() is GroupStatus.STABLE
    assert replay.new_state(h.log).status() is GroupStatus.STABLE
