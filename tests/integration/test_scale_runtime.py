"""The coordinator's runtime at scale (issue 10), against real PostgreSQL and real gRPC on
127.0.0.1: group commit, requests whose caller gave up, lease renewal for tens of thousands of
groups in one statement, adoption of only the groups that need an owner, idle groups let go,
ListGroups in pages without loading groups, and a dead pooled connection retried."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
from connect.group.v1 import admin_pb2

from coordinator_svc.runtime import ownership as runtime_ownership
from coordinator_svc.store import Lease, SqlStore
from tests.support.client import ScriptedWorker, describe, put_connector
from tests.support.coordinator import InProcessCoordinator
from tests.support.pgcluster import libpq_url

GROUP = "scale-group"
COORDINATOR_NOT_AVAILABLE = 15


def wait_until(condition: Any, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def sql(database_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


@pytest.fixture
def coordinator(database_url: str) -> Iterator[InProcessCoordinator]:
    with InProcessCoordinator(database_url) as c:
        yield c


class CountingCommits:
    """Wraps a store's commit: how many transactions, and how many records each carried."""

    def __init__(self, store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[int] = []
        self.fail_next = False
        real = store.commit

        def commit(lease: Lease, records: Any) -> None:
            self.calls.append(len(records))
            if self.fail_next:
                self.fail_next = False
                from coordinator_svc.store import StoreUnavailable

                raise StoreUnavailable("injected: the database went away")
            real(lease, records)

        monkeypatch.setattr(store, "commit", commit)


def queued(c: InProcessCoordinator, group_id: str) -> int:
    owned = c.manager._groups.get(group_id)
    return 0 if owned is None else len(owned.queue)


def join_all_while_locked(c: InProcessCoordinator, workers: list[ScriptedWorker]) -> list[Any]:
    """Hold the group's lock while every worker sends its join, so that all of them queue;
    then let go: one thread runs them all."""
    owned = c.manager._groups[GROUP]
    answers: list[Any] = [None] * len(workers)

    def join(i: int) -> None:
        answers[i] = workers[i].join()

    threads = [threading.Thread(target=join, args=(i,)) for i in range(len(workers))]
    with owned.lock:
        for t in threads:
            t.start()
        wait_until(lambda: queued(c, GROUP) == len(workers), what="every join queued")
    for t in threads:
        t.join(timeout=10)
    return answers


def test_requests_queued_behind_a_group_are_committed_in_one_transaction(
    coordinator: InProcessCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    assert c.stubs is not None
    assert put_connector(c.stubs, GROUP, "A", 4).error_code == 0
    commits = CountingCommits(c.store, monkeypatch)
    workers = [ScriptedWorker(c.stubs, GROUP, f"w{i}") for i in range(12)]

    answers = join_all_while_locked(c, workers)

    assert [a.error_code in (0, 10001) for a in answers] == [True] * 12
    assert len(commits.calls) == 1, commits.calls  # twelve joins, one transaction
    assert sorted(m.member_id for m in describe(c.stubs, GROUP).members) == sorted(
        w.member_id for w in workers
    )
    epochs = {a.member_epoch for a in answers}
    assert len(epochs) == 1  # each answered at the assignment epoch the batch left


def test_a_failed_group_commit_answers_none_of_its_requests_as_done(
    coordinator: InProcessCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    assert c.stubs is not None
    assert put_connector(c.stubs, GROUP, "A", 4).error_code == 0
    commits = CountingCommits(c.store, monkeypatch)
    commits.fail_next = True
    workers = [ScriptedWorker(c.stubs, GROUP, f"w{i}") for i in range(5)]

    answers = join_all_while_locked(c, workers)

    assert [a.error_code for a in answers] == [COORDINATOR_NOT_AVAILABLE] * 5
    assert len(commits.calls) == 1
    assert list(describe(c.stubs, GROUP).members) == []  # reloaded: nobody joined
    assert all(w.join().error_code in (0, 10001) for w in workers)  # the retries succeed
    assert len(describe(c.stubs, GROUP).members) == 5


def test_a_request_whose_caller_gave_up_while_it_waited_is_not_run(
    coordinator: InProcessCoordinator,
) -> None:
    c = coordinator
    assert c.stubs is not None
    assert put_connector(c.stubs, GROUP, "A", 1).error_code == 0
    owned = c.manager._groups[GROUP]
    with owned.lock:
        with pytest.raises(grpc.RpcError) as raised:
            c.stubs.coordinator.ConnectGroupHeartbeat(_join_request("impatient"), timeout=0.3)
        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: queued(c, GROUP) == 0, what="the abandoned request withdrawn")
    # The group served on; the abandoned join never happened.
    patient = ScriptedWorker(c.stubs, GROUP, "patient")
    assert patient.join().error_code in (0, 10001)
    assert [m.member_id for m in describe(c.stubs, GROUP).members] == ["patient"]


def _join_request(member_id: str) -> Any:
    from connect.group.v1 import coordinator_pb2

    from tests.support.client import IC

    req = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id=member_id, member_epoch=0, rebalance_timeout_ms=5_000
    )
    req.client_assignors.assignors.append(IC)
    req.connectors_and_tasks.SetInParent()
    return req


def test_renewal_renews_forty_thousand_leases_in_one_statement(database_url: str) -> None:
    """Past ~32,000 groups an IN list of (group, token) pairs overflows PostgreSQL's 65,535
    parameters: the renewal failed and every lease lapsed."""
    store = SqlStore(database_url, "renewer-1", "127.0.0.1:1", lease_ms=60_000)
    try:
        store.migrate()
        count = 40_000
        sql(
            database_url,
            "INSERT INTO group_leases (group_id, owner_id, advertised_address, token, "
            "lease_until, acquired_at) SELECT 'bulk-' || i, 'renewer-1', '127.0.0.1:1', 1, "
            "clock_timestamp() + interval '1 minute', clock_timestamp() "
            "FROM generate_series(1, %s) AS i",
            count,
        )
        held = [Lease(f"bulk-{i}", "renewer-1", 1, time.monotonic()) for i in range(1, count + 1)]
        renewed = store.renew(held)
        assert len(renewed) == count
        stale = [Lease("bulk-1", "renewer-1", 2, time.monotonic())]  # another tenure's token
        assert store.renew(stale) == []
    finally:
        sql(database_url, "DELETE FROM group_leases WHERE group_id LIKE 'bulk-%%'")
        store.close()


def test_only_groups_with_timers_to_run_are_adopted(database_url: str) -> None:
    with InProcessCoordinator(database_url, node_id="first") as first:
        assert first.stubs is not None
        assert put_connector(first.stubs, "idle", "A", 1).error_code == 0
        assert put_connector(first.stubs, "busy", "A", 1).error_code == 0
        assert ScriptedWorker(first.stubs, "busy", "w1").join().error_code in (0, 10001)
    # The first process released its leases on stop; a second one adopts what needs timers.
    with InProcessCoordinator(database_url, node_id="second") as second:
        wait_until(lambda: "busy" in second.manager.owned_group_ids(), what="busy adopted")
        time.sleep(0.2)
        assert "idle" not in second.manager.owned_group_ids()
        assert second.stubs is not None
        assert describe(second.stubs, "idle").error_code == 0  # taken on its first request
        assert "idle" in second.manager.owned_group_ids()


def test_an_idle_group_is_let_go_after_a_while(
    coordinator: InProcessCoordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    assert c.stubs is not None
    assert put_connector(c.stubs, "idle", "A", 1).error_code == 0
    assert put_connector(c.stubs, "busy", "A", 1).error_code == 0
    assert ScriptedWorker(c.stubs, "busy", "w1").join().error_code in (0, 10001)
    monkeypatch.setattr(runtime_ownership, "IDLE_RELEASE_S", 0.0)
    wait_until(lambda: "idle" not in c.manager.owned_group_ids(), what="idle released")
    assert "busy" in c.manager.owned_group_ids()
    holders = dict(sql(c.database_url, "SELECT group_id, lease_until > now() FROM group_leases"))
    assert holders["idle"] is False and holders["busy"] is True
    assert describe(c.stubs, "idle").error_code == 0  # served again on demand


def test_list_groups_pages_through_every_group_without_loading_them(
    coordinator: InProcessCoordinator, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = coordinator
    assert c.stubs is not None
    ids = [f"list-{i:02d}" for i in range(25)]
    for group_id in ids:
        assert put_connector(c.stubs, group_id, "A", 2).error_code == 0
    worker = ScriptedWorker(c.stubs, "list-03", "w1")
    assert worker.join().error_code == 10001  # ASSIGNING until a target is computed
    # A group another process owns is listed too.
    with InProcessCoordinator(database_url, node_id="other") as other:
        assert other.stubs is not None
        assert put_connector(other.stubs, "list-99", "A", 1).error_code == 0

        def no_loading(*_args: Any) -> None:
            raise AssertionError("ListGroups loaded a group")

        monkeypatch.setattr(c.store, "load_group", no_loading)
        listed: list[Any] = []
        token, pages = "", 0
        while True:
            resp = c.stubs.admin.ListGroups(
                admin_pb2.ListGroupsRequest(page_size=10, page_token=token), timeout=10
            )
            assert resp.error_code == 0, resp.error_message
            assert len(resp.groups) <= 10
            listed.extend(resp.groups)
            pages += 1
            token = resp.next_page_token
            if not token:
                break
    mine = [g for g in listed if g.group_id.startswith("list-")]
    assert [g.group_id for g in mine] == [*ids, "list-99"]
    assert pages >= 3
    states = {g.group_id: (g.state, g.member_count) for g in mine}
    assert states["list-03"] == ("ASSIGNING", 1)
    assert states["list-00"] == ("EMPTY", 0)
    bad = c.stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(page_size=-1), timeout=10)
    assert bad.error_code == 42  # INVALID_REQUEST


def test_list_groups_states_agree_with_describe(coordinator: InProcessCoordinator) -> None:
    c = coordinator
    stubs = c.stubs
    assert stubs is not None

    def agree() -> str:
        resp = stubs.admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10)
        listed = next(g.state for g in resp.groups if g.group_id == GROUP)
        assert listed == describe(stubs, GROUP).state
        return str(listed)

    assert put_connector(stubs, GROUP, "A", 3).error_code == 0
    assert agree() == "EMPTY"
    workers = [ScriptedWorker(stubs, GROUP, f"w{i}") for i in range(2)]
    for w in workers:
        w.join()
    assert agree() == "ASSIGNING"
    chosen = next(w for w in workers if w.heartbeat().error_code == 10001)
    prepared = chosen.prepare()
    targets = {
        "w0": (frozenset({"A"}), frozenset({("A", 0), ("A", 1)})),
        "w1": (frozenset(), frozenset({("A", 2)})),
    }
    assert chosen.install(prepared.group_epoch, targets).error_code == 0
    assert agree() == "RECONCILING"
    for _ in range(2):
        for w in workers:
            w.heartbeat()
    assert agree() == "STABLE"


def test_a_dead_pooled_connection_is_replaced_without_failing_the_request(
    coordinator: InProcessCoordinator, database_url: str
) -> None:
    c = coordinator
    assert c.stubs is not None
    assert put_connector(c.stubs, GROUP, "A", 1).error_code == 0
    # Every connection of the coordinator's pool dies (a database restart, a proxy's idle cut).
    sql(
        database_url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    assert ScriptedWorker(c.stubs, GROUP, "w1").join().error_code in (0, 10001)
    assert put_connector(c.stubs, GROUP, "B", 1).error_code == 0
