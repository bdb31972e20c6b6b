"""Deleting a group in the runtime (issue 30, DESIGN 3.20), on PostgreSQL: the deletion ends
its batch, and the requests queued behind it run on the group as the deletion left it (one that
creates it again continues its counters); a deletion whose commit fails is taken back whole, and
the group is served on; a deleted group's tombstone is loaded by the next owner, so a re-creation
in another process continues the counters too. The store's commit is held at a gate the test
opens (`test_commit_in_flight.Gate`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import DeleteGroupRequest, PutConnectorRequest
from coordinator_svc.core.admin import put_connector
from coordinator_svc.core.group_removal import delete_group
from coordinator_svc.core.model import GroupState
from coordinator_svc.core.results import Result
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.store import SqlStore, StoreUnavailable
from tests.core.harness import DEFAULTS, GROUP
from tests.integration.test_commit_in_flight import WAIT_S, Call, Gate

Handler = Callable[[GroupState | None, int], Result[Any]]


def put(name: str) -> Handler:
    req = PutConnectorRequest(GROUP, name, 1, {}, "test")
    return lambda state, now: put_connector(state, req, now, DEFAULTS)


def delete() -> Handler:
    req = DeleteGroupRequest(GROUP, with_catalogue=True, caller="test")
    return lambda state, now: delete_group(state, req, now, DEFAULTS)


@pytest.fixture
def manager(database_url: str) -> Iterator[GroupManager]:
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000", lease_ms=30_000)
    store.migrate()
    manager = GroupManager(store, DEFAULTS)  # not started: no timer fires, the lease is long
    yield manager
    store.close()


def test_a_failed_deletion_is_taken_back_whole_and_the_group_is_served_on(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert manager.execute(GROUP, put("A")).error_code is ErrorCode.NONE
    before = manager.peek(GROUP)
    assert before is not None
    epoch = before.group_epoch
    gate = Gate(manager.store, monkeypatch)  # type: ignore[arg-type]
    gate.arm(StoreUnavailable("injected: the database went away"))
    deleting = Call(lambda: manager.execute(GROUP, delete()))
    assert gate.entered.wait(WAIT_S)
    assert manager.peek(GROUP) is None  # gone in memory while its commit is in flight
    gate.open_()
    assert deleting.done.wait(WAIT_S)
    assert getattr(deleting.outcome, "code", None) == ErrorCode.COORDINATOR_NOT_AVAILABLE
    after = manager.peek(GROUP)
    assert after is before and after.group_epoch == epoch and set(after.catalogue) == {"A"}
    assert manager.store.load_tombstone(GROUP) is None
    # Served on, and deleted for real on the next try.
    added = manager.execute(GROUP, put("B"))
    assert added.error_code is ErrorCode.NONE and added.group_epoch == epoch + 1
    deleted = manager.execute(GROUP, delete())
    assert deleted.error_code is ErrorCode.NONE and deleted.group_epoch == epoch + 1
    assert manager.peek(GROUP) is None and manager.store.load_group(GROUP) is None
    tombstone = manager.store.load_tombstone(GROUP)
    assert tombstone is not None and tombstone.group_epoch == epoch + 1


def test_requests_behind_a_deletion_run_on_the_deleted_group_and_recreate_it_continuing(
    manager: GroupManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert manager.execute(GROUP, put("A")).error_code is ErrorCode.NONE
    gate = Gate(manager.store, monkeypatch)  # type: ignore[arg-type]
    gate.arm()  # the next commit (B's) waits: the deletion and C queue behind it
    adding_b = Call(lambda: manager.execute(GROUP, put("B")))
    assert gate.entered.wait(WAIT_S)
    deleting = Call(lambda: manager.execute(GROUP, delete()))
    time.sleep(0.2)
    adding_c = Call(lambda: manager.execute(GROUP, put("C")))
    time.sleep(0.2)
    gate.open_()
    for call in (adding_b, deleting, adding_c):
        assert call.done.wait(WAIT_S)
    deleted = deleting.outcome
    assert deleted.error_code is ErrorCode.NONE, deleted
    assert deleted.connectors_deleted == 2  # A and B: B committed before it
    created = adding_c.outcome
    assert created.error_code is ErrorCode.NONE and created.created, created
    # C re-created the group above the deleted one's epoch.
    state = manager.peek(GROUP)
    assert state is not None and set(state.catalogue) == {"C"}
    assert created.group_epoch == deleted.group_epoch + 2  # created at +1, bumped by C
    events = [e["event_type"] for e in manager.store.list_events(GROUP)]
    assert events.count("GROUP_CREATED") == 2 and events.count("GROUP_DELETED") == 1


def test_another_process_recreating_a_deleted_group_continues_its_counters(
    manager: GroupManager, database_url: str
) -> None:
    assert manager.execute(GROUP, put("A")).error_code is ErrorCode.NONE
    deleted = manager.execute(GROUP, delete())
    assert deleted.error_code is ErrorCode.NONE
    manager.stop()
    other_store = SqlStore(database_url, "coord-b", "10.0.0.2:7000", lease_ms=30_000)
    try:
        other = GroupManager(other_store, DEFAULTS)
        created = other.execute(GROUP, put("A"))
        assert created.error_code is ErrorCode.NONE
        assert created.group_epoch == deleted.group_epoch + 2
        other.stop()
    finally:
        other_store.close()
