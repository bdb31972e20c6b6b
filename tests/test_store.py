"""The SQL store against real PostgreSQL (and the embedded SQLite default): records round-trip
through the database to the same group state, the audit trail, and lease fencing in SQL."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.configs import SESSION_TIMEOUT_MS
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import (
    AlterConfigsRequest,
    Assignor,
    DeleteConnectorRequest,
    HeartbeatRequest,
    InstallRequest,
    MemberTarget,
    PrepareRequest,
    PutConnectorRequest,
)
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from coordinator_svc.core import replay
from coordinator_svc.core.admin import alter_configs, delete_connector, put_connector
from coordinator_svc.core.assignment import install_assignment, prepare_assignment
from coordinator_svc.core.heartbeat import heartbeat
from coordinator_svc.core.model import (
    GroupConfigDefaults,
    GroupMeta,
    GroupState,
    GroupStatus,
    Hold,
    Member,
)
from coordinator_svc.core.records import EventRecord, GroupMetaRecord, MemberRecord, Record
from coordinator_svc.core.results import Result
from coordinator_svc.store import Lease, LeaseHolder, LeaseLost, SqlStore, StoreUnavailable, rows
from tests.support import store_dump

GROUP = "connect-cluster"
DEFAULTS = GroupConfigDefaults()
ASSIGNORS = (
    Assignor("incremental_cooperative", 1, 2, reason=0, version=2, metadata=b"\x00\x01meta\xff"),
    Assignor("eager", 0, 0),
)

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Handler = Callable[[GroupState | None, Req, int, GroupConfigDefaults], Result[Resp]]


@pytest.fixture(params=["postgresql", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated, empty database: the PostgreSQL fixture, or an embedded SQLite file."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'coordinator.db'}"
    else:
        url = str(request.getfixturevalue("database_url"))
    store = SqlStore(url, "migrator", "-")
    store.migrate()
    store.close()
    return url


@pytest.fixture
def open_store(store_url: str) -> Iterator[Callable[..., SqlStore]]:
    """Opens stores on the test's database and closes them all afterwards."""
    opened: list[SqlStore] = []

    def open_(owner_id: str = "coord-a", address: str = "10.0.0.1:7000", **kw: Any) -> SqlStore:
        store = SqlStore(store_url, owner_id, address, **kw)
        opened.append(store)
        return store

    yield open_
    for store in opened:
        store.close()


class Driver:
    """Drives the pure core for one group, committing every result under a lease and applying
    it in memory, so the database can be compared with the state the core holds."""

    def __init__(self, store: SqlStore, lease: Lease) -> None:
        self.store = store
        self.lease = lease
        self.state: GroupState | None = None
        self.now_ms = 1_800_000_000_000
        self.committed: list[Record] = []

    def run(self, handler: Handler[Req, Resp], req: Req) -> Resp:
        result = handler(self.state, req, self.now_ms, DEFAULTS)
        self.store.commit(self.lease, result.records)
        if result.records:
            if self.state is None:
                self.state = replay.new_state(result.records)
            else:
                for record in result.records:
                    replay.apply(self.state, record)
        self.committed.extend(result.records)
        self.now_ms += 25
        return result.response

    def member_epoch(self, member_id: str) -> int:
        assert self.state is not None
        return self.state.members[member_id].member_epoch

    def owned(self, member_id: str) -> ResourceSet:
        assert self.state is not None
        return self.state.members[member_id].assigned

    def assert_loaded_equals_memory(self) -> None:
        loaded = self.store.load_group(GROUP)
        expected = self.state
        assert loaded is not None and expected is not None
        assert loaded.meta == expected.meta
        assert loaded.target == expected.target
        assert loaded.members == expected.members
        assert loaded.catalogue == expected.catalogue
        assert loaded.configs == expected.configs
        assert loaded.connector_owner == expected.connector_owner
        assert loaded.task_owner == expected.task_owner
        assert loaded.instance_owner == expected.instance_owner
        assert loaded.status() == expected.status()


def join(member_id: str, instance_id: str | None = None) -> HeartbeatRequest:
    return HeartbeatRequest(
        GROUP,
        member_id,
        0,
        instance_id=instance_id,
        rebalance_timeout_ms=5_000,
        client_assignors=ASSIGNORS,
        owned=EMPTY,
        url=f"http://{member_id}:8083",
    )


def build_group(driver: Driver) -> None:
    """A realistic group, checked against the database after every step: catalogue, configs, two
    members (one static), a prepared and installed target with a scheduled rebalance, members
    reconciled onto it, a third member joining (ASSIGNING), a fencing (hold), a deletion."""
    run, check = driver.run, driver.assert_loaded_equals_memory
    run(put_connector, PutConnectorRequest(GROUP, "A", 2, {"topic": "a"}, caller="10.1.1.1"))
    check()
    run(put_connector, PutConnectorRequest(GROUP, "B", 1, {"topic": "b"}, caller="10.1.1.1"))
    run(alter_configs, AlterConfigsRequest(GROUP, {SESSION_TIMEOUT_MS: "20000"}))
    check()
    assert run(heartbeat, join("w1")).error_code is ErrorCode.COMPUTE_ASSIGNMENT
    check()
    run(heartbeat, join("w2", instance_id="i-2"))
    check()
    assert driver.state is not None and driver.state.status() is GroupStatus.ASSIGNING

    w1_epoch = driver.member_epoch("w1")
    prepared = run(prepare_assignment, PrepareRequest(GROUP, "w1", w1_epoch))
    assert prepared.error_code is ErrorCode.NONE
    check()
    installed = run(
        install_assignment,
        InstallRequest(
            GROUP,
            "w1",
            w1_epoch,
            prepared.group_epoch,
            members=(
                MemberTarget("w1", ResourceSet.of(["A"], [("A", 0)]), 1, b"w1-meta"),
                MemberTarget("w2", ResourceSet.of(["B"], [("A", 1)]), 1, b""),
            ),
            assignor_state=b"\x01opaque assignor state",
            scheduled_rebalance_delay_ms=30_000,  # B-0 deferred
        ),
    )
    assert installed.error_code is ErrorCode.NONE
    check()
    assert driver.state.target.scheduled_rebalance_at_ms is not None
    for member_id in ("w1", "w2", "w1", "w2"):
        run(
            heartbeat,
            HeartbeatRequest(
                GROUP,
                member_id,
                driver.member_epoch(member_id),
                owned=driver.owned(member_id),
            ),
        )
        check()
    assert driver.owned("w2") == ResourceSet.of(["B"], [("A", 1)])

    run(heartbeat, join("w3"))  # bumps the group epoch: ASSIGNING again
    assert driver.state.status() is GroupStatus.ASSIGNING
    check()
    fenced = run(heartbeat, HeartbeatRequest(GROUP, "w2", 999, owned=EMPTY))
    assert fenced.error_code is ErrorCode.FENCED_MEMBER_EPOCH
    assert driver.state.meta.holds  # w2's resources held back from everyone
    check()
    run(delete_connector, DeleteConnectorRequest(GROUP, "B", caller="10.1.1.1"))
    check()


def test_records_round_trip_to_the_same_group_state(
    open_store: Callable[..., SqlStore],
) -> None:
    store = open_store()
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    driver = Driver(store, lease)
    build_group(driver)

    # Reopening (as a takeover would) sees the same state.
    other = open_store("coord-b", "10.0.0.2:7000")
    assert other.group_ids() == [GROUP]
    assert other.load_group("no-such-group") is None
    reloaded = other.load_group(GROUP)
    assert reloaded is not None and driver.state is not None
    assert reloaded.meta == driver.state.meta and reloaded.members == driver.state.members


def test_events_are_appended_in_order_with_increasing_ids(
    open_store: Callable[..., SqlStore],
) -> None:
    store = open_store()
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    driver = Driver(store, lease)
    build_group(driver)

    expected = [r for r in driver.committed if isinstance(r, EventRecord)]
    events = store.list_events(GROUP)
    ids = [e["id"] for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert [(e["event_type"], e["member_id"], e["group_epoch"], e["at_ms"]) for e in events] == [
        (r.event_type.value, r.member_id, r.group_epoch, r.at_ms) for r in expected
    ]
    assert events[0]["event_type"] == "GROUP_CREATED"
    put = next(e for e in events if e["event_type"] == "CONNECTOR_PUT")
    assert put["payload"]["caller"] == "10.1.1.1" and put["payload"]["task_count"] == 2
    first = events[0]
    assert first["occurred_at"].timestamp() * 1000 == pytest.approx(first["at_ms"])
    assert first["occurred_at"].utcoffset() is not None

    assert store.list_events(GROUP, after_id=ids[-3]) == events[-2:]
    assert store.list_events("other-group") == []
    assert store.list_events() == events
    assert store_dump.dump(store)["events"] == events


def test_member_and_connector_removals_delete_their_rows(
    open_store: Callable[..., SqlStore],
) -> None:
    store = open_store()
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    build_group(Driver(store, lease))

    dump = store_dump.dump(store)
    assert [r["member_id"] for r in dump["members"]] == ["w1", "w3"]  # w2 was fenced
    assert [r["name"] for r in dump["connectors"]] == ["A"]  # B was deleted
    assert [r["name"] for r in dump["group_configs"]] == [SESSION_TIMEOUT_MS]
    assert [r["member_id"] for r in dump["target_assignment_members"]] == ["w1", "w2"]
    assert [h["member_id"] for h in dump["groups"][0]["holds"]] == ["w2"]


def test_a_commit_under_a_lease_not_held_raises_lease_lost_and_writes_nothing(
    open_store: Callable[..., SqlStore],
) -> None:
    store = open_store()
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    driver = Driver(store, lease)
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 1))
    before = store_dump.dump(store)
    records = put_connector(
        driver.state, PutConnectorRequest(GROUP, "B", 3), driver.now_ms, DEFAULTS
    ).records
    assert records

    for wrong in (
        dataclasses.replace(lease, token=lease.token + 1),
        dataclasses.replace(lease, owner_id="someone-else"),
    ):
        with pytest.raises(LeaseLost) as lost:
            store.commit(wrong, records)
        assert lost.value.holder is not None and lost.value.holder.owner_id == "coord-a"
    never_leased = put_connector(None, PutConnectorRequest("new-group", "A", 1), 0, DEFAULTS)
    with pytest.raises(LeaseLost) as lost:
        store.commit(dataclasses.replace(lease, group_id="new-group"), never_leased.records)
    assert lost.value.holder is None
    assert store_dump.dump(store) == before

    with pytest.raises(ValueError, match="record for group"):
        store.commit(
            lease, put_connector(None, PutConnectorRequest("x", "A", 1), 0, DEFAULTS).records
        )
    assert store_dump.dump(store) == before


def test_a_second_owner_is_told_the_holder_and_takes_over_after_expiry_with_a_higher_token(
    open_store: Callable[..., SqlStore],
) -> None:
    first = open_store("coord-a", "10.0.0.1:7000", lease_ms=300)
    second = open_store("coord-b", "10.0.0.2:7000", lease_ms=300)
    lease_a = first.try_acquire(GROUP)
    assert isinstance(lease_a, Lease)
    driver = Driver(first, lease_a)
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 1))

    held = second.try_acquire(GROUP)
    assert isinstance(held, LeaseHolder)
    assert (held.owner_id, held.advertised_address) == ("coord-a", "10.0.0.1:7000")
    assert second.holder(GROUP) == held

    time.sleep(0.45)  # lease_a lapses by the database's clock
    assert second.holder(GROUP) is None
    lease_b = second.try_acquire(GROUP)
    assert isinstance(lease_b, Lease) and lease_b.token > lease_a.token
    before = store_dump.dump(first)

    # The stale owner believes (wrong local clock) that its lease is still valid: the database
    # refuses its commit anyway, naming the new holder.
    stale = dataclasses.replace(lease_a, valid_until_monotonic=math.inf)
    records = put_connector(
        driver.state, PutConnectorRequest(GROUP, "B", 1), driver.now_ms, DEFAULTS
    ).records
    with pytest.raises(LeaseLost) as lost:
        first.commit(stale, records)
    assert lost.value.holder is not None
    assert lost.value.holder.advertised_address == "10.0.0.2:7000"
    assert "10.0.0.2:7000" in str(lost.value)
    assert first.renew([lease_a]) == []
    assert store_dump.dump(first) == before

    # The new owner loads the state and writes under its own lease.
    state = second.load_group(GROUP)
    second.commit(
        lease_b,
        put_connector(state, PutConnectorRequest(GROUP, "B", 1), driver.now_ms, DEFAULTS).records,
    )
    loaded = second.load_group(GROUP)
    assert loaded is not None and sorted(loaded.catalogue) == ["A", "B"]
    assert isinstance(first.try_acquire(GROUP), LeaseHolder)


def test_a_lapsed_lease_is_refused_by_the_database_even_if_nobody_took_it(
    open_store: Callable[..., SqlStore],
) -> None:
    store = open_store(lease_ms=300)
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    time.sleep(0.45)
    records = put_connector(None, PutConnectorRequest(GROUP, "A", 1), 0, DEFAULTS).records
    with pytest.raises(LeaseLost) as lost:
        store.commit(dataclasses.replace(lease, valid_until_monotonic=math.inf), records)
    assert lost.value.holder is None
    assert store.group_ids() == []
    # Taking it again starts a new tenure: a new token fences anything of the old one.
    again = store.try_acquire(GROUP)
    assert isinstance(again, Lease) and again.token > lease.token


def test_renew_keeps_a_lease(open_store: Callable[..., SqlStore]) -> None:
    first = open_store("coord-a", "10.0.0.1:7000", lease_ms=300)
    second = open_store("coord-b", "10.0.0.2:7000", lease_ms=300)
    lease = first.try_acquire(GROUP)
    other = first.try_acquire("other-group")
    assert isinstance(lease, Lease) and isinstance(other, Lease)
    deadline = time.monotonic() + 0.75
    while time.monotonic() < deadline:
        started = time.monotonic()
        renewed = first.renew([lease, other])
        assert [(r.group_id, r.token) for r in renewed] == [
            ("connect-cluster", lease.token),
            ("other-group", other.token),
        ]
        assert renewed[0].valid_until_monotonic >= started + 0.3
        assert isinstance(second.try_acquire(GROUP), LeaseHolder)
        time.sleep(0.1)
    first.commit(
        renewed[0], put_connector(None, PutConnectorRequest(GROUP, "A", 1), 0, DEFAULTS).records
    )
    # Re-acquiring a live lease we hold extends it under the same token.
    again = first.try_acquire(GROUP, renewed[0])
    assert isinstance(again, Lease) and again.token == lease.token
    assert first.renew([]) == []


def test_a_restarted_process_reusing_an_owner_id_does_not_inherit_the_live_lease(
    open_store: Callable[..., SqlStore],
) -> None:
    """Two processes with one owner id (a reused --node-id, the old one paused) never share a
    tenure: the newcomer sees the lease held until it lapses, then starts a new token."""
    old = open_store("coord-a", "10.0.0.1:7000", lease_ms=300)
    new = open_store("coord-a", "10.0.0.1:7000", lease_ms=300)
    lease = old.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    held = new.try_acquire(GROUP)
    assert isinstance(held, LeaseHolder) and held.owner_id == "coord-a"
    time.sleep(0.45)
    taken = new.try_acquire(GROUP)
    assert isinstance(taken, Lease) and taken.token == lease.token + 1
    # The old process's lease is fenced: its commit and renewal are refused.
    records = put_connector(None, PutConnectorRequest(GROUP, "A", 1), 0, DEFAULTS).records
    with pytest.raises(LeaseLost):
        old.commit(dataclasses.replace(lease, valid_until_monotonic=math.inf), records)
    assert old.renew([lease]) == []
    assert isinstance(old.try_acquire(GROUP, lease), LeaseHolder)


def test_release_lets_another_owner_take_over_at_once(
    open_store: Callable[..., SqlStore],
) -> None:
    first = open_store("coord-a", "10.0.0.1:7000", lease_ms=60_000)
    second = open_store("coord-b", "10.0.0.2:7000", lease_ms=60_000)
    lease = first.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    assert isinstance(second.try_acquire(GROUP), LeaseHolder)
    first.release(lease)
    assert first.holder(GROUP) is None
    taken = second.try_acquire(GROUP)
    assert isinstance(taken, Lease) and taken.token == lease.token + 1
    holder = first.holder(GROUP)
    assert holder is not None and holder.owner_id == "coord-b"
    first.release(lease)  # no longer ours: does nothing
    assert first.holder(GROUP) == holder


def test_an_unreachable_database_raises_store_unavailable() -> None:
    store = SqlStore("postgresql://nobody@127.0.0.1:1/nothing", "coord-a", "10.0.0.1:7000")
    try:
        with pytest.raises(StoreUnavailable):
            store.group_ids()
        with pytest.raises(StoreUnavailable):
            store.try_acquire(GROUP)
    finally:
        store.close()


def test_a_process_paused_inside_a_transaction_does_not_block_takeover(
    database_url: str,
) -> None:
    """A paused owner holding the lease row's lock (stopped between its statements and its
    COMMIT) would block every other process's takeover for ever: the server ends its session
    once idle in the transaction for a lease length, and the waiting acquire then succeeds."""
    import threading

    migrator = SqlStore(database_url, "migrator", "-")
    migrator.migrate()
    migrator.close()
    paused = SqlStore(database_url, "coord-a", "10.0.0.1:7000", lease_ms=500)
    taker = SqlStore(database_url, "coord-b", "10.0.0.2:7000", lease_ms=500)
    try:
        lease = paused.try_acquire(GROUP)
        assert isinstance(lease, Lease)
        conn = paused._db.engine.connect()  # the paused process's open transaction
        try:
            conn.begin()
            conn.execute(paused._leases.sql.check, {"p_group": GROUP})
            got: list[Lease | LeaseHolder | BaseException] = []

            def take_over() -> None:
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:
                    try:
                        result = taker.try_acquire(GROUP)
                    except StoreUnavailable:  # lock_timeout: retried, as the runtime does
                        continue
                    if isinstance(result, Lease):
                        got.append(result)
                        return
                    time.sleep(0.05)
                got.append(AssertionError("no takeover in 15 s"))

            thread = threading.Thread(target=take_over, daemon=True)
            thread.start()
            thread.join(timeout=20)
            assert not thread.is_alive(), "the takeover is blocked by the paused transaction"
            assert len(got) == 1 and isinstance(got[0], Lease), got
            assert got[0].owner_id == "coord-b" and got[0].token == lease.token + 1
            # When the paused process resumes, its transaction is gone: nothing it does counts.
            with pytest.raises(sa.exc.DBAPIError, match="idle-in-transaction"):
                conn.execute(paused._leases.sql.check, {"p_group": GROUP})
        finally:
            conn.invalidate()
            conn.close()
    finally:
        paused.close()
        taker.close()


def leased_driver(open_store: Callable[..., SqlStore]) -> Driver:
    """A Driver on a fresh store holding the group's lease."""
    store = open_store()
    lease = store.try_acquire(GROUP)
    assert isinstance(lease, Lease)
    return Driver(store, lease)


def _install(driver: Driver, shares: dict[str, ResourceSet]) -> None:
    epoch = driver.member_epoch("w1")
    prepared = driver.run(prepare_assignment, PrepareRequest(GROUP, "w1", epoch))
    assert prepared.error_code is ErrorCode.NONE
    installed = driver.run(
        install_assignment,
        InstallRequest(
            GROUP,
            "w1",
            epoch,
            prepared.group_epoch,
            members=tuple(MemberTarget(m, r, 1, b"") for m, r in shares.items()),
        ),
    )
    assert installed.error_code is ErrorCode.NONE, installed.error_message


def _row_versions(store: SqlStore, table: str) -> dict[str, Any]:
    """PostgreSQL's xmin (the transaction that last wrote the row) of each member's row."""
    with store._transaction(write=False) as conn:
        rows_ = conn.execute(sa.text(f"SELECT member_id, xmin::text AS v FROM {table}")).all()
    return {r.member_id: r.v for r in rows_}


def test_an_install_rewrites_only_the_target_rows_of_members_whose_share_changed(
    open_store: Callable[..., SqlStore], store_url: str
) -> None:
    driver = leased_driver(open_store)
    store = driver.store
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 4, {}, caller="t"))
    for member_id in ("w1", "w2", "w3", "w4"):
        driver.run(heartbeat, join(member_id))
    tasks = {m: ResourceSet.of([], [("A", i)]) for i, m in enumerate(("w1", "w2", "w3", "w4"))}
    _install(driver, {**tasks, "w1": tasks["w1"] | ResourceSet.of(["A"])})
    driver.assert_loaded_equals_memory()
    before = _row_versions(store, "target_assignment_members") if "postgresql" in store_url else {}

    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 5, {}, caller="t"))  # A-4 is new
    _install(driver, {**tasks, "w1": tasks["w1"] | ResourceSet.of(["A"], [("A", 4)])})

    driver.assert_loaded_equals_memory()
    if before:
        after = _row_versions(store, "target_assignment_members")
        assert after["w1"] != before["w1"]
        assert {m: after[m] for m in ("w2", "w3", "w4")} == {
            m: before[m] for m in ("w2", "w3", "w4")
        }


def test_metadata_changes_keep_the_prepare_snapshot_without_rewriting_it(
    open_store: Callable[..., SqlStore],
) -> None:
    driver = leased_driver(open_store)
    store = driver.store
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 3, {}, caller="t"))
    driver.run(heartbeat, join("w1"))
    epoch = driver.member_epoch("w1")
    prepared = driver.run(prepare_assignment, PrepareRequest(GROUP, "w1", epoch))
    assert prepared.error_code is ErrorCode.NONE
    assert driver.state is not None and driver.state.meta.prepared is not None
    snapshot = driver.state.meta.prepared

    result = heartbeat(driver.state, join("w2"), driver.now_ms, DEFAULTS)  # bumps the epoch
    meta_records = [r for r in result.records if isinstance(r, GroupMetaRecord)]
    assert meta_records and not any(r.prepared_changed for r in meta_records)
    driver.run(heartbeat, join("w2"))

    driver.assert_loaded_equals_memory()
    loaded = store.load_group(GROUP)
    assert loaded is not None and loaded.meta.prepared == snapshot


@settings(max_examples=300, deadline=None)
@given(
    st.frozensets(st.sampled_from(["A", "B", "c-1", "ü"]), max_size=4),
    st.frozensets(st.tuples(st.sampled_from(["A", "B", "c-1", "ü"]), st.integers(0, 40))),
)
def test_the_compact_form_of_a_resource_set_round_trips(
    connectors: frozenset[str], tasks: frozenset[tuple[str, int]]
) -> None:
    resources = ResourceSet.of(connectors, tasks)
    compact = rows.compact_resources(resources)
    assert rows.expand_resources(json.loads(json.dumps(compact))) == resources
    assert rows.expand_resources(resources.to_json()) == resources  # the form stored before


def test_a_whole_catalogue_is_stored_in_a_few_kilobytes() -> None:
    catalogue = ResourceSet.of(
        [f"{c:040d}" for c in range(1000)],
        [(f"{c:040d}", t) for c in range(1000) for t in range(100)],
    )
    assert len(json.dumps(rows.compact_resources(catalogue))) < 100_000
    assert len(json.dumps(catalogue.to_json())) > 5_000_000


def test_a_member_that_only_moves_to_a_new_epoch_gets_a_narrow_update(
    open_store: Callable[..., SqlStore],
) -> None:
    driver = leased_driver(open_store)
    driver.run(put_connector, PutConnectorRequest(GROUP, "A", 2, {}, caller="t"))
    for member_id in ("w1", "w2"):
        driver.run(heartbeat, join(member_id))
    shares = {"w1": ResourceSet.of(["A"], [("A", 0)]), "w2": ResourceSet.of([], [("A", 1)])}
    _install(driver, shares)
    for member_id in ("w1", "w2", "w1", "w2"):
        epoch = driver.member_epoch(member_id)
        driver.run(
            heartbeat, HeartbeatRequest(GROUP, member_id, epoch, owned=driver.owned(member_id))
        )
    driver.run(put_connector, PutConnectorRequest(GROUP, "B", 0, {}, caller="t"))
    # w1 is to take A-1, which w2 still runs: it moves to the new epoch UNRELEASED with what it
    # has (a member whose share is kept moves at the install itself, DESIGN 3.21).
    _install(driver, {"w1": shares["w1"] | shares["w2"], "w2": ResourceSet.of(["B"])})
    assert driver.state is not None
    w1 = driver.state.members["w1"]

    result = heartbeat(
        driver.state, HeartbeatRequest(GROUP, "w1", w1.member_epoch), driver.now_ms, DEFAULTS
    )
    moved = [r for r in result.records if isinstance(r, MemberRecord)]
    assert [(r.member.member_id, r.epoch_only) for r in moved] == [("w1", True)]
    driver.run(heartbeat, HeartbeatRequest(GROUP, "w1", w1.member_epoch))
    driver.run(
        heartbeat,
        HeartbeatRequest(GROUP, "w2", driver.member_epoch("w2"), owned=driver.owned("w2")),
    )

    driver.assert_loaded_equals_memory()
    assert driver.state.members["w1"].member_epoch > w1.member_epoch


def test_a_commit_narrows_a_member_only_if_every_change_of_it_was_epoch_only() -> None:
    from coordinator_svc.store.state_writes import Plan

    member = Member("w1", 3, assigned=ResourceSet.of(["A"]))
    moved = dataclasses.replace(member, member_epoch=4, previous_epoch=3)
    full = Plan.of(GROUP, [MemberRecord(GROUP, member), MemberRecord(GROUP, moved, True)])
    narrow = Plan.of(GROUP, [MemberRecord(GROUP, moved, True)])
    assert full.epoch_only == set() and narrow.epoch_only == {"w1"}


def test_a_holds_instance_id_round_trips_and_rows_from_before_it_read_without_one() -> None:
    """Issue 23: a hold keeps the fenced static member's instance id bound, so `groups.holds`
    carries it; a row written before it has none and reads as None."""
    held = ResourceSet.of(["A"], [TaskId("A", 0)])
    meta = GroupMeta(
        GROUP,
        3,
        holds=(
            Hold("w2", held, 5_000, "User:alice", "pod-1"),
            Hold("w3", held, 6_000, "User:bob"),
        ),
    )
    row = json.loads(json.dumps(rows.group_row(meta)))  # as the JSON column stores it
    assert rows.meta_from_row(row).holds == meta.holds
    for hold in row["holds"]:
        del hold["instance_id"]
    assert [h.instance_id for h in rows.meta_from_row(row).holds] == [None, None]


def test_rewritten_sets_are_stored_lz4_compressed_where_postgresql_has_lz4(
    database_url: str,
) -> None:
    """Migration 0009 puts the columns a group's changes rewrite on lz4 when the server has it: a
    2,000-task target share (every other task of a connector, so 2,000 runs, tens of KB) is
    stored lz4-compressed, and an event carrying it keeps the server's default. This machine's
    PostgreSQL (Debian's) has lz4; the test fails loudly on one without it."""
    migrator = SqlStore(database_url, "migrator", "-")
    migrator.migrate()
    migrator.close()
    store = SqlStore(database_url, "coord-a", "10.0.0.1:7000")
    try:
        with store._transaction(write=False) as conn:
            methods = conn.execute(
                sa.text("SELECT enumvals FROM pg_settings WHERE name = 'default_toast_compression'")
            ).scalar_one()
            assert "lz4" in methods, f"this PostgreSQL has no lz4 ({methods})"
            default = conn.execute(sa.text("SHOW default_toast_compression")).scalar_one()
        lease = store.try_acquire(GROUP)
        assert isinstance(lease, Lease)
        driver = Driver(store, lease)
        driver.run(put_connector, PutConnectorRequest(GROUP, "A", 4_000, {}, caller="10.1.1.1"))
        driver.run(heartbeat, join("w1"))
        driver.run(heartbeat, join("w2"))
        evens = ResourceSet.of(["A"], [("A", t) for t in range(0, 4_000, 2)])
        odds = ResourceSet.of([], [("A", t) for t in range(1, 4_000, 2)])
        _install(driver, {"w1": evens, "w2": odds})
        with store._transaction(write=False) as conn:
            share = conn.execute(
                sa.text(
                    "SELECT pg_column_compression(resources) FROM target_assignment_members "
                    "WHERE group_id = :g AND member_id = 'w1'"
                ),
                {"g": GROUP},
            ).scalar_one()
            installed = conn.execute(
                sa.text(
                    "SELECT pg_column_compression(payload) FROM events "
                    "WHERE group_id = :g AND event_type = 'TARGET_INSTALLED'"
                ),
                {"g": GROUP},
            ).scalar_one()
        assert share == "lz4"
        assert installed == default
    finally:
        store.close()
