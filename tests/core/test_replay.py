"""Replay: the one way state changes, for live writes and for loading after a takeover. Its
invariant checks fail loudly (IllegalStateError) instead of letting a bug double-assign."""

from __future__ import annotations

from dataclasses import replace

import pytest

from connect_protocol.resources import EMPTY
from coordinator_svc.core import replay
from coordinator_svc.core.errors import IllegalStateError
from coordinator_svc.core.model import GroupMeta, Member, MemberState, TargetAssignment
from coordinator_svc.core.records import (
    ConnectorRecord,
    EventRecord,
    EventType,
    GroupMetaRecord,
    MemberRecord,
    MemberRemovedRecord,
    TargetRecord,
)
from tests.core.harness import GROUP, GroupHarness, rs, stable_group


def test_a_group_created_by_a_join_is_rebuilt_from_that_joins_records() -> None:
    # Regression: the join's batch holds group epoch 2 and target epoch 1; the placeholder
    # target of new_state must not make the real one look like a step down.
    h = GroupHarness()

    h.join("w1")

    state = replay.new_state(h.records_of_last_call)
    assert (state.group_epoch, state.assignment_epoch) == (2, 1)
    assert set(state.members) == {"w1"}


def test_a_group_is_rebuilt_from_its_records_exactly() -> None:
    h = stable_group()
    h.join("w3")
    h.heartbeat("w2", 99, owned=EMPTY)  # fenced: a hold
    h.leave("w3")

    assert h.rebuilt() == h.dump()


def test_new_state_needs_the_groups_metadata_first() -> None:
    with pytest.raises(IllegalStateError, match="must start with its metadata"):
        replay.new_state([MemberRecord(GROUP, Member("w1", 1))])
    with pytest.raises(IllegalStateError, match="no group metadata"):
        replay.new_state([EventRecord(GROUP, 1, EventType.GROUP_CREATED, 0)])


def test_replay_refuses_a_resource_owned_by_two_members_and_keeps_the_state() -> None:
    h = stable_group()
    assert h.state is not None
    before = h.dump()
    w1 = h.member("w1")

    with pytest.raises(IllegalStateError, match="would be owned by w1 and w2"):
        replay.apply(h.state, MemberRecord(GROUP, replace(w1, assigned=w1.assigned | rs("B"))))

    assert h.dump() == before


def test_replay_refuses_a_resource_both_assigned_and_pending_revocation() -> None:
    h = stable_group()
    assert h.state is not None
    w1 = h.member("w1")
    record = MemberRecord(
        GROUP, replace(w1, state=MemberState.UNREVOKED, pending_revocation=rs("A"))
    )

    with pytest.raises(IllegalStateError, match="both assigned and pending revocation"):
        replay.apply(h.state, record)


def test_replay_refuses_a_member_epoch_going_down() -> None:
    h = stable_group()
    assert h.state is not None
    w1 = h.member("w1")

    with pytest.raises(IllegalStateError, match="epoch of member w1 would go down: 5 -> 4"):
        replay.apply(h.state, MemberRecord(GROUP, replace(w1, member_epoch=4)))


def test_replay_refuses_a_group_epoch_going_down() -> None:
    h = stable_group()
    assert h.state is not None

    with pytest.raises(IllegalStateError, match="group epoch of g would go down"):
        replay.apply(h.state, GroupMetaRecord(replace(h.state.meta, group_epoch=4)))


def test_replay_refuses_an_assignment_epoch_going_down_or_ahead_of_the_group() -> None:
    h = stable_group()
    assert h.state is not None

    with pytest.raises(IllegalStateError, match="would go down"):
        replay.apply(h.state, TargetRecord(GROUP, TargetAssignment(4)))
    with pytest.raises(IllegalStateError, match="ahead of group epoch"):
        replay.apply(h.state, TargetRecord(GROUP, TargetAssignment(6)))


def test_a_removed_members_resources_can_be_owned_again() -> None:
    h = stable_group()
    assert h.state is not None
    w1 = h.member("w1")

    replay.apply(h.state, MemberRemovedRecord(GROUP, "w2"))
    replay.apply(h.state, MemberRecord(GROUP, replace(w1, assigned=w1.assigned | rs("B"))))

    assert h.state.connector_owner["B"] == "w1"


def test_records_of_a_config_only_connector_change_replay_to_the_new_config() -> None:
    h = stable_group()
    assert h.state is not None
    connector = h.state.catalogue["A"]

    replay.apply(h.state, ConnectorRecord(GROUP, replace(connector, config={"k": "v"})))

    assert dict(h.state.catalogue["A"].config) == {"k": "v"}


def test_new_state_starts_from_the_metadata_record() -> None:
    meta = GroupMeta(GROUP, group_epoch=7)

    state = replay.new_state([GroupMetaRecord(meta), TargetRecord(GROUP, TargetAssignment(7))])

    assert (state.group_epoch, state.assignment_epoch) == (7, 7)
    assert state.members == {}
