"""The coordinator's metrics of its groups and leases (coordinator_svc/metrics.py), from a real
`GroupManager` committing to a real database:

- how long the oldest unsettled group has been ASSIGNING (since its epoch bump) or RECONCILING
  (since its target was installed), in seconds and in rebalance timeouts, with an injected clock:
  the core harness's scenarios run through the manager (its commits go to SQLite), the clock is
  the harness's, and the scrape is the registry's;
- that a group taken over starts its age afresh, as its timers do;
- group leases acquired, lost and released, counted when a second coordinator takes a group over
  from one that stopped renewing (PostgreSQL, as in production).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest

from connect_protocol.messages import PutConnectorRequest
from coordinator_svc.core.admin import put_connector
from coordinator_svc.core.model import GroupState, GroupStatus
from coordinator_svc.core.results import Result
from coordinator_svc.metrics import Metrics
from coordinator_svc.runtime.groups import GroupManager, NotOwner
from coordinator_svc.store import SqlStore
from tests.core.harness import DEFAULTS, GROUP, REBALANCE_MS, GroupHarness, rs

R = TypeVar("R")


class FakeClock:
    """The coordinator's clock, moved by the test."""

    def __init__(self, now_ms: int) -> None:
        self.now = now_ms

    def now_ms(self) -> int:
        return self.now


class ManagedHarness(GroupHarness):
    """The core harness, each call run by a real GroupManager (records applied in its memory and
    committed to its database) on the harness's clock. Its timers do not run: the test moves the
    clock with `advance` and sends every heartbeat itself."""

    def __init__(self, manager: GroupManager, clock: FakeClock) -> None:
        super().__init__(now_ms=clock.now)
        self.manager = manager
        self.clock = clock

    def _run(self, handler: Callable[[GroupState | None], Result[R]]) -> R:
        self.clock.now = self.now_ms
        results: list[Result[R]] = []

        def run(state: GroupState | None, _now: int) -> Result[R]:
            results.append(handler(state))
            return results[-1]

        response = self.manager.execute(GROUP, run)
        self.state = self.manager.peek(GROUP)
        self.records_of_last_call = list(results[-1].records)
        self.log.extend(results[-1].records)
        return response

    def advance(self, ms: int) -> None:
        self.now_ms += ms
        self.clock.now = self.now_ms


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} is not exported"
    return value


def ages(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """state -> (oldest seconds, in rebalance timeouts), as a scrape reads them."""
    return {
        state: (
            sample(metrics, "coordinator_rebalance_oldest_seconds", state=state),
            sample(metrics, "coordinator_rebalance_oldest_timeout_ratio", state=state),
        )
        for state in ("ASSIGNING", "RECONCILING")
    }


def leases(metrics: Metrics) -> dict[str, float]:
    return {
        change: sample(metrics, "coordinator_group_lease_changes_total", change=change)
        for change in ("acquired", "lost", "released")
    }


def groups(metrics: Metrics, state: GroupStatus) -> float:
    return sample(metrics, "coordinator_groups", state=state.value)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    with SqlStore(url, owner_id="setup", advertised_address="127.0.0.1:1") as store:
        store.migrate()
    return url


@pytest.fixture
def stores() -> Iterator[Callable[..., SqlStore]]:
    opened: list[SqlStore] = []

    def open_store(url: str, owner_id: str, lease_ms: int = 10_000) -> SqlStore:
        store = SqlStore(
            url, owner_id=owner_id, advertised_address=f"{owner_id}:9093", lease_ms=lease_ms
        )
        opened.append(store)
        return store

    yield open_store
    for store in opened:
        store.close()


def settle(h: ManagedHarness, *member_ids: str) -> None:
    """Heartbeats from each member, reporting what it was told, until the group is STABLE."""
    for _ in range(4):
        if h.status() is GroupStatus.STABLE:
            return
        for member_id in member_ids:
            h.ack(member_id)
    assert h.status() is GroupStatus.STABLE, h.dump()


def test_the_oldest_rebalance_is_timed_from_the_bump_then_from_the_install(
    sqlite_url: str, stores: Callable[..., SqlStore]
) -> None:
    clock = FakeClock(1_000_000)
    manager = GroupManager(stores(sqlite_url, "a"), DEFAULTS, clock=clock)
    h = ManagedHarness(manager, clock)
    h.put_connector("A", 2)
    assert ages(manager.metrics) == {"ASSIGNING": (0.0, 0.0), "RECONCILING": (0.0, 0.0)}

    h.join("w1")  # a bump: ASSIGNING until w1, the assignor, installs a target
    assert h.status() is GroupStatus.ASSIGNING
    h.advance(750)
    assert groups(manager.metrics, GroupStatus.ASSIGNING) == 1
    # Its member's rebalance timeout (REBALANCE_MS) is what bounds the state: 1.5 of them.
    assert ages(manager.metrics)["ASSIGNING"] == (0.75, 750 / REBALANCE_MS)

    h.compute("w1", {"w1": rs("A", "A-0", "A-1")})  # installed: RECONCILING from now
    assert h.status() is GroupStatus.RECONCILING
    h.advance(250)
    assert ages(manager.metrics) == {
        "ASSIGNING": (0.0, 0.0),
        "RECONCILING": (0.25, 250 / REBALANCE_MS),
    }

    settle(h, "w1")
    h.advance(10_000)
    assert groups(manager.metrics, GroupStatus.STABLE) == 1
    assert ages(manager.metrics) == {"ASSIGNING": (0.0, 0.0), "RECONCILING": (0.0, 0.0)}

    # A second member: another bump, timed from then, not from the first rebalance.
    h.join("w2", rebalance_timeout_ms=4 * REBALANCE_MS)
    h.advance(1_000)
    # The group's rebalance timeout is its members' longest.
    assert ages(manager.metrics)["ASSIGNING"] == (1.0, 1_000 / (4 * REBALANCE_MS))


def test_a_steady_group_that_becomes_unsettled_without_an_epoch_moving_is_timed_from_the_scrape(
    sqlite_url: str, stores: Callable[..., SqlStore]
) -> None:
    """A change that leaves a STABLE group unsettled without moving an epoch (simulated here by
    changing the state in memory) is timed from the first scrape that sees it, not from a
    rebalance long finished."""
    clock = FakeClock(1_000_000)
    manager = GroupManager(stores(sqlite_url, "a"), DEFAULTS, clock=clock)
    h = ManagedHarness(manager, clock)
    h.put_connector("A", 1)
    h.join("w1")
    h.compute("w1", {"w1": rs("A", "A-0")})
    settle(h, "w1")
    ages(manager.metrics)  # a scrape sees it settled
    h.advance(60_000)
    owned = manager._groups[GROUP]
    assert owned.rebalance[1] is None
    assert h.state is not None
    member = h.state.members["w1"]
    h.state.put_member(replace(member, assigned=rs("A")))  # as if a change had left it behind
    assert h.status() is GroupStatus.RECONCILING
    assert ages(manager.metrics)["RECONCILING"] == (0.0, 0.0)
    h.advance(300)
    assert ages(manager.metrics)["RECONCILING"] == (0.3, 300 / REBALANCE_MS)


def test_a_group_taken_over_is_timed_from_the_takeover_and_its_leases_are_counted(
    sqlite_url: str, stores: Callable[..., SqlStore]
) -> None:
    clock = FakeClock(1_000_000)
    first = GroupManager(stores(sqlite_url, "a"), DEFAULTS, clock=clock)
    h = ManagedHarness(first, clock)
    h.put_connector("A", 1)
    h.join("w1")
    h.advance(5_000)
    assert ages(first.metrics)["ASSIGNING"][0] == 5.0
    assert leases(first.metrics) == {"acquired": 1, "lost": 0, "released": 0}

    first.stop()  # graceful: its leases are released at once
    assert leases(first.metrics) == {"acquired": 1, "lost": 0, "released": 1}

    second = GroupManager(stores(sqlite_url, "b"), DEFAULTS, clock=clock)
    second.execute(GROUP, no_change)
    assert leases(second.metrics) == {"acquired": 1, "lost": 0, "released": 0}
    h.advance(400)
    # Its timers restart from the takeover (the session, the assignor's timeout): so does this.
    assert ages(second.metrics)["ASSIGNING"] == (0.4, 400 / REBALANCE_MS)
    assert groups(second.metrics, GroupStatus.ASSIGNING) == 1


def no_change(_state: GroupState | None, _now: int) -> Result[None]:
    return Result([], None)


def test_a_lease_taken_over_by_another_coordinator_counts_as_lost_and_acquired(
    database_url: str, stores: Callable[..., SqlStore]
) -> None:
    """Coordinator A owns the group and stops renewing (its renewer never runs here: a paused
    or starved process); once the lease lapses by the database's clock, B takes the group over
    on a request; A's next request finds B's lease and drops the group."""
    lease_ms = 300
    store_a = stores(database_url, "a", lease_ms)
    store_a.migrate()
    a = GroupManager(store_a, DEFAULTS)
    b = GroupManager(stores(database_url, "b", lease_ms), DEFAULTS)
    request = PutConnectorRequest(GROUP, "A", 1, {}, "test")
    a.execute(GROUP, lambda s, now: put_connector(s, request, now, DEFAULTS))
    assert leases(a.metrics) == {"acquired": 1, "lost": 0, "released": 0}

    deadline = time.monotonic() + 10
    while True:
        try:
            b.execute(GROUP, no_change)
            break
        except NotOwner:  # not lapsed yet by the database's clock
            assert time.monotonic() < deadline, "B never got the lease"
            time.sleep(0.05)
    assert b.owned_group_ids() == [GROUP]
    assert leases(b.metrics) == {"acquired": 1, "lost": 0, "released": 0}

    with pytest.raises(NotOwner):
        a.execute(GROUP, no_change)
    assert a.owned_group_ids() == []
    assert leases(a.metrics) == {"acquired": 1, "lost": 1, "released": 0}

    b.stop()
    assert leases(b.metrics) == {"acquired": 1, "lost": 0, "released": 1}
