"""Ownership (DESIGN 3.16): two `coordinator-svc serve` processes on one PostgreSQL database.

Exactly one process serves a group at a time, holding the group's lease; the other answers
NOT_COORDINATOR naming the owner's advertised address, and FindCoordinator on either names the
owner. When the owner is killed, the other takes the group over once the lease lapses, with its
state intact, and the workers carry on against it. An owner paused past its lease while the other
took over is fenced by the database when it resumes. And a stable group's steady heartbeats write
nothing at all.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from connect.group.v1 import admin_pb2
from sqlalchemy.engine import make_url

from connect_protocol.messages import PutConnectorRequest
from coordinator_svc.core.admin import put_connector as core_put_connector
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.store import Lease, LeaseLost, SqlStore
from tests.support import store_dump
from tests.support.client import (
    Resources,
    ScriptedWorker,
    describe,
    from_cat,
    names,
    parse,
    put_connector,
)
from tests.support.coordinator import CoordinatorProcess, InProcessCoordinator, Stubs
from tests.support.pgcluster import libpq_url

pytestmark = pytest.mark.slow

GROUP = "connect-cluster"
LEASE_MS = 1_500
RENEW_S = LEASE_MS / 3000  # the renewer's period (a third of the lease)
SESSION_TIMEOUT_MS = 3_000  # FAST_DEFAULTS, which CoordinatorProcess passes as server flags
COMPUTE = 10001
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15


# --- fixtures and helpers ---------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    proc: CoordinatorProcess
    stubs: Stubs

    @property
    def address(self) -> str:
        return self.proc.address

    @property
    def node_id(self) -> str:
        return self.proc.node_id


StartNode = Callable[..., Node]


@pytest.fixture
def start_node(database_url: str, tmp_path: Path) -> Iterator[StartNode]:
    """Starts `coordinator-svc serve` processes on the test's database; stops them afterwards."""
    nodes: list[Node] = []

    def start(lease_ms: int = LEASE_MS, node_id: str | None = None, *extra: str) -> Node:
        proc = CoordinatorProcess(
            database_url,
            "--lease-ms",
            str(lease_ms),
            *extra,
            node_id=node_id,
            log_path=tmp_path / f"coordinator-{len(nodes) + 1}.log",
        )
        node = Node(proc, Stubs(proc.address))
        nodes.append(node)
        proc.start()
        return node

    yield start
    for node in nodes:
        node.stubs.close()
        node.proc.close()


@pytest.fixture
def observer(database_url: str) -> Iterator[SqlStore]:
    """Reads the database (dump, list_events); never takes a lease."""
    store = SqlStore(database_url, owner_id="test-observer", advertised_address="-")
    yield store
    store.close()


def leases(database_url: str) -> dict[str, tuple[str, str, int]]:
    """group -> (owner id, advertised address, token), as the database has them."""
    with psycopg.connect(libpq_url(database_url)) as conn:
        rows = conn.execute(
            "SELECT group_id, owner_id, advertised_address, token FROM group_leases"
        ).fetchall()
    return {str(g): (str(o), str(a), int(t)) for g, o, a, t in rows}


def lease_times(database_url: str, group_id: str) -> tuple[str, Any, Any]:
    """(owner id, lease_until, acquired_at) of the group's lease, by the database's clock."""
    with psycopg.connect(libpq_url(database_url)) as conn:
        row = conn.execute(
            "SELECT owner_id, lease_until, acquired_at FROM group_leases WHERE group_id = %s",
            [group_id],
        ).fetchone()
    assert row is not None
    return str(row[0]), row[1], row[2]


def find(stubs: Stubs, group_id: str) -> str:
    resp = stubs.admin.FindCoordinator(
        admin_pb2.FindCoordinatorRequest(group_id=group_id), timeout=10
    )
    assert resp.error_code == 0, resp
    return f"{resp.host}:{resp.port}"


def assert_refused(resp: Any, owner: Node | None) -> None:
    """NOT_COORDINATOR naming the owner (or, while ownership changes, COORDINATOR_NOT_AVAILABLE)."""
    if owner is None:
        assert resp.error_code in (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE), resp
        return
    assert resp.error_code == NOT_COORDINATOR, resp
    assert owner.address in resp.error_message, resp.error_message


def wait_serving(stubs: Stubs, group_id: str, timeout_s: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            group = describe(stubs, group_id)
        except grpc.RpcError as error:
            last = error
        else:
            if group.error_code == 0:
                return group
            assert group.error_code in (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE), group
            last = group
        time.sleep(0.05)
    raise AssertionError(f"{stubs.address} does not serve {group_id} after {timeout_s}s: {last}")


def wait_lease_owner(database_url: str, group_id: str, owner: Node, timeout_s: float) -> float:
    """Wait until the database says `owner` holds the group's lease; returns when (monotonic)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if leases(database_url).get(group_id, ("",))[0] == owner.node_id:
            return time.monotonic()
        time.sleep(0.02)
    raise AssertionError(f"{owner.node_id} did not take {group_id} over in {timeout_s}s")


def view(group: Any) -> Any:
    out = admin_pb2.DescribedGroup()
    out.CopyFrom(group)
    out.ClearField("coordinator_time_ms")
    return out


def res(cat: Any) -> list[str]:
    return names(from_cat(cat))


def round_robin(prepared: Any) -> dict[str, Resources]:
    members = sorted(m.member_id for m in prepared.members)
    connectors = sorted(c.name for c in prepared.catalogue)
    tasks = sorted((c.name, t) for c in prepared.catalogue for t in range(c.task_count))
    out: dict[str, tuple[set[str], set[tuple[str, int]]]] = {m: (set(), set()) for m in members}
    for i, connector in enumerate(connectors):
        out[members[i % len(members)]][0].add(connector)
    for i, task in enumerate(tasks):
        out[members[i % len(members)]][1].add(task)
    return {m: (frozenset(c), frozenset(t)) for m, (c, t) in out.items()}


def drive_to_stable(
    stubs: Stubs, workers: list[ScriptedWorker], group_id: str = GROUP, timeout_s: float = 20.0
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for w in workers:
            resp = w.heartbeat()
            assert resp.error_code in (0, COMPUTE), (w.member_id, resp)
            if resp.error_code == COMPUTE:
                prepared = w.prepare()
                assert prepared.error_code == 0, prepared
                installed = w.install(prepared.group_epoch, round_robin(prepared))
                assert installed.error_code == 0, installed
        group = describe(stubs, group_id)
        if group.state == "STABLE":
            return group
        time.sleep(0.02)
    raise AssertionError(f"group not STABLE after {timeout_s}s: {describe(stubs, group_id)}")


def assert_every_resource_assigned_once(group: Any, workers: list[ScriptedWorker]) -> None:
    assert group.state == "STABLE"
    catalogue = sorted(
        [c.name for c in group.catalogue]
        + [f"{c.name}-{t}" for c in group.catalogue for t in range(c.task_count)]
    )
    assert sorted(r for m in group.members for r in res(m.current_assignment)) == catalogue
    by_member = {m.member_id: m for m in group.members}
    assert sorted(by_member) == sorted(w.member_id for w in workers)
    for w in workers:
        m = by_member[w.member_id]
        assert m.state == "STABLE" and m.member_epoch == group.assignment_epoch == w.epoch
        assert res(m.pending_revocation) == []
        assert res(m.current_assignment) == res(m.target_assignment) == names(w.owned)


def stable_group(stubs: Stubs, member_ids: tuple[str, ...] = ("W1", "W2")) -> list[ScriptedWorker]:
    assert put_connector(stubs, GROUP, "A", 2).error_code == 0
    assert put_connector(stubs, GROUP, "B", 1).error_code == 0
    workers = [ScriptedWorker(stubs, GROUP, m) for m in member_ids]
    for w in workers:
        assert w.join().error_code in (0, COMPUTE)
    group = drive_to_stable(stubs, workers)
    assert_every_resource_assigned_once(group, workers)
    return workers


def follow_coordinator(worker: ScriptedWorker, nodes: list[Node]) -> Any:
    """What an agent does when its coordinator is gone or not the owner: ask FindCoordinator of
    a process that answers, switch to the address it names, and heartbeat there."""
    try:
        resp = worker.heartbeat()
        if resp.error_code not in (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE):
            return resp
    except grpc.RpcError:
        pass
    for node in nodes:
        try:
            address = find(node.stubs, worker.group_id)
        except grpc.RpcError:
            continue
        worker.stubs = next(n.stubs for n in nodes if n.address == address)
        return worker.heartbeat()
    raise AssertionError("no coordinator answers FindCoordinator")


# --- (a) exactly one process serves a group ---------------------------------------------------


def test_exactly_one_process_serves_a_group_and_the_other_names_it(
    start_node: StartNode, database_url: str, observer: SqlStore
) -> None:
    p1, p2 = start_node(), start_node()
    # Each group is owned by the process first asked about it: g1 by P1, g2 by P2.
    assert put_connector(p1.stubs, "g1", "A", 2).error_code == 0
    assert put_connector(p2.stubs, "g2", "B", 1).error_code == 0
    owner_of = {"g1": p1, "g2": p2}
    other_of = {"g1": p2, "g2": p1}
    tenures = leases(database_url)
    assert {g: (o, a) for g, (o, a, _) in tenures.items()} == {
        "g1": (p1.node_id, p1.address),
        "g2": (p2.node_id, p2.address),
    }

    # A worker that asks the wrong process is told where to go, and joins there.
    w = ScriptedWorker(p2.stubs, "g1", "W1")
    assert_refused(w.join(), p1)
    assert follow_coordinator(w, [p2, p1]).error_code == COMPUTE
    assert w.stubs is p1.stubs
    prepared = w.prepare()
    assert w.install(prepared.group_epoch, {"W1": parse("A", "A-0", "A-1")}).error_code == 0
    assert w.heartbeat().error_code == 0 and names(w.owned) == ["A", "A-0", "A-1"]
    events_before = observer.list_events()

    # For several lease lengths (so through several renewals), at every moment: the owner serves,
    # the other refuses every request naming the owner, and FindCoordinator agrees on both.
    deadline = time.monotonic() + 2 * LEASE_MS / 1000
    rounds = 0
    while time.monotonic() < deadline or rounds < 3:
        rounds += 1
        assert w.heartbeat().error_code == 0
        for group_id, owner in owner_of.items():
            other = other_of[group_id]
            assert describe(owner.stubs, group_id).error_code == 0
            assert_refused(describe(other.stubs, group_id), owner)
            assert find(owner.stubs, group_id) == find(other.stubs, group_id) == owner.address
            stranger = ScriptedWorker(other.stubs, group_id, "X")
            assert_refused(stranger.join(), owner)
            stranger.epoch = 1
            assert_refused(stranger.prepare(), owner)
            assert_refused(stranger.install(2, {"X": parse("A")}), owner)
            assert_refused(put_connector(other.stubs, group_id, "Z", 1), owner)
            altered = other.stubs.admin.AlterGroupConfigs(
                admin_pb2.AlterGroupConfigsRequest(
                    group_id=group_id, set={"session.timeout.ms": "5000"}
                ),
                timeout=10,
            )
            assert_refused(altered, owner)
        time.sleep(0.05)

    # Same tenures throughout (same tokens: no lapse, no flapping), and no refused request wrote.
    assert leases(database_url) == tenures
    assert observer.list_events() == events_before
    assert w.heartbeat().error_code == 0 and names(w.owned) == ["A", "A-0", "A-1"]


# --- (b) the owner is killed: the other takes over without losing state ------------------------


def test_killing_the_owner_lets_the_other_take_over_without_losing_state(
    start_node: StartNode, database_url: str, observer: SqlStore
) -> None:
    p1, p2 = start_node(), start_node()
    w1, w2 = stable_group(p1.stubs)
    assert find(p2.stubs, GROUP) == p1.address
    # Mid-rebalance: W3 joins, W1 installs a target that moves work to W3; W1 must revoke.
    w3 = ScriptedWorker(p1.stubs, GROUP, "W3")
    assert w3.join().error_code == 0
    workers = [w1, w2, w3]
    for w in workers:
        resp = w.heartbeat(report_owned=False)
        if resp.error_code == COMPUTE:
            prepared = w.prepare()
            assert w.install(prepared.group_epoch, round_robin(prepared)).error_code == 0
    for w in workers:
        w.heartbeat(report_owned=False)
    before = view(describe(p1.stubs, GROUP))
    assert before.state == "RECONCILING"
    assert any(res(m.pending_revocation) for m in before.members), before
    dump_before = store_dump.dump(observer)
    [(owner_before, _, token_before)] = leases(database_url).values()
    assert owner_before == p1.node_id

    killed_at = time.monotonic()
    p1.proc.kill()  # SIGKILL
    dead_owner, dead_owner_until, _ = lease_times(database_url, GROUP)
    assert dead_owner == p1.node_id
    # P2 takes the group over by itself (its renewer adopts groups whose lease is free) once the
    # lease lapses, and not before (by the database's clock).
    taken_at = wait_lease_owner(database_url, GROUP, p2, timeout_s=10)
    assert taken_at - killed_at <= LEASE_MS / 1000 + RENEW_S + 3.0
    [(owner_after, address_after, token_after)] = leases(database_url).values()
    assert (owner_after, address_after, token_after) == (p2.node_id, p2.address, token_before + 1)
    assert lease_times(database_url, GROUP)[2] >= dead_owner_until

    # Nothing lost, nothing changed: epochs, members, assignments, pending revocations.
    assert view(wait_serving(p2.stubs, GROUP)) == before
    assert store_dump.dump(observer) == dump_before
    assert find(p2.stubs, GROUP) == p2.address

    # The workers find the new owner and carry on at their epochs: no fencing, no rebalance.
    for w in workers:
        assert follow_coordinator(w, [p1, p2]).error_code in (0, COMPUTE)
        assert w.stubs is p2.stubs
    group = drive_to_stable(p2.stubs, workers)
    assert group.group_epoch == before.group_epoch, "the takeover itself bumps nothing"
    assert_every_resource_assigned_once(group, workers)

    # P2 re-armed the session timers: W3 goes silent and P2 removes it; the group rebalances.
    silent_since = time.monotonic()
    deadline = silent_since + 10
    while len(describe(p2.stubs, GROUP).members) == 3:
        assert time.monotonic() < deadline, "W3's session never expired on the new owner"
        for w in (w1, w2):
            assert w.heartbeat().error_code in (0, COMPUTE)
        time.sleep(0.1)
    assert time.monotonic() - silent_since >= SESSION_TIMEOUT_MS / 1000 - 0.5
    group = drive_to_stable(p2.stubs, [w1, w2])
    assert group.group_epoch == before.group_epoch + 1
    assert_every_resource_assigned_once(group, [w1, w2])
    expired = [
        ev["member_id"]
        for ev in observer.list_events(GROUP)
        if ev["event_type"] == "MEMBER_SESSION_EXPIRED"
    ]
    assert expired == ["W3"]


# --- (c) an owner paused past its lease is fenced ----------------------------------------------


def test_an_owner_paused_past_its_lease_is_fenced_when_it_resumes(
    start_node: StartNode, database_url: str, observer: SqlStore
) -> None:
    p1, p2 = start_node(), start_node()
    workers = stable_group(p1.stubs)
    w1 = workers[0]
    e = describe(p1.stubs, GROUP).group_epoch
    [(owner, _, old_token)] = leases(database_url).values()
    assert owner == p1.node_id
    stale_lease = Lease(GROUP, p1.node_id, old_token, time.monotonic() + 3600)

    paused_at = time.monotonic()
    p1.proc.signal(signal.SIGSTOP)
    try:
        wait_lease_owner(database_url, GROUP, p2, timeout_s=10)
        wait_serving(p2.stubs, GROUP)
        for w in workers:
            w.stubs = p2.stubs
        # The new owner changes the group: a connector is added and the group rebalances.
        assert put_connector(p2.stubs, GROUP, "C", 1).error_code == 0
        group = drive_to_stable(p2.stubs, workers)
        assert group.group_epoch == e + 1
        # Keep the old owner stopped past the members' session timeout too, so that its own
        # session timers are overdue when it resumes (they must not write either).
        while time.monotonic() - paused_at < SESSION_TIMEOUT_MS / 1000 + 0.5:
            for w in workers:
                assert w.heartbeat().error_code == 0
            time.sleep(0.1)
        written_by_new_owner = store_dump.dump(observer)
        described_by_new_owner = view(describe(p2.stubs, GROUP))
    finally:
        p1.proc.signal(signal.SIGCONT)

    # The resumed old owner refuses state changes: its lease is gone, the database says whose
    # it is now.
    assert_refused(put_connector(p1.stubs, GROUP, "D", 1), p2)
    stranger = ScriptedWorker(p1.stubs, GROUP, "W9")
    assert_refused(stranger.join(), p2)
    old_view = ScriptedWorker(p1.stubs, GROUP, "W1")
    old_view.epoch, old_view.owned = w1.epoch, w1.owned
    assert_refused(old_view.heartbeat(report_owned=False), p2)
    assert_refused(old_view.leave(), p2)
    assert find(p1.stubs, GROUP) == p2.address
    time.sleep(2 * RENEW_S)  # its renewer and overdue timers have run by now
    for w in workers:
        assert w.heartbeat().error_code == 0

    # The database holds what the new owner wrote, and nothing from the old one: no member W9,
    # no connector D, no leave of W1, no session expiry from the old owner's timers.
    assert store_dump.dump(observer) == written_by_new_owner
    assert view(describe(p2.stubs, GROUP)) == described_by_new_owner
    events = observer.list_events(GROUP)
    assert not [ev for ev in events if ev["member_id"] in ("W9",)]
    assert not [ev for ev in events if ev["payload"].get("connector") == "D"]
    assert not [
        ev
        for ev in events
        if ev["event_type"] in ("MEMBER_LEFT", "MEMBER_SESSION_EXPIRED", "MEMBER_FENCED")
    ]
    group = describe(p2.stubs, GROUP)
    assert [c.name for c in group.catalogue] == ["A", "B", "C"]
    assert_every_resource_assigned_once(group, workers)

    # At the store level: a commit under the old owner's lease (which its own clock would still
    # call valid for an hour) is refused by the database and writes nothing.
    with SqlStore(database_url, p1.node_id, p1.address, lease_ms=LEASE_MS) as old_store:
        state = old_store.load_group(GROUP)
        now_ms = int(time.time() * 1000)
        put_e = PutConnectorRequest(GROUP, "E", 1)
        records = core_put_connector(state, put_e, now_ms, GroupConfigDefaults()).records
        assert records
        with pytest.raises(LeaseLost) as lost:
            old_store.commit(stale_lease, records)
    assert lost.value.holder is not None
    assert (lost.value.holder.owner_id, lost.value.holder.advertised_address) == (
        p2.node_id,
        p2.address,
    )
    assert store_dump.dump(observer) == written_by_new_owner


# --- (d) steady heartbeats write nothing ------------------------------------------------------


def _client_backends(admin: psycopg.Connection[Any], database: str) -> list[int]:
    rows = admin.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type = 'client backend'",
        [database],
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def _flush_statistics(admin: psycopg.Connection[Any], database: str) -> None:
    """PostgreSQL backends publish their statistics lazily (up to seconds later), except when they
    exit. So end every session on the test's database (the coordinators' pooled connections and
    ours; the coordinators reconnect when they next need the database) and wait until they are
    gone: from then on the cumulative statistics of that database are exact."""
    for pid in _client_backends(admin, database):
        admin.execute("SELECT pg_terminate_backend(%s, 10000)", [pid])
    deadline = time.monotonic() + 10
    while _client_backends(admin, database):
        assert time.monotonic() < deadline
        time.sleep(0.02)


def _database_stats(admin: psycopg.Connection[Any], database: str) -> dict[str, int]:
    admin.execute("SELECT pg_stat_clear_snapshot()")
    row = admin.execute(
        "SELECT xact_commit, xact_rollback, tup_inserted, tup_updated, tup_deleted "
        "FROM pg_stat_database WHERE datname = %s",
        [database],
    ).fetchone()
    assert row is not None
    keys = ("xact_commit", "xact_rollback", "tup_inserted", "tup_updated", "tup_deleted")
    return dict(zip(keys, (int(v) for v in row), strict=True))


def _table_writes_and_row_versions(database_url: str) -> tuple[Any, Any]:
    """Per table: rows inserted/updated/deleted so far; and every row's (ctid, xmin), which an
    UPDATE changes even when it writes the same values."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        writes = conn.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables "
            "ORDER BY relname"
        ).fetchall()
        tables = [str(name) for (name, *_rest) in writes]
        versions = {
            table: conn.execute(
                f'SELECT ctid::text, xmin::text FROM "{table}" ORDER BY ctid'
            ).fetchall()
            for table in tables
        }
    return writes, versions


def test_steady_heartbeats_write_nothing(
    start_node: StartNode, database_url: str, postgres_admin_url: str, observer: SqlStore
) -> None:
    # The only periodic write of a coordinator is its lease renewal (every third of the lease),
    # and its only periodic read the feature levels (every --acl-refresh-ms, issue 27), neither
    # caused by heartbeats: long periods keep them out of the measured window.
    p1 = start_node(600_000, None, "--acl-refresh-ms", "3600000")
    p2 = start_node(600_000, None, "--acl-refresh-ms", "3600000")
    workers = stable_group(p1.stubs, ("W1", "W2", "W3"))
    assert_refused(describe(p2.stubs, GROUP), p1)
    for w in workers:  # steady from here on
        assert w.heartbeat().error_code == 0
    dump = store_dump.dump(observer)
    observer.close()
    database = make_url(database_url).database
    assert database

    answers: set[tuple[str, int, tuple[str, ...]]] = set()

    def steady_heartbeats() -> None:
        for i in range(200):
            w = workers[i % len(workers)]
            resp = w.heartbeat(full=(i % 10 == 0))
            assert resp.error_code == 0, resp
            answers.add((w.member_id, resp.member_epoch, tuple(names(w.owned))))

    with psycopg.connect(libpq_url(postgres_admin_url), autocommit=True) as admin:
        _flush_statistics(admin, database)
        tables_before = _table_writes_and_row_versions(database_url)
        windows = []
        # The database's statistics also count autovacuum's transactions (an autovacuum worker
        # visits each database about once a minute, even an idle one); a window it happened to
        # fall into is measured again. A coordinator that wrote would show in every window.
        for _attempt in range(3):
            _flush_statistics(admin, database)
            before = _database_stats(admin, database)
            steady_heartbeats()
            # Neither coordinator even opened a database session to serve them.
            assert _client_backends(admin, database) == []
            after = _database_stats(admin, database)
            windows.append({k: after[k] - before[k] for k in before})
            if windows[-1] == dict.fromkeys(before, 0):
                break
        assert windows[-1] == dict.fromkeys(before, 0), windows
        assert len(answers) == len(workers), "every worker got the same answer every time"
        tables_after = _table_writes_and_row_versions(database_url)

    assert tables_after == tables_before
    with SqlStore(database_url, "test-observer-2", "-") as again:
        assert store_dump.dump(again) == dump
    group = describe(p1.stubs, GROUP)
    assert_every_resource_assigned_once(group, workers)


# --- the owner's leases and timers, in process -------------------------------------------------
# Regression tests for two races in the GroupManager, provoked deterministically by wrapping the
# call during which the race window is open.


def test_a_group_taken_while_the_leases_are_being_renewed_stays_owned(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with InProcessCoordinator(database_url, lease_ms=LEASE_MS) as c:
        assert c.stubs is not None
        assert put_connector(c.stubs, "g1", "A", 1).error_code == 0
        store = c.manager.store
        real_renew = store.renew
        renewed: list[Any] = []

        def renew(to_renew: Any) -> list[Lease]:
            to_renew = list(to_renew)
            if not renewed:
                # A request takes group g2 while this renewal (which does not know it) is on its
                # way to the database.
                assert c.stubs is not None
                assert put_connector(c.stubs, "g2", "B", 1).error_code == 0
            result = real_renew(to_renew)
            renewed.append(result)
            return result

        monkeypatch.setattr(store, "renew", renew)
        deadline = time.monotonic() + 5
        while len(renewed) < 2:  # the racing renewal, and the next one
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert c.manager.owned_group_ids() == ["g1", "g2"]
        time.sleep(2 * LEASE_MS / 1000)
        assert c.manager.owned_group_ids() == ["g1", "g2"]
        tenures = leases(database_url)
        assert (tenures["g2"][0], tenures["g2"][2]) == (c.node_id, 1), "g2's lease never lapsed"


def test_a_heartbeat_that_lands_as_its_session_timer_pops_keeps_the_member(
    database_url: str, monkeypatch: pytest.MonkeyPatch, observer: SqlStore
) -> None:
    with InProcessCoordinator(database_url, lease_ms=LEASE_MS) as c:
        assert c.stubs is not None
        stubs = c.stubs
        w1, w2 = workers = stable_group(stubs)
        resp = stubs.admin.AlterGroupConfigs(
            admin_pb2.AlterGroupConfigsRequest(
                group_id=GROUP, set={"session.timeout.ms": "1000", "heartbeat.interval.ms": "100"}
            ),
            timeout=10,
        )
        assert resp.error_code == 0
        for w in workers:
            assert w.heartbeat().error_code == 0
        timers = c.manager._timers
        real_fire = timers._fire
        raced: list[Any] = []

        def fire(group_id: str, key: Any) -> None:
            if key == ("session", "W2") and not raced:
                # W2's heartbeat arrives just after its session timer popped, before the timer
                # is handled: it is answered normally, so W2 must stay a member.
                raced.append(w2.heartbeat())
            real_fire(group_id, key)

        monkeypatch.setattr(timers, "_fire", fire)
        deadline = time.monotonic() + 10
        while not raced:  # W1 keeps heartbeating; W2 is silent until its timer pops
            assert time.monotonic() < deadline
            assert w1.heartbeat().error_code == 0
            time.sleep(0.05)
        assert raced[0].error_code == 0, raced[0]
        time.sleep(0.2)
        for w in workers:
            assert w.heartbeat().error_code == 0
        group = describe(stubs, GROUP)
        assert sorted(m.member_id for m in group.members) == ["W1", "W2"]
        assert_every_resource_assigned_once(group, workers)
        assert not [
            ev for ev in observer.list_events(GROUP) if ev["event_type"] == "MEMBER_SESSION_EXPIRED"
        ]


# --- (d) node ids and groups that do not exist ------------------------------------------------


def test_a_process_restarted_with_the_same_node_id_starts_a_new_tenure(
    start_node: StartNode, database_url: str, observer: SqlStore
) -> None:
    """A reused --node-id must not let a new process share its paused predecessor's lease: the
    newcomer waits for the lease to lapse and takes a new token, and the old one is fenced."""
    p1 = start_node(node_id="coordinator-0")
    stable_group(p1.stubs)
    [(_, _, old_token)] = leases(database_url).values()
    p1.proc.signal(signal.SIGSTOP)
    try:
        p2 = start_node(node_id="coordinator-0")
        group = wait_serving(p2.stubs, GROUP)
        (owner, address, token) = leases(database_url)[GROUP]
        assert (owner, address, token) == ("coordinator-0", p2.address, old_token + 1)
        before = store_dump.dump(observer)
    finally:
        p1.proc.signal(signal.SIGCONT)
    assert_refused(put_connector(p1.stubs, GROUP, "D", 1), p2)
    assert store_dump.dump(observer) == before
    assert [c.name for c in group.catalogue] == ["A", "B"]


def test_asking_about_a_group_that_does_not_exist_leases_nothing(
    start_node: StartNode, database_url: str, observer: SqlStore
) -> None:
    p1, p2 = start_node(), start_node()
    assert describe(p1.stubs, "ghost").error_code == 69  # GROUP_ID_NOT_FOUND
    assert find(p1.stubs, "ghost") == p1.address
    stranger = ScriptedWorker(p1.stubs, "ghost", "W1")
    stranger.epoch = 5
    assert stranger.heartbeat().error_code == 25  # UNKNOWN_MEMBER_ID
    assert observer.holder("ghost") is None
    # So the other process can serve it at once: nobody keeps it.
    assert find(p2.stubs, "ghost") == p2.address
    assert observer.holder("ghost") is None
    assert observer.group_ids() == []


def test_operator_commands_follow_not_coordinator_to_the_owner(
    start_node: StartNode, observer: SqlStore
) -> None:
    import subprocess
    import sys

    from tests.support.coordinator import REPO

    p1, p2 = start_node(), start_node()
    assert put_connector(p1.stubs, GROUP, "A", 1).error_code == 0  # p1 owns the group
    env = {"PYTHONPATH": f"{REPO}:{REPO / 'generated'}", "PATH": "/usr/bin:/bin"}
    base = [sys.executable, "-m", "coordinator_svc.cli"]
    for args in (
        ["put-connector", "--coordinator", p2.address, "--tasks", "2", GROUP, "B"],
        ["alter-configs", "--coordinator", p2.address, GROUP, "--set", "session.timeout.ms=4000"],
        ["delete-connector", "--coordinator", p2.address, GROUP, "A"],
        ["describe", "--coordinator", p2.address, GROUP],
    ):
        done = subprocess.run(base + args, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stderr)
    state = observer.load_group(GROUP)
    assert state is not None
    assert sorted(state.catalogue) == ["B"] and state.configs["session.timeout.ms"] == "4000"
