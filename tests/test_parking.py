"""The parking lot of classic calls (`runtime.parking`) and its wiring into group commit and lease
ownership, with a fake handler that parks and produces wakeups (no gRPC; PostgreSQL for the wiring):

- a wakeup reaches a waiter registered before its handler ran, even when the wakeup was
  committed before the handler's own answer came back;
- wakeups are delivered after a successful commit only; a failed commit delivers nothing;
- unregistering (a cancelled call) forgets only that waiter;
- letting the group go (drop, lose, release_all) answers its waiters NOT_COORDINATOR;
- close answers every waiter and every later registration;
- the park limit helper.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from connect_protocol.errors import CoordinatorNotAvailable, ErrorCode
from coordinator_svc.core.change import GroupChange
from coordinator_svc.core.classic_model import ClassicGroupMeta, ClassicState, GroupType
from coordinator_svc.core.model import GroupState
from coordinator_svc.core.records import EventType, Record
from coordinator_svc.core.results import WAKE_JOIN, WAKE_SYNC, Parked, Result, Wakeup
from coordinator_svc.grpc_api.connection_age import park_limit_ms
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.runtime.parking import ParkFailure, ParkingLot
from coordinator_svc.store import Lease, SqlStore, StoreUnavailable
from tests.core.harness import DEFAULTS


async def _settle() -> None:
    """Let callbacks scheduled with call_soon_threadsafe run."""
    for _ in range(3):
        await asyncio.sleep(0)


def test_wakeup_reaches_a_waiter_registered_before_the_handler() -> None:
    async def scenario() -> None:
        lot = ParkingLot()
        loop = asyncio.get_running_loop()
        waiter = lot.register("g", WAKE_JOIN, "m1", loop)
        assert lot.counts() == {WAKE_JOIN: 1, WAKE_SYNC: 0}
        # Delivered from another thread, before the caller even looks at its future.
        thread = threading.Thread(
            target=lot.deliver, args=("g", [Wakeup(WAKE_JOIN, "m1", "answer")])
        )
        thread.start()
        thread.join()
        assert await asyncio.wait_for(waiter.future, 1) == "answer"
        assert lot.counts() == {WAKE_JOIN: 0, WAKE_SYNC: 0}
        lot.unregister(waiter)  # after delivery: nothing left to forget, no error
        assert lot.waiting("g") == 0

    asyncio.run(scenario())


def test_wakeups_go_to_their_own_key_only() -> None:
    async def scenario() -> None:
        lot = ParkingLot()
        loop = asyncio.get_running_loop()
        join = lot.register("g", WAKE_JOIN, "m1", loop)
        sync = lot.register("g", WAKE_SYNC, "m1", loop)
        other_group = lot.register("h", WAKE_JOIN, "m1", loop)
        lot.deliver("g", [Wakeup(WAKE_SYNC, "m1", "synced"), Wakeup(WAKE_JOIN, "m2", "nobody")])
        await _settle()
        assert sync.future.result() == "synced"
        assert not join.future.done() and not other_group.future.done()
        assert lot.waiting("g") == 1 and lot.waiting("h") == 1

    asyncio.run(scenario())


def test_two_calls_of_one_member_both_get_the_answer_and_unregister_forgets_one() -> None:
    async def scenario() -> None:
        lot = ParkingLot()
        loop = asyncio.get_running_loop()
        first = lot.register("g", WAKE_JOIN, "m1", loop)
        second = lot.register("g", WAKE_JOIN, "m1", loop)
        lot.unregister(first)  # its caller gave up: the other call stays
        assert lot.waiting("g") == 1
        lot.deliver("g", [Wakeup(WAKE_JOIN, "m1", "gen 2")])
        await _settle()
        assert not first.future.done()
        assert second.future.result() == "gen 2"
        third = lot.register("g", WAKE_JOIN, "m1", loop)
        fourth = lot.register("g", WAKE_JOIN, "m1", loop)
        lot.deliver("g", [Wakeup(WAKE_JOIN, "m1", "gen 3")])
        await _settle()
        assert third.future.result() == fourth.future.result() == "gen 3"

    asyncio.run(scenario())


def test_fail_group_and_close() -> None:
    async def scenario() -> None:
        lot = ParkingLot()
        loop = asyncio.get_running_loop()
        a = lot.register("g", WAKE_JOIN, "m1", loop)
        b = lot.register("g", WAKE_SYNC, "m2", loop)
        c = lot.register("h", WAKE_JOIN, "m1", loop)
        assert lot.fail_group("g", ErrorCode.NOT_COORDINATOR, "gone") == 2
        await _settle()
        assert a.future.result() == ParkFailure(ErrorCode.NOT_COORDINATOR, "gone")
        assert b.future.result() == ParkFailure(ErrorCode.NOT_COORDINATOR, "gone")
        assert not c.future.done()
        assert lot.close(ErrorCode.NOT_COORDINATOR, "stopping") == 1
        late = lot.register("h", WAKE_JOIN, "m9", loop)
        await _settle()
        assert c.future.result().message == "stopping"
        assert late.future.result().message == "stopping"
        assert lot.counts() == {WAKE_JOIN: 0, WAKE_SYNC: 0}

    asyncio.run(scenario())


def test_park_limit() -> None:
    assert park_limit_ms(2_000, 0, 30_000) == 7_000  # rebalance timeout + 5 s
    assert park_limit_ms(60_000, 1_000, 10_000) == 9_000  # grace - 1 s when connections age
    assert park_limit_ms(2_000, 1_000, 10_000) == 7_000
    assert park_limit_ms(-5, 0, 30_000) == 5_000


# --- wiring into GroupManager (PostgreSQL): deliver after commit, fail on let-go --------------

GROUP = "parked-group"


@pytest.fixture
def manager(database_url: str) -> Iterator[GroupManager]:
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000", lease_ms=30_000)
    store.migrate()
    manager = GroupManager(store, DEFAULTS)  # not started: no timer fires
    assert manager.execute(GROUP, create_classic) == "created"
    yield manager
    store.close()


def create_classic(state: GroupState | None, now: int) -> Result[str]:
    change = GroupChange(state, GROUP, now, DEFAULTS, creator="User:w")
    change.set_meta(group_type=GroupType.CLASSIC, classic=ClassicGroupMeta(ClassicState.EMPTY))
    return change.result("created")


def park_m1_and_wake_m2(state: GroupState | None, now: int) -> Result[Any]:
    """A fake classic handler: writes (a member of the round and an event, so the batch
    commits), answers its caller m1 `Parked` and wakes m2."""
    change = GroupChange(state, GROUP, now, DEFAULTS)
    change.join_round("m1")
    change.event(EventType.CLASSIC_REBALANCE_STARTED, None, reason="test", generation=0)
    change.wake(WAKE_JOIN, "m2", "m2's answer")
    return change.result(Parked(WAKE_JOIN, "m1"))


@pytest.mark.parametrize("commit_fails", [False, True])
def test_wakeups_reach_waiters_after_a_commit_only(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch, commit_fails: bool
) -> None:
    if commit_fails:

        def refuse(lease: Lease, records: list[Record]) -> None:
            raise StoreUnavailable("injected", "connection lost", False)

        monkeypatch.setattr(manager.store, "commit", refuse)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        m1 = manager.parking.register(GROUP, WAKE_JOIN, "m1", loop)
        m2 = manager.parking.register(GROUP, WAKE_JOIN, "m2", loop)
        call = loop.run_in_executor(None, manager.execute, GROUP, park_m1_and_wake_m2)
        if commit_fails:
            with pytest.raises(CoordinatorNotAvailable):
                await call
            await asyncio.sleep(0.05)
            assert not m2.future.done()  # a failed commit delivers nothing
        else:
            assert await call == Parked(WAKE_JOIN, "m1")
            assert await asyncio.wait_for(m2.future, 1) == "m2's answer"
        assert not m1.future.done()  # parked: waits for its own wakeup

    asyncio.run(scenario())


@pytest.mark.parametrize("let_go", ["drop", "lose", "release_all"])
def test_letting_the_group_go_answers_its_waiters_not_coordinator(
    manager: GroupManager, let_go: str
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        waiter = manager.parking.register(GROUP, WAKE_SYNC, "m1", loop)
        owned = manager.leases.groups[GROUP]
        if let_go == "drop":
            manager.leases.drop(GROUP, owned)
        elif let_go == "lose":
            manager.leases.lose(GROUP, owned)
        else:
            manager.leases.release_all()
        failure = await asyncio.wait_for(waiter.future, 1)
        assert isinstance(failure, ParkFailure)
        assert failure.code is ErrorCode.NOT_COORDINATOR

    asyncio.run(scenario())


def test_a_classic_group_with_a_round_is_not_idle(manager: GroupManager) -> None:
    owned = manager.leases.groups[GROUP]
    assert owned.idle()  # an empty classic group, nothing in its round
    manager.execute(GROUP, park_m1_and_wake_m2)
    assert not owned.idle()  # m1 joined the round: only this process knows it
