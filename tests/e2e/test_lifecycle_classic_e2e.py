"""End to end, the connector lifecycle as classic agents see it (issue 28, DESIGN 3.20): real
classic agents (`ClassicAgent`, in-process, recording listeners that keep each event's configs)
on a real coordinator process on PostgreSQL, heartbeat 200 ms.

What it shows, as `test_lifecycle_e2e.py` does for connect agents: every `assigned` call carries
exactly the configs of its resources' connectors; a config change reaches exactly the holders of
the connector or its tasks (`reconfigured`, within two heartbeat intervals), nobody else's
listener is called; the configs an agent holds after a connector moved away omit it; a Heartbeat
answer a TCP proxy drops is repaired by the next one; a start that fails shows FAILED with its
output in DescribeGroups, then RUNNING once it is restarted (a failed start is made once)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, common_pb2

from tests.support.agents import HookRecord, wait_for
from tests.support.classic_agents import ClassicFleet, ClassicWorker, classic_coordinator
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

INTERVAL_MS = 200
SECRET = "classic-secret-0123456789"
ROTATED = "classic-rotated-9876543210"
DROPPED = "classic-dropped-5555555555"
CATALOGUE = {"A": 2, "B": 0, "C": 0, "D": 0}


def config_of(name: str, secret: str = SECRET) -> dict[str, str]:
    return {"topic": f"{name.lower()}-topic", "password": secret}


def connector_of(resource: str) -> str:
    head, _, tail = resource.rpartition("-")
    return head if head and tail.isdigit() else resource


def connectors(resources: set[str] | frozenset[str]) -> set[str]:
    return {connector_of(r) for r in resources}


def calls(worker: ClassicWorker, event: str | None = None, after: float = 0.0) -> list[HookRecord]:
    return [r for r in list(worker.records) if r.t_start >= after and event in (None, r.event)]


def status(fleet: ClassicFleet, resource: str) -> Any | None:
    resp = fleet.stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[fleet.group], include_status=True), timeout=10
    )
    for s in resp.groups[0].statuses:
        if (f"{s.connector}-{s.task}" if s.HasField("task") else s.connector) == resource:
            return s
    return None


@pytest.fixture
def fleet(postgres_admin_url: str, tmp_path: Path) -> Iterator[ClassicFleet]:
    with classic_coordinator(postgres_admin_url, tmp_path, 0) as coordinator:
        fleet = ClassicFleet(
            coordinator.address,
            f"lifecycle-{uuid.uuid4().hex[:8]}",
            session_timeout_ms=2_000,
            heartbeat_interval_ms=INTERVAL_MS,
            rpc_timeout_s=0.5,
        )
        try:
            yield fleet
            fleet.assert_no_overlap()
        finally:
            fleet.close()


def test_classic_configs_reach_exactly_their_holders_and_statuses_come_back(
    fleet: ClassicFleet,
) -> None:
    for name, tasks in CATALOGUE.items():
        fleet.put_connector(name, tasks, config_of(name))
    w1 = fleet.start("W1")
    fleet.wait_quiet()
    (first,) = calls(w1, "assigned")
    assert first.configs is not None and set(first.configs) == set(CATALOGUE)
    assert all(first.configs[n]["config"] == config_of(n) for n in CATALOGUE)
    digests = {n: first.configs[n]["digest"] for n in CATALOGUE}
    alone = w1.running()

    with TcpProxy(fleet.coordinator) as proxy:
        w2 = fleet.start("W2")
        w3 = fleet.start("W3", coordinator=proxy.address)
        fleet.wait_quiet(timeout_s=20)
        workers = (w1, w2, w3)
        for w in workers:
            for rec in calls(w, "assigned"):
                assert rec.configs is not None and set(rec.configs) == connectors(rec.resources)
                for name, held in rec.configs.items():
                    assert held == {"digest": digests[name], "config": config_of(name)}, rec
        shares = {w.label: w.running() for w in workers}
        lost = connectors(alone) - connectors(shares["W1"])
        assert lost, shares
        fetches = w1.agent.control.fetches

        # A config change reaches exactly the holders of the connector or its tasks.
        changed = sorted(connectors(shares["W1"]))[0]
        holders = {w for w in workers if changed in connectors(shares[w.label])}
        t_put = time.monotonic()
        fleet.put_connector(changed, CATALOGUE[changed], config_of(changed, ROTATED))
        wait_for(
            f"{changed}'s new config at its holders",
            lambda: all(calls(w, "reconfigured", t_put) for w in holders),
            timeout_s=5,
            diagnostics=fleet.diagnostics,
        )
        time.sleep(2 * INTERVAL_MS / 1000)  # anyone else would have been told by now
        for w in workers:
            made = calls(w, after=t_put)
            if w not in holders:
                assert not made, (w.label, made)
                continue
            (call,) = made
            assert call.event == "reconfigured"
            assert call.resources == {r for r in shares[w.label] if connector_of(r) == changed}
            assert call.configs is not None and set(call.configs) == {changed}
            assert call.configs[changed]["config"] == config_of(changed, ROTATED)
            assert call.t_start - t_put < 2 * INTERVAL_MS / 1000, (call, t_put)
        # W1's fetch after the change answered only what it holds: never what moved away.
        assert w1.agent.control.fetches > fetches
        assert w1.agent.control.cache.confirmed == connectors(shares["W1"])

        # A Heartbeat answer dropped on its way to W3 is repaired by the next Heartbeat.
        target = sorted(connectors(shares["W3"]))[0]
        before = proxy.dropped_bytes
        t_drop = time.monotonic()
        proxy.cut("drop")
        fleet.put_connector(target, CATALOGUE[target], config_of(target, DROPPED))
        wait_for("an answer to W3 dropped", lambda: proxy.dropped_bytes > before, timeout_s=3)
        # Restored at once, so that the lost answer's call fails fast and W3 finds the
        # coordinator again within a heartbeat interval (KAFKA-9184 would revoke after one).
        proxy.restore()
        wait_for(
            f"W3 reconfigured with {target}'s config after the drop",
            lambda: any(
                r.configs and r.configs[target]["config"] == config_of(target, DROPPED)
                for r in calls(w3, "reconfigured", t_drop)
            ),
            timeout_s=5,
            diagnostics=fleet.diagnostics,
        )

        # Statuses came back: every resource RUNNING on its holder.
        by_member = {w.member_id: w.running() for w in workers}
        held_by = {r: m for m, held in by_member.items() for r in held}

        def all_running() -> bool:
            resp = fleet.stubs.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[fleet.group], include_status=True),
                timeout=10,
            )
            view = {
                (f"{s.connector}-{s.task}" if s.HasField("task") else s.connector): s
                for s in resp.groups[0].statuses
            }
            return (
                all(s.state == common_pb2.RUNNING for s in view.values())
                and {r: s.worker_id for r, s in view.items()} == held_by
            )

        wait_for("every resource RUNNING on its holder", all_running, timeout_s=5)

        # A start that fails: FAILED with its output, then RUNNING once it is restarted (a
        # failed start is made once).
        for w in workers:
            w.fail_start["E"] = "the sink is not reachable"
        fleet.put_connector("E", 0, config_of("E"))
        failed = wait_for(
            "E FAILED",
            lambda: s if (s := status(fleet, "E")) and s.state == common_pb2.FAILED else None,
            timeout_s=10,
            diagnostics=fleet.diagnostics,
        )
        assert "cannot start E: the sink is not reachable" in failed.trace, failed.trace
        for w in workers:
            w.fail_start.clear()
        time.sleep(1.0)
        assert status(fleet, "E").state == common_pb2.FAILED  # a failed start is made once
        restarted = fleet.stubs.admin.RestartConnector(
            admin_pb2.RestartConnectorRequest(group_id=fleet.group, connector="E"), timeout=10
        )
        assert [p.worker_id for p in restarted.restarts] == [failed.worker_id], restarted
        running = wait_for(
            "E RUNNING",
            lambda: s if (s := status(fleet, "E")) and s.state == common_pb2.RUNNING else None,
            timeout_s=10,
            diagnostics=fleet.diagnostics,
        )
        assert running.worker_id == failed.worker_id
        fleet.wait_quiet(timeout_s=20)


def test_classic_agents_pause_resume_and_restart_in_place(fleet: ClassicFleet) -> None:
    """Issue 29 in the classic protocol: a pause raises the holders' revision (in Heartbeat
    answers), they call `paused` and report PAUSED, nothing moves and no rebalance starts; a
    restart of one task is exactly one `revoked` and one `assigned` of it, reason restart."""
    fleet.put_connector("A", 2, config_of("A"))
    w1, w2 = fleet.start("W1"), fleet.start("W2")
    fleet.wait_quiet()
    shares = {w.label: w.running() for w in (w1, w2)}
    generation = fleet.describe().group_epoch
    t_pause = time.monotonic()
    fleet.stubs.admin.PauseConnector(
        admin_pb2.PauseConnectorRequest(group_id=fleet.group, connector="A"), timeout=10
    )
    for r in ("A", "A-0", "A-1"):
        wait_for(
            f"{r} PAUSED",
            lambda r=r: (s := status(fleet, r)) is not None and s.state == common_pb2.PAUSED,
            timeout_s=10,
            diagnostics=fleet.diagnostics,
        )
    paused = {r for w in (w1, w2) for rec in calls(w, "paused", t_pause) for r in rec.resources}
    assert paused == {"A", "A-0", "A-1"}
    assert fleet.describe().group_epoch == generation  # no rebalance
    fleet.stubs.admin.ResumeConnector(
        admin_pb2.ResumeConnectorRequest(group_id=fleet.group, connector="A"), timeout=10
    )
    holder = next(w for w in (w1, w2) if "A-1" in w.running())
    t_restart = time.monotonic()
    planned = fleet.stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=fleet.group, connector="A", task=1),
        timeout=10,
    )
    assert [p.worker_id for p in planned.restarts] == [holder.member_id]
    wait_for(
        "the restart",
        lambda: len(calls(holder, "assigned", t_restart)) == 1,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )
    time.sleep(4 * INTERVAL_MS / 1000)
    after = [
        (rec.event, rec.reason, sorted(rec.resources))
        for w in (w1, w2)
        for rec in calls(w, None, t_restart)
        if rec.event in ("revoked", "assigned")
    ]
    assert after == [("revoked", "restart", ["A-1"]), ("assigned", "restart", ["A-1"])], after
    fleet.wait_quiet()
    assert {w.label: w.running() for w in (w1, w2)} == shares  # nothing moved
