"""`replay.Undo`: the records of a batch, applied with an undo log, are taken back exactly (the
state and every index and running sum it keeps), at the cost of what they changed (DESIGN 3.21:
a failed commit no longer throws the group's state away)."""

from __future__ import annotations

from typing import Any

from coordinator_svc.core import replay
from coordinator_svc.core.model import GroupState
from coordinator_svc.core.results import Result
from tests.core.harness import W1_SHARE, W2_SHARE, GroupHarness, ok, rs, stable_group


class UndoHarness(GroupHarness):
    """Applies every record with an undo log (`undo`), as the runtime's group commit does."""

    undo: replay.Undo | None = None

    def _apply(self, result: Result[Any]) -> None:
        if self.undo is None or self.state is None:
            super()._apply(result)
            return
        for record in result.records:
            replay.apply(self.state, record, self.undo)
        self.log.extend(result.records)


def full_dump(state: GroupState) -> dict[str, Any]:
    """Everything the state holds, derived indexes and running sums included."""
    index = state.selection_index
    return {
        "meta": state.meta,
        "target": state.target,
        "members": dict(state.members),
        "catalogue": dict(state.catalogue),
        "configs": dict(state.configs),
        "connector_owner": dict(state.connector_owner),
        "task_owner": dict(state.task_owner),
        "instance_owner": dict(state.instance_owner),
        "left_members": set(state.left_members),
        "catalogue_resources": state.catalogue_resources(),
        "sums": (
            state.catalogue_wire_bytes,
            state.catalogue_tasks,
            state.catalogue_config_bytes,
            state.assignor_metadata_bytes,
        ),
        "selection_counts": dict(index.counts),
        "selection_members": {
            profile: index.smallest(profile, lambda _m: False, limit=100)
            for profile in index.counts
        },
        "selection_first": {
            profile: index.smallest(profile, lambda _m: False) for profile in index.counts
        },
    }


def undo_harness() -> UndoHarness:
    base = stable_group()
    h = UndoHarness(base.group_id, base.defaults, base.now_ms)
    h.state = replay.new_state(base.log)
    h.log = list(base.log)
    return h


def test_a_batch_of_every_kind_of_record_is_taken_back_exactly() -> None:
    h = undo_harness()
    assert h.state is not None
    before = full_dump(h.state)
    h.undo = undo = replay.Undo()
    records_before = len(h.log)
    ok(h.put_connector("C", 2, {"k": "v"}))  # a connector added: meta, catalogue, events
    ok(h.join("w3", instance_id="i-3"))  # a static member joins
    ok(h.alter_configs({"session.timeout.ms": "1500"}))
    h.compute(
        "w1", {"w1": rs("A", "A-0", "A-1"), "w2": rs("B", "B-0"), "w3": rs("C", "C-0", "C-1")}
    )
    ok(h.ack("w3"))  # w3 now owns C-0: the owner index changes
    ok(h.delete_connector("B"))
    ok(h.leave("w2"))  # a member removed
    state_records = [r for r in h.log[records_before:] if type(r).__name__ != "EventRecord"]
    assert len(undo) == len(state_records)  # one step per state record: O(what changed)
    assert full_dump(h.state) != before

    undo.rollback(h.state)

    assert full_dump(h.state) == before
    assert len(undo) == 0


def test_a_batch_taken_back_and_run_again_gives_the_group_a_single_run_gives() -> None:
    def batch(h: UndoHarness) -> None:
        ok(h.join("w3"))
        ok(h.put_connector("C", 1))
        ok(h.leave("w1"))

    retried = undo_harness()
    assert retried.state is not None
    retried.undo = undo = replay.Undo()
    batch(retried)
    undo.rollback(retried.state)  # the commit failed
    retried.undo = None
    batch(retried)  # the clients retry
    once = undo_harness()
    batch(once)
    assert once.state is not None
    assert full_dump(retried.state) == full_dump(once.state)


def test_an_install_that_moves_members_is_taken_back_exactly() -> None:
    """The epoch-only move of an install's unchanged members (DESIGN 3.21) is undone too."""
    h = undo_harness()
    assert h.state is not None
    ok(h.join("w3"))
    before = full_dump(h.state)
    epochs = {m: h.member(m).member_epoch for m in ("w1", "w2", "w3")}
    h.undo = undo = replay.Undo()
    h.compute("w1", {"w1": W1_SHARE, "w2": W2_SHARE, "w3": rs()})
    assert {m: h.member(m).member_epoch for m in epochs} != epochs  # moved at the install
    assert any(type(r).__name__ == "MembersMovedRecord" for r in h.log)

    undo.rollback(h.state)

    assert full_dump(h.state) == before
    assert {m: h.member(m).member_epoch for m in epochs} == epochs
