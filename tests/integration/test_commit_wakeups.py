"""Wakeups of parked classic calls (issue 25 P0, DESIGN 3.19 "Long polls hold no thread"), on
PostgreSQL through the runtime's group commit: a batch's wakeups are handed to the `deliver`
hook only after its commit, never when the commit fails (then the round it changed is taken back
with the rest of the batch), and a batch that changes only the round is answered without a
database transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from connect_protocol.errors import CoordinatorNotAvailable
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import ClassicGroupMeta, ClassicState, GroupType
from coordinator_svc.core.model import GroupState
from coordinator_svc.core.records import Record
from coordinator_svc.core.results import WAKE_JOIN, Result, Wakeup
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.store import Lease, SqlStore, StoreUnavailable
from tests.core.harness import DEFAULTS

GROUP = "classic-group"


class Recorder:
    """The store's commits and the deliveries, in the order they happened."""

    def __init__(self, store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.real = store.commit
        self.log: list[tuple[str, Any]] = []
        self.failure: BaseException | None = None
        monkeypatch.setattr(store, "commit", self.commit)

    def commit(self, lease: Lease, records: list[Record]) -> None:
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
        self.real(lease, records)
        self.log.append(("commit", len(records)))

    def deliver(self, group_id: str, wakeups: list[Wakeup]) -> None:
        self.log.append(
            ("deliver", (group_id, [(w.kind, w.member_id, w.response) for w in wakeups]))
        )


@pytest.fixture
def store(database_url: str) -> Iterator[SqlStore]:
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000", lease_ms=30_000)
    store.migrate()
    yield store
    store.close()


def create_classic(state: GroupState | None, now: int) -> Result[str]:
    change = GroupChange(state, GROUP, now, DEFAULTS, creator="User:w")
    change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta(ClassicState.EMPTY))
    return change.result("created")


def join_and_wake(member_id: str) -> Any:
    def handler(state: GroupState | None, now: int) -> Result[str]:
        change = GroupChange(state, GROUP, now, DEFAULTS)
        change.join_round(member_id)
        change.wake(WAKE_JOIN, "w0", f"answer for w0 after {member_id}")
        return change.result(f"{member_id} parked")

    return handler


def test_wakeups_are_delivered_after_the_commit_and_not_when_it_fails(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    recorder = Recorder(store, monkeypatch)
    manager = GroupManager(store, DEFAULTS)  # not started: no timer fires
    manager.commits.deliver = recorder.deliver
    assert manager.execute(GROUP, create_classic) == "created"

    assert manager.execute(GROUP, join_and_wake("w1")) == "w1 parked"
    assert recorder.log[-2:] == [
        ("commit", 1),  # the round record only: the store writes nothing for it
        ("deliver", (GROUP, [("join", "w0", "answer for w0 after w1")])),
    ]
    state = manager.peek(GROUP)
    assert state is not None and state.round is not None and state.round.joined == {"w1": 0}

    recorder.failure = StoreUnavailable("injected: the database went away")
    seen = len(recorder.log)
    with pytest.raises(CoordinatorNotAvailable):
        manager.execute(GROUP, join_and_wake("w2"))
    assert recorder.log[seen:] == []  # neither committed nor delivered
    state = manager.peek(GROUP)
    assert state is not None and state.round is not None
    assert state.round.joined == {"w1": 0} and state.round.join_seq == 1  # taken back

    assert manager.execute(GROUP, join_and_wake("w2")) == "w2 parked"
    assert recorder.log[-1] == ("deliver", (GROUP, [("join", "w0", "answer for w0 after w2")]))
    reloaded = store.load_group(GROUP)
    assert reloaded is not None and reloaded.meta.is_classic and reloaded.round is None


def test_without_a_deliver_hook_wakeups_are_dropped(store: SqlStore) -> None:
    manager = GroupManager(store, DEFAULTS)
    manager.commits.deliver = None  # a GroupCommit without a parking lot (GroupManager wires one)
    manager.execute(GROUP, create_classic)
    assert manager.execute(GROUP, join_and_wake("w1")) == "w1 parked"
