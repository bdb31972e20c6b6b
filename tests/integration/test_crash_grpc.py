"""Crash safety (DESIGN 3.16): `coordinator-svc serve` is killed with SIGKILL at several points of
a rebalance and restarted on the same PostgreSQL database. The restarted process takes the group
over once the dead one's lease lapses, loads exactly the state that was committed (epochs, target,
every member's current assignment and pending revocation: compared with the describe output and
the database dump taken just before the kill), re-arms its timers, and the rebalance completes.

Points of the kill: (a) after a join bumped the group epoch, before the install; (b) after the
install, before the members reconcile; (c) while a member is UNREVOKED; (d) inside a commit's
transaction (PostgreSQL holds it on a table lock we take); (e) with a delayed rebalance scheduled,
both when its deadline passes after the restart and while the coordinator is down.

A test client (`ScriptedWorker`) plays the workers and the assignor member, which installs a
round-robin target computed from PrepareAssignment.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
from connect.group.v1 import admin_pb2

from coordinator_svc.store import SqlStore
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
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.support.pgcluster import libpq_url

pytestmark = pytest.mark.slow

GROUP = "connect-cluster"
LEASE_MS = 1_500
COMPUTE = 10001
NOT_COORDINATOR = 16
COORDINATOR_NOT_AVAILABLE = 15
EVERYTHING = parse("A", "A-0", "A-1", "B", "B-0")


# --- fixtures and helpers ---------------------------------------------------------------------


class Cluster:
    """One coordinator process at a time on one database and one port; `crash_and_restart`
    SIGKILLs it and starts a fresh process (new node id) there."""

    def __init__(self, database_url: str, log_dir: Path) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.procs: list[CoordinatorProcess] = []
        self.stubs_opened: list[Stubs] = []
        self.proc = self._start(None)
        self.stubs = self._stubs()
        self.observer = _observer(database_url)

    def _start(self, port: int | None) -> CoordinatorProcess:
        proc = CoordinatorProcess(
            self.database_url,
            "--lease-ms",
            str(LEASE_MS),
            port=port,
            log_path=self.log_dir / f"coordinator-{len(self.procs)}.log",
        )
        self.procs.append(proc)
        return proc.start()

    def _stubs(self) -> Stubs:
        stubs = Stubs(self.proc.address)
        self.stubs_opened.append(stubs)
        return stubs

    def kill(self) -> None:
        assert self.proc.proc is not None
        self.proc.signal(signal.SIGKILL)
        assert self.proc.proc.wait(10) == -signal.SIGKILL

    def restart(self, workers: Iterable[ScriptedWorker] = ()) -> float:
        """Start a new process on the same port and wait until it serves the group (it takes
        the group over when the dead process's lease lapses). Returns the seconds it took."""
        started = time.monotonic()
        self.proc = self._start(self.proc.port)
        self.stubs = self._stubs()  # a fresh channel: the old one may sit in reconnect backoff
        for worker in workers:
            worker.stubs = self.stubs
        wait_serving(self.stubs, GROUP)
        return time.monotonic() - started

    def crash_and_restart(self, workers: Iterable[ScriptedWorker] = ()) -> float:
        self.kill()
        return self.restart(workers)

    def close(self) -> None:
        for stubs in self.stubs_opened:
            stubs.close()
        for proc in self.procs:
            proc.close()
        self.observer.close()


def _observer(database_url: str) -> SqlStore:
    """A store that only reads (dump, load_group, list_events); it never takes a lease."""
    return SqlStore(database_url, owner_id="test-observer", advertised_address="-")


@pytest.fixture
def cluster(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(database_url, tmp_path)
    try:
        yield c
    finally:
        c.close()


def wait_serving(stubs: Stubs, group_id: str, timeout_s: float = 20.0) -> Any:
    """Poll DescribeGroups until this process serves the group (it answers NOT_COORDINATOR while
    the previous owner's lease is live)."""
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


def view(group: Any) -> Any:
    """The describe output without the coordinator's clock reading."""
    out = admin_pb2.DescribedGroup()
    out.CopyFrom(group)
    out.ClearField("coordinator_time_ms")
    return out


def snapshot(cluster: Cluster) -> tuple[Any, dict[str, list[dict[str, Any]]]]:
    return view(describe(cluster.stubs, GROUP)), store_dump.dump(cluster.observer)


def assert_state_intact(cluster: Cluster, before: tuple[Any, Any]) -> Any:
    """Right after the takeover: the describe output and every row of every state table and of
    the audit trail are what they were just before the kill."""
    described, dump = snapshot(cluster)
    assert dump == before[1]
    assert described == before[0]
    return described


def res(cat: Any) -> list[str]:
    return names(from_cat(cat))


def members_view(group: Any) -> dict[str, tuple[int, str, list[str], list[str], list[str]]]:
    """member -> (epoch, state, current, pending revocation, target)."""
    return {
        m.member_id: (
            m.member_epoch,
            m.state,
            res(m.current_assignment),
            res(m.pending_revocation),
            res(m.target_assignment),
        )
        for m in group.members
    }


def round_robin(prepared: Any) -> dict[str, Resources]:
    """A valid, balanced target: connectors and tasks dealt separately over the sorted members."""
    members = sorted(m.member_id for m in prepared.members)
    connectors = sorted(c.name for c in prepared.catalogue)
    tasks = sorted((c.name, t) for c in prepared.catalogue for t in range(c.task_count))
    out: dict[str, tuple[set[str], set[tuple[str, int]]]] = {m: (set(), set()) for m in members}
    for i, connector in enumerate(connectors):
        out[members[i % len(members)]][0].add(connector)
    for i, task in enumerate(tasks):
        out[members[i % len(members)]][1].add(task)
    return {m: (frozenset(c), frozenset(t)) for m, (c, t) in out.items()}


def drive_to_stable(stubs: Stubs, workers: list[ScriptedWorker], timeout_s: float = 20.0) -> Any:
    """Heartbeat every worker in turn; whoever is asked to compute prepares and installs a
    round-robin target. Until the group is STABLE."""
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
        group = describe(stubs, GROUP)
        if group.state == "STABLE":
            return group
        time.sleep(0.02)
    raise AssertionError(f"group not STABLE after {timeout_s}s: {describe(stubs, GROUP)}")


def assert_every_resource_assigned_once(group: Any, workers: list[ScriptedWorker]) -> None:
    assert group.state == "STABLE"
    catalogue = sorted(
        [c.name for c in group.catalogue]
        + [f"{c.name}-{t}" for c in group.catalogue for t in range(c.task_count)]
    )
    held = [r for m in group.members for r in res(m.current_assignment)]
    assert sorted(held) == catalogue, "every catalogue resource exactly once"
    by_member = {m.member_id: m for m in group.members}
    assert sorted(by_member) == sorted(w.member_id for w in workers)
    for w in workers:
        m = by_member[w.member_id]
        assert m.state == "STABLE" and m.member_epoch == group.assignment_epoch
        assert res(m.pending_revocation) == []
        assert res(m.current_assignment) == res(m.target_assignment) == names(w.owned)
        assert w.epoch == m.member_epoch


def catalogue(stubs: Stubs) -> None:
    assert put_connector(stubs, GROUP, "A", 2).error_code == 0
    assert put_connector(stubs, GROUP, "B", 1).error_code == 0


def w1_stable_with_everything(stubs: Stubs) -> ScriptedWorker:
    catalogue(stubs)
    w1 = ScriptedWorker(stubs, GROUP, "W1")
    assert w1.join().error_code == COMPUTE
    prepared = w1.prepare()
    assert w1.install(prepared.group_epoch, {"W1": EVERYTHING}).error_code == 0
    assert w1.heartbeat().error_code == 0
    assert names(w1.owned) == names(EVERYTHING)
    assert describe(stubs, GROUP).state == "STABLE"
    return w1


def w2_joins_and_w1_installs_a_split(stubs: Stubs) -> tuple[ScriptedWorker, ScriptedWorker, int]:
    w1 = w1_stable_with_everything(stubs)
    w2 = ScriptedWorker(stubs, GROUP, "W2")
    assert w2.join().error_code == 0
    assert w1.heartbeat().error_code == COMPUTE
    prepared = w1.prepare()
    split = {"W1": parse("A", "A-0", "A-1"), "W2": parse("B", "B-0")}
    assert w1.install(prepared.group_epoch, split).error_code == 0
    return w1, w2, int(prepared.group_epoch)


# --- (a) (b) (c): kills between the steps of a rebalance --------------------------------------


def test_kill_after_a_join_bumped_the_epoch_before_the_install(cluster: Cluster) -> None:
    stubs = cluster.stubs
    w1 = w1_stable_with_everything(stubs)
    e = describe(stubs, GROUP).group_epoch
    w2 = ScriptedWorker(stubs, GROUP, "W2")
    assert w2.join().error_code == 0
    assert w1.heartbeat().error_code == COMPUTE  # W1 is asked to compute, and crashes with us
    before = snapshot(cluster)
    assert (before[0].state, before[0].group_epoch, before[0].assignment_epoch) == (
        "ASSIGNING",
        e + 1,
        e,
    )

    cluster.crash_and_restart([w1, w2])
    group = assert_state_intact(cluster, before)
    assert members_view(group) == {
        "W1": (e, "STABLE", names(EVERYTHING), [], names(EVERYTHING)),
        "W2": (e, "STABLE", [], [], []),
    }

    # The compute request survived: the assignor member is asked again, for the same epoch.
    assert w1.heartbeat().error_code == COMPUTE
    assert w1.prepare().group_epoch == e + 1
    group = drive_to_stable(cluster.stubs, [w1, w2])
    assert group.group_epoch == group.assignment_epoch == e + 1
    assert_every_resource_assigned_once(group, [w1, w2])


def test_kill_after_the_install_before_the_members_reconcile(cluster: Cluster) -> None:
    stubs = cluster.stubs
    w1, w2, e = w2_joins_and_w1_installs_a_split(stubs)
    before = snapshot(cluster)
    assert (before[0].group_epoch, before[0].assignment_epoch) == (e, e)
    assert members_view(before[0]) == {
        "W1": (e - 1, "STABLE", names(EVERYTHING), [], ["A", "A-0", "A-1"]),
        "W2": (e - 1, "STABLE", [], [], ["B", "B-0"]),
    }

    cluster.crash_and_restart([w1, w2])
    assert_state_intact(cluster, before)

    # The installed target drives the reconciliation after the restart: W2 moves to the target
    # epoch holding nothing (W1 still runs B and B-0), W1 must revoke them first.
    assert w2.heartbeat().error_code == 0
    assert (w2.epoch, names(w2.owned)) == (e, [])
    assert w1.heartbeat(report_owned=False).error_code == 0
    assert (w1.epoch, names(w1.owned)) == (e - 1, ["A", "A-0", "A-1"])
    assert members_view(describe(cluster.stubs, GROUP))["W1"][1:4] == (
        "UNREVOKED",
        ["A", "A-0", "A-1"],
        ["B", "B-0"],
    )
    group = drive_to_stable(cluster.stubs, [w1, w2])
    assert group.group_epoch == group.assignment_epoch == e
    assert members_view(group) == {
        "W1": (e, "STABLE", ["A", "A-0", "A-1"], [], ["A", "A-0", "A-1"]),
        "W2": (e, "STABLE", ["B", "B-0"], [], ["B", "B-0"]),
    }
    assert_every_resource_assigned_once(group, [w1, w2])


def test_kill_while_a_member_is_unrevoked(cluster: Cluster) -> None:
    stubs = cluster.stubs
    w1, w2, e = w2_joins_and_w1_installs_a_split(stubs)
    assert w2.heartbeat().error_code == 0 and names(w2.owned) == []
    # W1 is told to give B and B-0 up; the kill comes before it acknowledges.
    assert w1.heartbeat(report_owned=False).error_code == 0
    before = snapshot(cluster)
    assert members_view(before[0]) == {
        "W1": (e - 1, "UNREVOKED", ["A", "A-0", "A-1"], ["B", "B-0"], ["A", "A-0", "A-1"]),
        "W2": (e, "UNRELEASED", [], [], ["B", "B-0"]),
    }

    cluster.crash_and_restart([w1, w2])
    assert_state_intact(cluster, before)

    # The pending revocation survived: B and B-0 go to W2 only once W1 has acknowledged.
    assert w2.heartbeat().error_code == 0 and names(w2.owned) == []
    assert w1.heartbeat().error_code == 0  # owned no longer holds B, B-0: acknowledged
    assert (w1.epoch, names(w1.owned)) == (e, ["A", "A-0", "A-1"])
    assert w2.heartbeat().error_code == 0
    assert (w2.epoch, names(w2.owned)) == (e, ["B", "B-0"])
    group = describe(cluster.stubs, GROUP)
    assert group.group_epoch == e, "no rebalance was needed to finish"
    assert_every_resource_assigned_once(group, [w1, w2])
    acked = [
        ev
        for ev in cluster.observer.list_events(GROUP)
        if ev["event_type"] == "REVOCATION_ACKNOWLEDGED"
    ]
    assert [ev["member_id"] for ev in acked] == ["W1"]


# --- (d): a kill inside a commit's transaction ------------------------------------------------


def _backends_waiting_on_a_lock(conn: psycopg.Connection[Any]) -> list[tuple[int, str]]:
    rows = conn.execute(
        "SELECT pid, query FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND wait_event_type = 'Lock'"
    ).fetchall()
    return [(int(pid), str(query)) for pid, query in rows]


def test_kill_inside_a_commit_leaves_the_old_state_entirely(
    cluster: Cluster, database_url: str
) -> None:
    stubs = cluster.stubs
    w1 = w1_stable_with_everything(stubs)
    e = describe(stubs, GROUP).group_epoch
    before = snapshot(cluster)

    w2 = ScriptedWorker(stubs, GROUP, "W2")
    outcome: list[Any] = []
    with (
        psycopg.connect(libpq_url(database_url)) as locker,
        psycopg.connect(libpq_url(database_url), autocommit=True) as watcher,
    ):
        # Our transaction holds the members table: the coordinator's next state-changing commit
        # takes the lease row, writes the groups row, then waits for us at its members upsert.
        locker.execute("LOCK TABLE members IN ACCESS EXCLUSIVE MODE")

        def join() -> None:
            try:
                outcome.append(w2.join())
            except grpc.RpcError as error:
                outcome.append(error)

        joiner = threading.Thread(target=join, daemon=True)
        joiner.start()
        # (Its lease renewal may queue too, behind the lease row the commit holds.)
        deadline = time.monotonic() + 10
        while not (
            waiting := [
                pid
                for pid, query in _backends_waiting_on_a_lock(watcher)
                if query.lower().startswith("insert into members")
            ]
        ):
            assert time.monotonic() < deadline, "the coordinator's commit never blocked"
            time.sleep(0.02)
        [pid] = waiting
        # The commit is mid-transaction: it holds the lease row and has written the groups row.
        locks = {
            (str(rel), str(mode))
            for rel, mode in watcher.execute(
                "SELECT relation::regclass::text, mode FROM pg_locks "
                "WHERE pid = %s AND locktype = 'relation' AND granted",
                [pid],
            ).fetchall()
        }
        assert ("groups", "RowExclusiveLock") in locks
        assert ("group_leases", "RowShareLock") in locks

        cluster.kill()  # SIGKILL while its transaction is open
        locker.rollback()  # let the orphaned backend run on: it must never commit
        joiner.join(10)
        assert outcome and isinstance(outcome[0], grpc.RpcError), outcome
        # The orphaned backend notices its client is gone and rolls back.
        deadline = time.monotonic() + 10
        while watcher.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the orphaned backend did not go away"
            time.sleep(0.05)

    cluster.restart([w1, w2])
    # Not a mix: nothing of the join (epoch bump, member row, events) was committed.
    assert_state_intact(cluster, before)
    assert describe(cluster.stubs, GROUP).group_epoch == e

    # W2 never got an answer; it joins again and the group rebalances.
    assert w2.join().error_code == 0
    group = drive_to_stable(cluster.stubs, [w1, w2])
    assert group.group_epoch == group.assignment_epoch == e + 1
    assert_every_resource_assigned_once(group, [w1, w2])


# --- (e): a delayed rebalance scheduled before the crash fires after the restart ---------------


def keep_alive_until(
    workers: list[ScriptedWorker], condition: Callable[[], Any], timeout_s: float = 20.0
) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for w in workers:
            resp = w.heartbeat()
            assert resp.error_code in (0, COMPUTE), (w.member_id, resp)
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


@pytest.mark.parametrize("deadline_passes", ["after_the_restart", "while_down"])
def test_a_delayed_rebalance_scheduled_before_the_crash_fires_after_the_restart(
    cluster: Cluster, deadline_passes: str
) -> None:
    stubs = cluster.stubs
    resp = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=GROUP, set={"scheduled.rebalance.max.delay.ms": "60000"}
        ),
        timeout=10,
    )
    assert resp.error_code == 0
    catalogue(stubs)
    workers = {w: ScriptedWorker(stubs, GROUP, w) for w in ("W1", "W2", "W3")}
    w1, w2, w3 = workers["W1"], workers["W2"], workers["W3"]
    for w in workers.values():
        w.join()
    targets = {"W1": parse("A", "A-0"), "W2": parse("B", "B-0"), "W3": parse("A-1")}
    assert w1.heartbeat().error_code == COMPUTE
    assert w1.install(w1.prepare().group_epoch, targets).error_code == 0
    group = drive_to_stable(stubs, [w1, w2, w3])
    e = group.group_epoch

    # W2 goes silent; its session expires; the assignor holds its resources back with a delay.
    keep_alive_until([w1, w3], lambda: describe(stubs, GROUP).group_epoch == e + 1)
    assert w1.heartbeat().error_code == COMPUTE
    delay_ms = 8_000 if deadline_passes == "after_the_restart" else 1_000
    installed = w1.install(
        w1.prepare().group_epoch, {"W1": targets["W1"], "W3": targets["W3"]}, delay_ms=delay_ms
    )
    assert installed.error_code == 0
    for w in (w1, w3):
        assert w.heartbeat().error_code == 0
    before = snapshot(cluster)
    scheduled_at = before[0].scheduled_rebalance_at_ms
    assert before[0].HasField("scheduled_rebalance_at_ms")
    assert before[0].group_epoch == before[0].assignment_epoch == e + 1
    events_before = cluster.observer.list_events(GROUP)

    cluster.kill()
    if deadline_passes == "while_down":
        time.sleep(max(0.0, scheduled_at / 1000 - time.time()) + 0.2)
    cluster.restart([w1, w3])

    if deadline_passes == "after_the_restart":
        group = assert_state_intact(cluster, before)
        assert time.time() * 1000 < scheduled_at, "the restart took longer than the delay"
        fired = keep_alive_until(
            [w1, w3], lambda: (g := describe(cluster.stubs, GROUP)).group_epoch == e + 2 and g
        )
        assert fired.coordinator_time_ms >= scheduled_at
    else:
        # Overdue at the takeover: it fires at once. Everything else is as it was.
        fired = keep_alive_until(
            [w1, w3],
            lambda: (g := describe(cluster.stubs, GROUP)).group_epoch == e + 2 and g,
            timeout_s=5,
        )
        dump_after, dump_before = store_dump.dump(cluster.observer), before[1]
        for table in ("members", "connectors", "target_assignment_members", "group_configs"):
            assert dump_after[table] == dump_before[table], table
    assert not fired.HasField("scheduled_rebalance_at_ms")
    assert members_view(fired) == members_view(before[0])
    events_after = cluster.observer.list_events(GROUP)
    assert events_after[: len(events_before)] == events_before
    new_types = [ev["event_type"] for ev in events_after[len(events_before) :]]
    assert new_types[:2] == ["SCHEDULED_REBALANCE_FIRED", "GROUP_EPOCH_BUMPED"], new_types
    fired_event = events_after[len(events_before)]
    assert fired_event["payload"]["scheduled_at_ms"] == scheduled_at
    assert fired_event["at_ms"] >= scheduled_at

    # The assignor member now places W2's lost resources on the remaining workers.
    group = drive_to_stable(cluster.stubs, [w1, w3])
    assert group.group_epoch == group.assignment_epoch == e + 2
    assert_every_resource_assigned_once(group, [w1, w3])


# --- fencing tokens across a crash (DESIGN 3.18) ----------------------------------------------


def token_map(message: Any) -> dict[str, int]:
    """A repeated FencingToken field (an assignment's or a described member's) by name."""
    return {
        (f"{t.connector}-{t.task}" if t.HasField("task") else t.connector): t.token
        for t in message.fencing_tokens
    }


def test_fencing_tokens_survive_a_crash_and_keep_increasing_after_it(cluster: Cluster) -> None:
    stubs = cluster.stubs
    w1 = w1_stable_with_everything(stubs)
    first = token_map(w1.last.assignment) if w1.last.HasField("assignment") else {}
    described = {m.member_id: token_map(m) for m in describe(stubs, GROUP).members}
    assert set(described["W1"]) == set(names(EVERYTHING))
    assert not first or first == described["W1"]

    cluster.crash_and_restart([w1])

    after = {m.member_id: token_map(m) for m in describe(cluster.stubs, GROUP).members}
    assert after == described, "tokens are loaded as they were committed"
    w2 = ScriptedWorker(cluster.stubs, GROUP, "W2")
    assert w2.join().error_code == 0
    assert w1.heartbeat().error_code == COMPUTE
    prepared = w1.prepare()
    split = {"W1": parse("A", "A-0", "A-1"), "W2": parse("B", "B-0")}
    assert w1.install(prepared.group_epoch, split).error_code == 0
    w1.heartbeat()  # told to revoke B, B-0
    w1.owned = split["W1"]
    w1.heartbeat()  # acknowledged
    response = w2.heartbeat()
    assert response.HasField("assignment"), response
    granted = token_map(response.assignment)

    assert set(granted) == {"B", "B-0"}
    highest_before = max(described["W1"].values())
    assert all(token > highest_before for token in granted.values()), (granted, described)
    kept = {m.member_id: token_map(m) for m in describe(cluster.stubs, GROUP).members}["W1"]
    assert kept == {r: t for r, t in described["W1"].items() if r in {"A", "A-0", "A-1"}}
