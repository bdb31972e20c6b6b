"""A classic group's volatile round (issue 25 P0, DESIGN 3.19): a handler edits it through its
`GroupChange` (reads see the edits at once), the edits become one `ClassicRoundRecord` delta,
replay applies it in place, and an `Undo` takes it back exactly, as it does every other record
of a failed batch (DESIGN 3.21)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator_svc.core import replay
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import (
    ClassicGroupMeta,
    ClassicRound,
    ClassicState,
    GroupType,
    PendingId,
    RoundDelta,
)
from coordinator_svc.core.model import GroupConfigDefaults, GroupMeta, GroupState
from coordinator_svc.core.records import ClassicRoundRecord, GroupMetaRecord

GROUP = "classic"
DEFAULTS = GroupConfigDefaults()
MEMBERS = ("w1", "w2", "w3", "w4")


def classic_group() -> GroupState:
    meta = GroupMeta(
        GROUP,
        group_epoch=3,
        group_type=GroupType.CLASSIC,
        classic=ClassicGroupMeta(ClassicState.PREPARING_REBALANCE),
    )
    return replay.new_state([GroupMetaRecord(meta)])


def pending(n: int) -> PendingId:
    return PendingId("User:w", 10_000, 1_000 + n)


def commit(state: GroupState, change: GroupChange, undo: replay.Undo | None = None) -> None:
    for record in change.records():
        replay.apply(state, record, undo)


def snapshot(state: GroupState) -> dict[str, Any] | None:
    return None if state.round is None else state.round.snapshot()


def test_a_join_is_one_small_delta_and_reads_see_it_before_it_is_applied() -> None:
    state = classic_group()
    change = GroupChange(state, GROUP, 0, DEFAULTS)
    assert change.join_round("w1") == 0
    assert change.join_round("w2") == 1
    assert change.join_round("w1") == 0  # a second join keeps its order
    change.put_pending_id("p1", pending(1))
    change.set_round(reason="member joined", initial=True)
    assert change.round.joined() == {"w1": 0, "w2": 1}
    assert change.round.pending("p1") == pending(1) and change.round.has_pending_ids()
    assert state.round is None  # nothing applied yet
    (record,) = change.records()
    assert isinstance(record, ClassicRoundRecord)
    assert dict(record.delta.joined) == {"w1": 0, "w2": 1}
    assert dict(record.delta.scalars) == {"join_seq": 2, "reason": "member joined", "initial": True}
    replay.apply(state, record)
    assert state.round is not None
    assert state.round.joined == {"w1": 0, "w2": 1} and state.round.join_seq == 2
    assert state.round.pending_ids == {"p1": pending(1)}


def test_a_change_that_leaves_the_round_as_it_was_writes_no_record() -> None:
    state = classic_group()
    change = GroupChange(state, GROUP, 0, DEFAULTS)
    change.set_round(reason="")  # the value it has
    assert change.records() == []


def test_the_undo_of_the_first_round_record_leaves_no_round() -> None:
    state = classic_group()
    change = GroupChange(state, GROUP, 0, DEFAULTS)
    change.join_round("w1")
    undo = replay.Undo()
    commit(state, change, undo)
    assert state.round is not None
    undo.rollback(state)
    assert state.round is None


def test_a_completion_replaces_the_sync_sets_and_its_undo_restores_them() -> None:
    state = classic_group()
    first = GroupChange(state, GROUP, 0, DEFAULTS)
    for m in MEMBERS:
        first.join_round(m)
    first.set_sync_sets(parked=["w4"])
    commit(state, first)
    before = snapshot(state)

    completion = GroupChange(state, GROUP, 1, DEFAULTS)
    completion.clear_round()
    completion.set_sync_sets(awaiting=["w1", "w2"], synced=["w2"], parked=["w1"])
    assert completion.round.joined() == {}
    assert completion.round.awaiting_sync() == {"w1"}
    assert completion.round.parked_sync() == {"w1"}
    undo = replay.Undo()
    commit(state, completion, undo)
    assert state.round is not None
    assert (state.round.joined, state.round.awaiting_sync, state.round.parked_sync) == (
        {},
        {"w1"},
        {"w1"},
    )
    undo.rollback(state)
    assert snapshot(state) == before


def test_a_delta_names_only_fields_of_a_round() -> None:
    try:
        RoundDelta(scalars={"generation": 3})
    except ValueError as error:
        assert "generation" in str(error)
    else:
        raise AssertionError("an unknown field was accepted")


Op = tuple[str, str]
ops = st.lists(
    st.tuples(
        st.sampled_from(
            ["join", "unjoin", "clear", "put", "drop", "await", "sync", "park", "unpark", "reason"]
        ),
        st.sampled_from(MEMBERS),
    ),
    max_size=12,
)


def run(change: GroupChange, batch: list[Op]) -> None:
    for op, m in batch:
        if op == "join":
            change.join_round(m)
        elif op == "unjoin":
            change.round.unjoin(m)
        elif op == "clear":
            change.clear_round()
        elif op == "put":
            change.put_pending_id(m, pending(len(m)))
        elif op == "drop":
            change.drop_pending_id(m)
        elif op == "await":
            change.set_sync_sets(awaiting=[x for x in MEMBERS if x >= m])
        elif op == "sync":
            change.set_sync_sets(synced=[m])
        elif op == "park":
            change.set_sync_sets(parked=[m])
        elif op == "unpark":
            change.set_sync_sets(unparked=[m])
        else:
            change.set_round(reason=f"because {m}")


def view(change: GroupChange) -> dict[str, Any]:
    r = change.round
    return {
        "joined": r.joined(),
        "pending_ids": r.pending_ids(),
        "awaiting_sync": r.awaiting_sync(),
        "parked_sync": r.parked_sync(),
        "reason": r.reason,
        "has_pending": r.has_pending_ids(),
        "each": {
            m: (r.joined_seq(m), r.pending(m), r.is_awaiting_sync(m), r.is_parked(m))
            for m in MEMBERS
        },
    }


def view_of(state: GroupState) -> dict[str, Any]:
    return view(GroupChange(state, GROUP, 0, DEFAULTS))


@settings(max_examples=60, deadline=None)
@given(st.lists(ops, min_size=1, max_size=4))
def test_applied_deltas_match_the_changes_view_and_undo_takes_them_back(
    batches: list[list[Op]],
) -> None:
    """Whatever the edits: replaying a change's delta gives the round the change showed, and
    the undo log of a batch of changes restores the round before it exactly."""
    state = classic_group()
    committed, *failed = batches
    change = GroupChange(state, GROUP, 0, DEFAULTS)
    run(change, committed)
    shown = view(change)
    commit(state, change)
    assert view_of(state) == shown
    before = snapshot(state)
    undo = replay.Undo()
    for batch in failed:
        change = GroupChange(state, GROUP, 0, DEFAULTS)
        run(change, batch)
        shown = view(change)
        commit(state, change, undo)
        assert view_of(state) == shown
    undo.rollback(state)
    assert snapshot(state) == before


def test_a_fresh_round_is_idle() -> None:
    assert ClassicRound().is_idle()
