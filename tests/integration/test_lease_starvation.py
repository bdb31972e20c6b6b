"""Leases never starve and never weaken fencing (issue 24 item 3, DESIGN 3.16 and 3.21), against
real PostgreSQL: a long state transaction (a big commit, held open here with pg_sleep after its
lease check) does not stop its group's renewal, so the group stays owned and served; a takeover
attempted while it runs waits for it; and the two messages that used to blame the database name
the real cause (a lease row locked by another process; this process paused)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from connect_protocol.errors import CoordinatorNotAvailable
from connect_protocol.messages import PutConnectorRequest
from coordinator_svc.core.admin import put_connector as put_connector_handler
from coordinator_svc.core.model import GroupConfigDefaults, GroupState
from coordinator_svc.core.results import Result
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.runtime.readiness import ReadinessMonitor
from coordinator_svc.store import Lease, LeaseLocked, SqlStore
from tests.support.client import describe, put_connector
from tests.support.coordinator import InProcessCoordinator
from tests.support.pgcluster import libpq_url

GROUP = "big-group"
LEASE_MS = 2_000
DEFAULTS = GroupConfigDefaults()


def event_of(record: logging.LogRecord) -> str | None:
    return getattr(record, "fields", {}).get("event")


def lease_row(database_url: str, group_id: str = GROUP) -> tuple[str, int, datetime]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        row = conn.execute(
            "SELECT owner_id, token, lease_until FROM group_leases WHERE group_id = %s", (group_id,)
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def hold_next_commit_open(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch, seconds: float
) -> dict[str, Any]:
    """The store's next commit keeps its transaction busy for `seconds` right after its lease
    check, as the statements of a 100,000-task commit would; returns what it saw (`after`: the
    database's clock once the wait ended)."""
    real_check = store._leases.check
    seen: dict[str, Any] = {"armed": True}

    def check(conn: Connection, lease: Lease) -> None:
        real_check(conn, lease)
        if seen.pop("armed", False):
            conn.execute(sa.text("SELECT pg_sleep(:s)"), {"s": seconds})
            seen["after"] = conn.execute(sa.text("SELECT clock_timestamp()")).scalar_one()

    monkeypatch.setattr(store._leases, "check", check)
    return seen


@pytest.fixture
def migrated(database_url: str) -> str:
    store = SqlStore(database_url, "migrator", "-")
    store.migrate()
    store.close()
    return database_url


@pytest.fixture
def open_store(migrated: str) -> Iterator[Callable[..., SqlStore]]:
    opened: list[SqlStore] = []

    def open_(owner_id: str, address: str, lease_ms: int = 1_000) -> SqlStore:
        store = SqlStore(migrated, owner_id, address, lease_ms=lease_ms)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


def test_a_long_commit_while_the_renewal_is_due_keeps_the_group_owned_and_served(
    database_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with (
        caplog.at_level(logging.INFO, logger="coordinator"),
        InProcessCoordinator(database_url, lease_ms=LEASE_MS) as c,
    ):
        assert c.stubs is not None
        assert put_connector(c.stubs, GROUP, "A", 1).error_code == 0
        owner, token, until_before = lease_row(database_url)
        hold_next_commit_open(c.store, monkeypatch, 1.5 * LEASE_MS / 1000)
        answers: list[Any] = []
        big = threading.Thread(
            target=lambda: answers.append(put_connector(c.stubs, GROUP, "B", 100))
        )
        big.start()
        # While the commit runs (it outlasts the lease), the renewal goes through.
        deadline = time.monotonic() + LEASE_MS / 1000
        while lease_row(database_url)[2] <= until_before:
            assert time.monotonic() < deadline, "the renewal waited behind the group's commit"
            time.sleep(0.05)
        assert big.is_alive(), "the commit ended before the renewal was seen"
        big.join(timeout=10)
        assert [a.error_code for a in answers] == [0]
        assert lease_row(database_url)[:2] == (owner, token)  # the same tenure throughout
        assert c.manager.owned_group_ids() == [GROUP]
        assert sorted(conn.name for conn in describe(c.stubs, GROUP).catalogue) == ["A", "B"]
    events = [event_of(r) for r in caplog.records]
    assert "group_dropped" not in events and "group_loaded" not in events, events


def test_a_takeover_waits_for_the_commit_in_flight_of_the_previous_tenure(
    open_store: Callable[..., SqlStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    a = open_store("coord-a", "10.0.0.1:7000")
    b = open_store("coord-b", "10.0.0.2:7000")
    lease = a.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    request = PutConnectorRequest(GROUP, "A", 1, {}, "test")
    records = put_connector_handler(None, request, 0, DEFAULTS).records
    seen = hold_next_commit_open(a, monkeypatch, 1.6)  # past its 1 s lease
    committed: list[BaseException | None] = []

    def commit() -> None:
        try:
            a.commit(lease, records)
            committed.append(None)
        except BaseException as error:  # pragma: no cover - reported below
            committed.append(error)

    in_flight = threading.Thread(target=commit)
    in_flight.start()
    time.sleep(1.1)  # a's lease has lapsed by the database's clock; its commit is in flight
    locked: list[LeaseLocked] = []
    deadline = time.monotonic() + 10
    while True:
        assert time.monotonic() < deadline, "no takeover"
        try:
            got = b.try_acquire(GROUP)
        except LeaseLocked as error:  # waited past lock_timeout: tries again, as requests do
            locked.append(error)
            continue
        if isinstance(got, Lease):
            break
        time.sleep(0.05)
    in_flight.join(timeout=10)
    assert committed == [None]  # the commit that passed its check went through
    assert got.token == lease.token + 1
    with b._transaction(write=False) as conn:
        acquired_at = conn.execute(
            sa.text("SELECT acquired_at FROM group_leases WHERE group_id = :g"), {"g": GROUP}
        ).scalar_one()
    assert acquired_at > seen["after"], "the takeover committed while the commit was in flight"
    loaded = b.load_group(GROUP)
    assert loaded is not None and list(loaded.catalogue) == ["A"]  # b sees a's write
    for error in locked:
        assert "locked by the coordinator at 10.0.0.1:7000 (coord-a)" in error.client_message


def _no_change(_state: GroupState | None, _now: int) -> Result[None]:
    return Result([], None)


def test_a_standby_meeting_a_lease_row_locked_by_a_paused_owner_names_the_lock(
    open_store: Callable[..., SqlStore],
) -> None:
    paused = open_store("coord-a", "10.0.0.1:7000")
    assert isinstance(paused.try_acquire(GROUP), Lease)
    standby = GroupManager(open_store("coord-b", "10.0.0.2:7000"), DEFAULTS)
    conn = paused._db.engine.connect()  # the owner stopped inside its commit's transaction
    try:
        conn.begin()
        conn.execute(paused._leases.sql.check, {"p_group": GROUP})
        holding = threading.Thread(
            target=lambda: conn.execute(sa.text("SELECT pg_sleep(2.5)")), daemon=True
        )
        holding.start()
        time.sleep(1.1)  # its lease has lapsed; its transaction still holds the row
        with pytest.raises(CoordinatorNotAvailable) as refused:
            standby.execute(GROUP, _no_change)
        message = refused.value.message
        assert "locked by the coordinator at 10.0.0.1:7000 (coord-a)" in message, message
        assert "database is unavailable" not in message and "lock timeout" not in message
        holding.join(timeout=5)
    finally:
        conn.invalidate()
        conn.close()


def test_a_renewer_that_wakes_late_logs_a_pause_of_this_process(
    open_store: Callable[..., SqlStore], caplog: pytest.LogCaptureFixture
) -> None:
    jump = [0.0]
    manager = GroupManager(
        open_store("coord-a", "10.0.0.1:7000", lease_ms=5_000),
        DEFAULTS,
        renew_interval_s=0.1,
        monotonic=lambda: time.monotonic() + jump[0],
    )
    with caplog.at_level(logging.INFO, logger="coordinator"):
        manager.start()
        try:
            time.sleep(0.3)
            jump[0] = 8.3  # as if SIGSTOPped for 8.3 s during the renewer's wait
            deadline = time.monotonic() + 5
            while not any(event_of(r) == "process_paused" for r in caplog.records):
                assert time.monotonic() < deadline, "no pause noticed"
                time.sleep(0.02)
        finally:
            manager.stop()
    (paused,) = [r for r in caplog.records if event_of(r) == "process_paused"]
    text = paused.getMessage()
    assert text.startswith("this process was paused for 8.") and "not a database failure" in text
    assert "leases of 5 s may have lapsed" in text


def test_readiness_does_not_count_a_pause_of_this_process_as_the_database_s_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [1000.0]
    changes: list[bool] = []
    monitor = ReadinessMonitor(
        lambda: ["head"],
        head="head",
        known={"head"},
        lease_s=5.0,
        on_change=changes.append,
        clock=lambda: now[0],
    )
    with caplog.at_level(logging.INFO, logger="coordinator"):
        assert monitor.probe_once() and monitor.evaluate().serving
        now[0] += 8.3  # stopped: neither the probe nor the evaluation ran
        monitor.notice_pause(8.3 - monitor.tick_s)
        answer = monitor.evaluate()
    assert answer.serving and changes == [True], answer.reason
    assert "unreachable" not in answer.reason
    assert any(event_of(r) == "process_paused" for r in caplog.records)
