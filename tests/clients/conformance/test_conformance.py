"""The conformance suite (issue 31 item 3): each scenario written once, run against every client
(`client_kind`: python, node, go; CONFORMANCE_CLIENTS picks some) through `drivers.Client`, on a
real coordinator (`coordinator-svc serve`, PostgreSQL; session 3000 ms, heartbeat 200 ms unless
a scenario sets its group's), every client running the same recording exec hook.

What each scenario would catch in a broken client is said in its docstring."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2

from tests.clients.conformance.conftest import MakeClient, Mtls
from tests.clients.conformance.drivers import Client, Resource, TlsFiles, overlaps
from tests.clients.conformance.support import (
    alive,
    alter_configs,
    as_resources,
    check_records,
    counts,
    describe,
    diagnostics,
    put,
    statuses,
    wait_for,
    wait_settled,
)
from tests.clients.workers import catalogue_resources, resources_of
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls_clients import TlsStubs

pytestmark = pytest.mark.timeout(120)

SESSION_S = 3.0  # the suite coordinator's session timeout
INTERVAL_S = 0.2  # and heartbeat interval
SLOW_STOP_S = 0.3  # a revoked hook this slow: an acknowledgement sent before it returned shows


def assert_clean(clients: list[Client], group: str) -> None:
    """No resource ran on two clients at once, and every client kept the hook contract."""
    assert overlaps(clients) == []
    for client in clients:
        check_records(client, group)


def after(client: Client, since: float, event: str | None = None) -> list[dict[str, Any]]:
    return [
        r
        for r in client.records()
        if r["t_start"] >= since and (event is None or r["event"] == event)
    ]


def union(records: list[dict[str, Any]]) -> set[Resource]:
    out: set[Resource] = set()
    for r in records:
        out |= resources_of(r)
    return out


# --- join and balance: a mixed group of every client ------------------------------------------


def test_mixed_group_joins_balances_and_hands_over(
    kinds: list[str], make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """One client of each kind joins in turn (3 connectors, 6 tasks): after each join the group
    settles with every resource on exactly one client, connectors and tasks each balanced
    within one; then each leaves in turn (SIGTERM) and the rest take its share over. Nothing
    ever runs twice. Catches a client that cannot share a group with the others (assignor
    versions, owned lists), or that runs what it was not given."""
    catalogue = {"A": 2, "B": 2, "C": 2}
    alter_configs(stubs, group, session_timeout_ms=6000, scheduled_rebalance_max_delay_ms=0)
    for name, tasks in catalogue.items():
        put(stubs, group, name, tasks)
    clients = [make_client(kind, f"{kind}-1") for kind in kinds]
    joined: list[Client] = []
    for client in clients:
        client.start()
        joined.append(client)
        shares = wait_settled(stubs, group, joined, f"{[c.name for c in joined]} to settle")
        shape = [counts(s) for s in shares.values()]
        assert max(c for c, _ in shape) - min(c for c, _ in shape) <= 1, shares
        assert max(t for _, t in shape) - min(t for _, t in shape) <= 1, shares
        assert all(shares.values()), shares  # everyone got something
    for client in clients[:-1]:
        assert client.terminate() == 0, client.log_text()
        joined.remove(client)
        wait_settled(stubs, group, joined, f"{[c.name for c in joined]} to take over")
    assert clients[-1].terminate() == 0
    assert_clean(clients, group)
    assert {i.resource for c in clients for i in c.intervals()} == catalogue_resources(catalogue)
    assert all(i.end != float("inf") for c in clients for i in c.intervals())


# --- revoke before assign ---------------------------------------------------------------------


def test_revoke_before_assign_nothing_on_two_workers(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """Three clients of the kind join one by one, then the first leaves; every revoked hook
    takes SLOW_STOP_S. No resource is ever on two clients: a new owner's `assigned` starts only
    after the old owner's `revoked` returned. Catches a client that acknowledges a revocation
    before its hook returned, or starts new work before the old has stopped."""
    alter_configs(stubs, group, scheduled_rebalance_max_delay_ms=0)
    put(stubs, group, "A", 3)
    put(stubs, group, "B", 3)
    w = [make_client(client_kind, f"w{i}", sleep_revoked_s=SLOW_STOP_S) for i in (1, 2, 3)]
    w[0].start()
    wait_settled(stubs, group, w[:1], "w1 alone")
    assert describe(stubs, group).assignor_member_id == "w1"  # alone, it computes
    w[1].start()
    wait_settled(stubs, group, w[:2], "w1 and w2")
    w[2].start()
    wait_settled(stubs, group, w, "three workers")
    assert w[0].terminate() == 0, w[0].log_text()
    wait_settled(stubs, group, w[1:], "w2 and w3 after w1 left")
    moved = [r for r in w[0].records() if r["event"] == "revoked"]
    assert len(moved) >= 2, w[0].records()  # gave work up at each join, and at its leave
    for client in w[1:]:
        assert client.terminate() == 0
    assert_clean(w, group)


# --- self-fencing -----------------------------------------------------------------------------


def test_cut_off_client_fences_itself_before_its_session_times_out(
    client_kind: str,
    make_client: MakeClient,
    stubs: Stubs,
    group: str,
    coordinator: CoordinatorProcess,
) -> None:
    """w2 reaches the coordinator through a TCP proxy that the test freezes (a partition: its
    calls hang). Without a single answer, w2 must stop its work itself before the coordinator
    expires its session and hands that work to w1 (delay 0: at once). Catches a client that
    does not fence itself (its share would run on both), or fences only when a call fails."""
    alter_configs(stubs, group, scheduled_rebalance_max_delay_ms=0)
    put(stubs, group, "A", 2)
    put(stubs, group, "B", 2)
    with TcpProxy(coordinator.address) as proxy:
        w1 = make_client(client_kind, "w1")
        w2 = make_client(client_kind, "w2", coordinator_address=proxy.address)
        w1.start()
        wait_settled(stubs, group, [w1], "w1 alone")
        w2.start(rpc_timeout_ms=1000)
        shares = wait_settled(stubs, group, [w1, w2], "w1 and w2")
        lost = shares["w2"]
        assert lost

        t_cut = time.time()
        proxy.cut("freeze")
        wait_settled(stubs, group, [w1], "w1 to take w2's share over", timeout_s=20)
        fences = after(w2, t_cut, "revoked")
        assert union(fences) == lost, fences
        assert all(r["t_end"] < t_cut + SESSION_S for r in fences), (t_cut, fences)
        assert w2.running() == set() and w2.alive()
        taken = after(w1, t_cut, "assigned")
        assert union(taken) == lost
        stopped_at = {x: r["t_end"] for r in fences for x in resources_of(r)}
        for r in taken:
            for x in resources_of(r):
                assert r["t_start"] > stopped_at[x], (x, r, stopped_at[x])

        proxy.restore()
        shares = wait_settled(stubs, group, [w1, w2], "w2 back after the cut", timeout_s=20)
        assert shares["w2"], "w2 rejoined but got nothing"
        for client in (w1, w2):
            assert client.terminate() == 0
    assert_clean([w1, w2], group)


# --- a lost answer ----------------------------------------------------------------------------


def test_lost_answer_is_repaired_by_the_next_heartbeat(
    client_kind: str,
    make_client: MakeClient,
    stubs: Stubs,
    group: str,
    coordinator: CoordinatorProcess,
) -> None:
    """w0 (direct, the member that computes) and w1 (through a proxy) share A. The proxy throws
    the coordinator's answers to w1 away while A's config changes (the answer carrying the
    raised lifecycle revision is lost, and so is the next); once answers flow again w1 learns
    of the change and reconfigures its share of A. Then the same while B is put: the answer
    granting w1 its share of B is lost (the coordinator says it told w1, w1 runs none of it),
    and a later heartbeat gets it again. w1 never loses its membership (nothing stops).
    Catches a client that takes a change as seen when it sent a request rather than when an
    answer came back, or that does not send its full state after a failed call."""
    put(stubs, group, "A", 2, {"topic": "a", "password": "first-0001"})
    with TcpProxy(coordinator.address) as proxy:
        w0 = make_client(client_kind, "w0")
        w1 = make_client(client_kind, "w1", coordinator_address=proxy.address)
        w0.start()
        wait_settled(stubs, group, [w0], "w0 alone")
        w1.start(rpc_timeout_ms=300)
        shares = wait_settled(stubs, group, [w0, w1], "w0 and w1")
        assert describe(stubs, group).assignor_member_id == "w0"
        assert shares["w1"], shares  # balance: one of A's tasks at least
        epoch = next(m.member_epoch for m in describe(stubs, group).members if m.member_id == "w1")

        def drop_while(change: Callable[[], None], lost: Callable[[], object]) -> float:
            """Drop w1's answers while `change` happens, until `lost` says the answer that
            mattered went, and for at least 0.5 s (the next heartbeat, after its 0.3 s
            deadline, is lost too); return when answers flow again."""
            t_drop = time.time()
            before = proxy.dropped_bytes
            proxy.cut("drop")
            change()
            wait_for("an answer to w1 dropped", lambda: proxy.dropped_bytes > before, timeout_s=3)
            wait_for("the answer that matters to be lost", lost, timeout_s=3)
            time.sleep(max(0.0, t_drop + 0.5 - time.time()))
            proxy.restore()
            return t_drop

        new_config = {"topic": "a", "password": "dropped-0002"}
        t_drop = drop_while(lambda: put(stubs, group, "A", 2, new_config), lambda: True)
        t_restore = time.time()
        repaired = wait_for(
            "w1 reconfigured after the drop",
            lambda: [
                r
                for r in after(w1, t_drop, "reconfigured")
                if r["configs"]["A"]["config"] == new_config
            ],
            timeout_s=10,
            diagnostics=w1.log_text,
        )
        assert resources_of(repaired[0]) == shares["w1"]
        assert repaired[0]["t_start"] - t_restore < 2.0, (repaired, t_restore)
        assert {r["member_epoch"] for r in repaired} == {epoch}
        assert after(w1, t_drop, "revoked") == after(w1, t_drop, "assigned") == []

        def told_w1() -> set[Resource]:
            (member,) = [m for m in describe(stubs, group).members if m.member_id == "w1"]
            return as_resources(member.current_assignment) - shares["w1"]

        t_drop = drop_while(
            lambda: put(stubs, group, "B", 1),
            lambda: told_w1() and not (w1.running() & told_w1()),
        )
        t_restore = time.time()
        gained = told_w1()
        assert gained and {x[0] for x in gained} == {"B"}, gained  # balance: B at least
        after_drop = wait_settled(stubs, group, [w0, w1], "w1 to run its share of B", 10)
        assert after_drop["w1"] == shares["w1"] | gained
        granted = after(w1, t_drop, "assigned")
        assert union(granted) == gained, granted
        assert granted[0]["t_start"] - t_restore < 2.0, (granted, t_restore)
        assert after(w1, t_drop, "revoked") == [], "w1 lost its membership"
        for client in (w1, w0):
            assert client.terminate() == 0
    assert_clean([w0, w1], group)


# --- fencing tokens ---------------------------------------------------------------------------


def test_fencing_tokens_rise_with_every_grant(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """A resource moves w1 -> w2 -> w1: each grant hands the hook a token strictly greater than
    any earlier one of that resource, and a `revoked` call carries the token the resource ran
    under. Catches a client that hands on a stale token, or none."""
    alter_configs(stubs, group, scheduled_rebalance_max_delay_ms=0)
    put(stubs, group, "A", 3)
    w1, w2 = make_client(client_kind, "w1"), make_client(client_kind, "w2")
    w1.start()
    wait_settled(stubs, group, [w1], "w1 alone")
    w2.start()
    shares = wait_settled(stubs, group, [w1, w2], "w1 and w2")
    assert shares["w2"]
    assert w2.terminate() == 0
    wait_settled(stubs, group, [w1], "w1 alone again")
    assert w1.terminate() == 0

    def token(record: dict[str, Any], resource: Resource) -> int:
        tokens = record["fencing_tokens"]
        if len(resource) == 1:
            return int(tokens["connectors"][resource[0]])
        (t,) = [t for t in tokens["tasks"] if (t["connector"], t["task"]) == resource]
        return int(t["token"])

    grants: dict[Resource, list[tuple[float, int]]] = {}
    for client in (w1, w2):
        held: dict[Resource, int] = {}
        for r in client.records():
            for x in resources_of(r):
                if r["event"] == "assigned":
                    held[x] = token(r, x)
                    grants.setdefault(x, []).append((r["t_start"], held[x]))
                elif r["event"] == "revoked":
                    assert token(r, x) == held.pop(x), (client, x, r)
    moved = {x for x, g in grants.items() if len(g) >= 3}
    assert moved == shares["w2"], grants
    for x, g in grants.items():
        sequence = [t for _, t in sorted(g)]
        assert all(a < b for a, b in itertools.pairwise(sequence)), (x, sequence)
    assert_clean([w1, w2], group)


# --- configs ----------------------------------------------------------------------------------


def test_config_change_reaches_exactly_the_holders(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """Every `assigned` call carries exactly the configs (values and digest) of its resources'
    connectors. A has 4 tasks, B none: of two clients one holds A, the other B and two of A's
    tasks. A change of A's config reaches both, each as one `reconfigured` call naming exactly
    the resources of A it runs (the B holder: two tasks, not A), with the new values; a change
    of B's reaches B's holder only. No value is ever in a client's log. Catches a client that
    misses a change, tells a non-holder, or names resources it does not run."""
    config = {name: {"topic": name.lower(), "password": f"{name}-first-1"} for name in "AB"}
    put(stubs, group, "A", 4, config["A"])
    put(stubs, group, "B", 0, config["B"])
    clients = [make_client(client_kind, "w1"), make_client(client_kind, "w2")]
    for client in clients:
        client.start()
    shares = wait_settled(stubs, group, clients, "w1 and w2")
    assert sorted(counts(s) for s in shares.values()) == [(1, 2), (1, 2)], shares
    digests: dict[str, str] = {}
    for client in clients:
        for r in client.records():
            if r["event"] != "assigned":
                continue
            named = {x[0] for x in resources_of(r)}
            assert set(r["configs"]) == named, r
            for name, held in r["configs"].items():
                assert held["config"] == config[name], r
                assert digests.setdefault(name, held["digest"]) == held["digest"]
            assert r["target_states"] == dict.fromkeys(named, "STARTED"), r

    def change(name: str, tasks: int, values: dict[str, str]) -> None:
        holders = {c for c in clients if any(x[0] == name for x in shares[c.member_id])}
        t_put = time.time()
        put(stubs, group, name, tasks, values)
        wait_for(
            f"{name}'s new config at its holders",
            lambda: all(after(c, t_put, "reconfigured") for c in holders),
            timeout_s=5,
            diagnostics=lambda: diagnostics(stubs, group, clients),
        )
        time.sleep(4 * INTERVAL_S)  # anyone else would have been told by now
        for client in clients:
            calls = after(client, t_put)
            if client not in holders:
                assert calls == [], (client, calls)
                continue
            (call,) = calls
            assert call["event"] == "reconfigured"
            assert resources_of(call) == {x for x in shares[client.member_id] if x[0] == name}
            assert set(call["configs"]) == {name}
            assert call["configs"][name]["config"] == values
            assert call["configs"][name]["digest"] != digests[name]
            assert call["target_states"] == {name: "STARTED"}
            assert call["t_start"] - t_put < 2 * INTERVAL_S + 1.0, (call, t_put)

    rotated = {name: {"topic": name.lower(), "password": f"{name}-rotated-2"} for name in "AB"}
    change("A", 4, rotated["A"])  # both hold something of A
    change("B", 0, rotated["B"])  # one holds B
    for client in clients:
        assert client.terminate() == 0
    # Values reach the hook only: a log line carries digests, never a value.
    secrets = [c["password"] for c in (*config.values(), *rotated.values())]
    for client in clients:
        log = client.log_text()
        assert not [v for v in secrets if v in log], (client, log[-2000:])
    assert_clean(clients, group)


# --- a failed start ---------------------------------------------------------------------------


def test_failed_start_is_reported_failed_and_restarted(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str, tmp_path: Path
) -> None:
    """The hook refuses to start (exit 1, a line on stderr): the coordinator shows A and A-0
    FAILED on w1, with the exit code and the hook's stderr in the trace; the start is made once
    (no retry by the client). Once the operator restarts them, w1's hook gets `assigned` with
    reason "restart" and they read RUNNING. Catches a client that reports RUNNING regardless,
    retries a failed start by itself, or does not restart on the coordinator's word. Then B
    fails to start with automatic restarts on: once the hook behaves, the coordinator's own
    restart brings it up."""
    alter_configs(stubs, group, restart_failed_max_attempts=0)  # no automatic restarts
    put(stubs, group, "A", 1, {"topic": "a"})
    fail_file = tmp_path / "fail-start"
    fail_file.write_text("the sink is not reachable\n")
    w1 = make_client(client_kind, "w1", fail_file=fail_file)
    w1.start()

    def all_in(state: str) -> dict[Resource, tuple[str, str, str]] | None:
        now = statuses(stubs, group)
        ok = set(now) == {("A",), ("A", 0)} and all(
            s == state and w == "w1" for s, w, _ in now.values()
        )
        return now if ok else None

    failed = wait_for("A and A-0 FAILED on w1", lambda: all_in("FAILED"), diagnostics=w1.log_text)
    for _, _, trace in failed.values():
        assert "exited with 1" in trace and "the sink is not reachable" in trace, trace
    time.sleep(5 * INTERVAL_S)  # a client that retried by itself would have by now
    assert all_in("FAILED")
    tries = [r for r in w1.records() if r["event"] == "start_failed"]
    assert sorted(x for r in tries for x in resources_of(r)) == [("A",), ("A", 0)], tries
    assert w1.running() == set()

    fail_file.unlink()
    t_restart = time.time()
    planned = stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(
            group_id=group, connector="A", include_tasks=True, only_failed=True
        ),
        timeout=10,
    )
    assert len(planned.restarts) == 2, planned
    running = wait_for(
        "A and A-0 RUNNING after the restart", lambda: all_in("RUNNING"), diagnostics=w1.log_text
    )
    assert all(trace == "" for _, _, trace in running.values())
    again = after(w1, t_restart)
    assert {r["event"] for r in again} == {"assigned"}, again  # a failed start ran nothing
    assert all(r.get("reason") == "restart" for r in again), again
    assert union(again) == {("A",), ("A", 0)}

    # The coordinator's automatic restarts (DESIGN 3.20): B fails to start, is restarted with no
    # operator once the hook behaves again, and runs.
    alter_configs(stubs, group, restart_failed_max_attempts=5, restart_failed_backoff_ms=300)
    fail_file.write_text("B's sink is not reachable\n")
    t_b = time.time()
    put(stubs, group, "B", 0)
    wait_for(
        "B FAILED on w1",
        lambda: statuses(stubs, group).get(("B",), ("",))[:2] == ("FAILED", "w1"),
        diagnostics=w1.log_text,
    )
    fail_file.unlink()
    wait_for(
        "B RUNNING after an automatic restart",
        lambda: statuses(stubs, group).get(("B",), ("",))[:2] == ("RUNNING", "w1"),
        diagnostics=w1.log_text,
    )
    b_calls = [(r["event"], r.get("reason")) for r in after(w1, t_b)]
    assert b_calls[0] == ("start_failed", None) and b_calls[-1] == ("assigned", "restart"), b_calls
    assert {e for e, _ in b_calls} == {"start_failed", "assigned"}, b_calls  # nothing else
    assert w1.terminate() == 0
    assert_clean([w1], group)


def test_hook_past_its_timeout_has_its_process_group_killed(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str, tmp_path: Path
) -> None:
    """An `assigned` hook that hangs (with a child of its own) past --hook-timeout-s: the client
    kills the hook's whole process group (the child too: the hook ran in a group of its own)
    and reports the start FAILED; restarted once the hook behaves, it runs. Catches a client
    that waits for a hook for ever, kills only the hook's own process, or runs the hook in its
    own process group."""
    alter_configs(stubs, group, restart_failed_max_attempts=0)
    put(stubs, group, "A", 0)
    hang = tmp_path / "hang"
    hang.write_text("hang\n")
    w1 = make_client(client_kind, "w1", hang_file=hang)
    w1.start(hook_timeout_s=1)

    def failed_on_w1() -> tuple[str, str, str] | None:
        status = statuses(stubs, group).get(("A",))
        return status if status is not None and status[:2] == ("FAILED", "w1") else None

    failed = wait_for(
        "A FAILED on w1 after the hook's timeout", failed_on_w1, diagnostics=w1.log_text
    )
    assert failed[2], "a FAILED status without a trace"
    pids = [int(pid) for pid in Path(f"{hang}.pids").read_text().split()]
    assert len(pids) == 2, pids  # one hook call: the start is made once
    wait_for("the hook and its child to be gone", lambda: not any(map(alive, pids)), 5)
    assert w1.alive() and w1.records() == []
    hang.unlink()
    stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=group, connector="A"), timeout=10
    )
    wait_for(
        "A RUNNING after the restart",
        lambda: statuses(stubs, group).get(("A",), ("",))[0] == "RUNNING",
        diagnostics=w1.log_text,
    )
    assert [(r["event"], r.get("reason")) for r in w1.records()] == [("assigned", "restart")]
    assert w1.terminate() == 0
    assert_clean([w1], group)


# --- restarts and target states -----------------------------------------------------------


def test_restart_in_place_and_target_states(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """RestartConnector of a running task: `revoked` then `assigned` of exactly that task, both
    with reason "restart", and RUNNING again. PauseConnector / ResumeConnector: a `paused` then
    a `resumed` call naming the connector and its task, with the target state, reported PAUSED
    then RUNNING. StopConnector: the task is revoked, a `stopped` call names the connector, which
    reads STOPPED; ResumeConnector brings the task back (`assigned`) and the connector
    (`resumed`). Catches a client that ignores restart counts or target states, or maps them to
    the wrong events."""
    put(stubs, group, "A", 1, {"topic": "a"})
    w1 = make_client(client_kind, "w1")
    w1.start()

    def all_in(
        state: str, names: set[Resource] | None = None
    ) -> dict[Resource, tuple[str, str, str]] | None:
        now = statuses(stubs, group)
        want = names if names is not None else {("A",), ("A", 0)}
        ok = set(now) == want and all(s == state and w == "w1" for s, w, _ in now.values())
        return now if ok else None

    def seen(since: float) -> list[tuple[str, str | None, list[Resource]]]:
        return [(r["event"], r.get("reason"), sorted(resources_of(r))) for r in after(w1, since)]

    wait_for("RUNNING", lambda: all_in("RUNNING"), diagnostics=w1.log_text)
    t = time.time()
    planned = stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=group, connector="A", task=0), timeout=10
    )
    assert [(p.connector, p.task) for p in planned.restarts] == [("A", 0)]
    wait_for("the restart", lambda: len(after(w1, t)) >= 2, diagnostics=w1.log_text)
    wait_for("RUNNING after the restart", lambda: all_in("RUNNING"), diagnostics=w1.log_text)
    assert seen(t) == [
        ("revoked", "restart", [("A", 0)]),
        ("assigned", "restart", [("A", 0)]),
    ], after(w1, t)

    t = time.time()
    stubs.admin.PauseConnector(
        admin_pb2.PauseConnectorRequest(group_id=group, connector="A"), timeout=10
    )
    wait_for("PAUSED", lambda: all_in("PAUSED"), diagnostics=w1.log_text)
    stubs.admin.ResumeConnector(
        admin_pb2.ResumeConnectorRequest(group_id=group, connector="A"), timeout=10
    )
    wait_for("RUNNING after the resume", lambda: all_in("RUNNING"), diagnostics=w1.log_text)
    paused, resumed = after(w1, t)
    assert seen(t) == [
        ("paused", None, [("A",), ("A", 0)]),
        ("resumed", None, [("A",), ("A", 0)]),
    ], after(w1, t)
    assert paused["target_states"] == {"A": "PAUSED"}
    assert resumed["target_states"] == {"A": "STARTED"}

    t = time.time()
    stopped = stubs.admin.StopConnector(
        admin_pb2.StopConnectorRequest(group_id=group, connector="A"), timeout=10
    )
    assert stopped.error_code == 0 and stopped.changed, stopped
    wait_for("A STOPPED, A-0 gone", lambda: all_in("STOPPED", {("A",)}), diagnostics=w1.log_text)
    wait_for("A-0 revoked", lambda: w1.running() == {("A",)}, diagnostics=w1.log_text)
    stubs.admin.ResumeConnector(
        admin_pb2.ResumeConnectorRequest(group_id=group, connector="A"), timeout=10
    )
    wait_for("RUNNING after stop+resume", lambda: all_in("RUNNING"), diagnostics=w1.log_text)
    got = seen(t)
    assert sorted(got[:2]) == [("revoked", None, [("A", 0)]), ("stopped", None, [("A",)])], got
    assert sorted(got[2:]) == [("assigned", None, [("A", 0)]), ("resumed", None, [("A",)])], got
    assert w1.terminate() == 0
    assert_clean([w1], group)


# --- plaintext ----------------------------------------------------------------------------------


def test_plaintext_to_a_remote_address_is_refused(
    client_kind: str, make_client: MakeClient
) -> None:
    """Without TLS a client talks to loopback addresses only (unless told otherwise): given a
    remote coordinator it exits at once, with a non-zero code, saying why, having run nothing."""
    w1 = make_client(client_kind, "w1", coordinator_address="10.255.255.1:9093")
    w1.start()
    assert w1.wait(30) != 0
    assert "not a loopback address" in w1.log_text(), w1.log_text()
    assert w1.records() == []


# --- mTLS -------------------------------------------------------------------------------------


def test_mtls_member_is_bound_to_its_certificates_principal(
    client_kind: str, make_client: MakeClient, mtls: Mtls, group: str
) -> None:
    """On a coordinator that requires client certificates and checks ACLs: a client whose
    certificate's principal may be a MEMBER of the group joins and runs its work; its member id
    is then bound to that principal (another principal, also a MEMBER, is refused using it);
    a client whose principal has no ACL gets GROUP_AUTHORIZATION_FAILED, runs nothing and exits
    3. Catches a client that does not present its certificate, or retries a refusal for ever."""
    name = f"worker-{client_kind}"
    cert, outsider_cert, alice_cert = (mtls.issue(n) for n in (name, f"out-{client_kind}", "alice"))
    mtls.allow_member(name, group)
    mtls.allow_member("alice", group)
    put(mtls.admin, group, "A", 2)
    address = mtls.coordinator.address
    w1 = make_client(client_kind, "w1", coordinator_address=address)
    w1.start(tls=TlsFiles(mtls.ca.cert_file, cert.cert, cert.key))
    wait_settled(mtls.admin, group, [w1], "w1 over mTLS")
    member = describe(mtls.admin, group).members[0]
    with TlsStubs(address, mtls.ca.cert_file, alice_cert) as alice:
        impostor = alice.coordinator.ConnectGroupHeartbeat(
            coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=group, member_id="w1", member_epoch=member.member_epoch
            ),
            timeout=5,
        )
    assert common_pb2.ErrorCode.Name(impostor.error_code) == "GROUP_AUTHORIZATION_FAILED"

    outsider = make_client(client_kind, "w-out", coordinator_address=address)
    outsider.start(tls=TlsFiles(mtls.ca.cert_file, outsider_cert.cert, outsider_cert.key))
    assert outsider.wait(20) == 3, outsider.log_text()
    assert outsider.records() == []
    assert "GROUP_AUTHORIZATION_FAILED" in outsider.log_text()
    assert [m.member_id for m in describe(mtls.admin, group).members] == ["w1"]
    assert w1.terminate() == 0
    assert describe(mtls.admin, group).members == []
    assert_clean([w1], group)


# --- static membership ------------------------------------------------------------------------


def test_static_member_restarted_gets_its_share_back_and_nothing_moves(
    client_kind: str, make_client: MakeClient, stubs: Stubs, group: str
) -> None:
    """Two static members (instance ids). w2 is stopped (SIGTERM: it leaves with epoch -2) and
    started again under the same instance id with a new member id, within the session
    timeout: it gets exactly its share back, the group epoch does not move, and w1 is never
    touched. Catches a client that leaves with -1 (its share would move to w1) or does not send
    its instance id."""
    alter_configs(stubs, group, session_timeout_ms=8000)
    put(stubs, group, "A", 4)
    w1, w2 = make_client(client_kind, "w1"), make_client(client_kind, "w2")
    w1.start(instance_id="pod-1")
    w2.start(instance_id="pod-2")
    before = wait_settled(stubs, group, [w1, w2], "both static members")
    epoch = describe(stubs, group).group_epoch
    t_stop = time.time()
    assert w2.terminate() == 0, w2.log_text()
    assert union(after(w2, t_stop, "revoked")) == before["w2"]
    # Its work is held for it: nobody is given it while it is away.
    assert sorted(m.member_id for m in describe(stubs, group).members) == ["w1", "w2"]
    w2.start(instance_id="pod-2", member_id="w2-b")
    shares = wait_settled(stubs, group, [w1, w2], "w2 back under pod-2")
    assert shares == {"w1": before["w1"], "w2-b": before["w2"]}
    assert describe(stubs, group).group_epoch == epoch
    assert after(w1, t_stop) == []
    assert union(after(w2, t_stop, "assigned")) == before["w2"]
    for client in (w1, w2):
        assert client.terminate() == 0
    # Both left with epoch -2: their instances are kept (their work held) until the session.
    assert {(m.instance_id, m.state) for m in describe(stubs, group).members} == {
        ("pod-1", "LEFT"),
        ("pod-2", "LEFT"),
    }
    assert_clean([w1, w2], group)


# --- leave on SIGTERM -------------------------------------------------------------------------


def test_sigterm_stops_everything_then_leaves_at_once(
    client_kind: str,
    make_client: MakeClient,
    stubs: Stubs,
    group: str,
    coordinator: CoordinatorProcess,
) -> None:
    """SIGTERM: the client stops everything through its hook, leaves (epoch -1: the coordinator
    drops it at once, not after its session) and exits 0; then the other takes its share over.
    A second signal is not needed. Catches a client that exits without stopping its work or
    without leaving."""
    alter_configs(stubs, group, scheduled_rebalance_max_delay_ms=0)
    put(stubs, group, "A", 2)
    put(stubs, group, "B", 2)
    w1, w2 = make_client(client_kind, "w1"), make_client(client_kind, "w2")
    w1.start()
    w2.start()
    shares = wait_settled(stubs, group, [w1, w2], "w1 and w2")
    t_term = time.time()
    w2.signal(signal.SIGTERM)
    assert w2.wait(20) == 0, w2.log_text()
    t_exit = time.time()
    assert "w2" not in {m.member_id for m in describe(stubs, group).members}
    assert t_exit - t_term < SESSION_S, "it took longer than a session to leave"
    last = after(w2, t_term)
    assert {r["event"] for r in last} == {"revoked"}, last
    assert union(last) == shares["w2"]
    assert all(r["t_end"] < t_exit for r in last)
    assert coordinator.log_path is not None
    log = coordinator.log_path.read_text(errors="replace")
    left = [line for line in log.splitlines() if '"member_left"' in line and '"w2"' in line]
    assert [line for line in left if group in line], "no member_left for w2"
    expired = [line for line in log.splitlines() if "member_session_expired" in line]
    assert not [line for line in expired if group in line and '"w2"' in line]
    wait_settled(stubs, group, [w1], "w1 to take w2's share over")
    assert w1.terminate() == 0
    assert_clean([w1, w2], group)


def test_sigterm_with_stops_longer_than_a_session_keeps_the_session_until_stopped(
    client_kind: str,
    make_client: MakeClient,
    stubs: Stubs,
    group: str,
    coordinator: CoordinatorProcess,
) -> None:
    """SIGTERM while stopping takes longer than a session timeout (its `revoked` hook sleeps
    SESSION_S + 1.5 s): the client goes on heartbeating as a member while its work stops, so
    its session never expires and nothing of its share runs elsewhere before it has stopped;
    then it leaves. Catches a client that goes silent while it stops (the coordinator would
    hand its share over while it still runs it)."""
    alter_configs(stubs, group, scheduled_rebalance_max_delay_ms=0)
    put(stubs, group, "A", 2)
    put(stubs, group, "B", 1)
    w1 = make_client(client_kind, "w1")
    w2 = make_client(client_kind, "w2", sleep_revoked_s=SESSION_S + 1.5)
    w1.start()
    w2.start()
    shares = wait_settled(stubs, group, [w1, w2], "w1 and w2")
    assert shares["w2"]
    t_term = time.time()
    w2.signal(signal.SIGTERM)
    assert w2.wait(60) == 0, w2.log_text()
    assert time.time() - t_term > SESSION_S  # the stop really outlasted a session
    last = after(w2, t_term)
    assert union(last) == shares["w2"]
    assert coordinator.log_path is not None
    log = coordinator.log_path.read_text(errors="replace")
    expired = [line for line in log.splitlines() if "member_session_expired" in line]
    assert not [line for line in expired if group in line and '"w2"' in line], expired
    left = [line for line in log.splitlines() if '"member_left"' in line and '"w2"' in line]
    assert [line for line in left if group in line], "no member_left for w2"
    wait_settled(stubs, group, [w1], "w1 to take w2's share over")
    assert w1.terminate() == 0
    assert_clean([w1, w2], group)
