"""Seed 000's case studies, driven through the real gRPC API of a coordinator on PostgreSQL.

A test client plays the workers and the assignor member (installing the seed's targets). Read as
DESIGN "Where seed 000's case studies ... differ": epochs are compared relative to the group epoch
before the first join (E0); no member ever holds epoch 0; in "W2 joins" W2 reaches the new target
epoch holding nothing until W1 acknowledges; a removed worker rejoins at epoch 0 and gets its
resources back at once. Seed names map as AC0 -> A, AT1 -> A-0, AT2 -> A-1, BC0 -> B, BT1 -> B-0.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from connect.group.v1 import admin_pb2

from tests.support.client import ScriptedWorker, describe, names, parse, put_connector
from tests.support.coordinator import InProcessCoordinator

COMPUTE = 10001
GROUP = "connect-cluster"


@pytest.fixture
def coordinator(database_url: str) -> Iterator[InProcessCoordinator]:
    with InProcessCoordinator(database_url) as c:
        yield c


def members_view(group: Any) -> dict[str, tuple[int, str, list[str], list[str]]]:
    out = {}
    for m in group.members:
        current = names(
            (
                frozenset(m.current_assignment.connectors),
                frozenset((t.connector, t.task) for t in m.current_assignment.tasks),
            )
        )
        pending = names(
            (
                frozenset(m.pending_revocation.connectors),
                frozenset((t.connector, t.task) for t in m.pending_revocation.tasks),
            )
        )
        out[m.member_id] = (m.member_epoch, m.state, current, pending)
    return out


def target_view(group: Any) -> dict[str, list[str]]:
    return {
        m.member_id: names(
            (
                frozenset(m.target_assignment.connectors),
                frozenset((t.connector, t.task) for t in m.target_assignment.tasks),
            )
        )
        for m in group.members
    }


def catalogue(stubs: Any) -> int:
    assert put_connector(stubs, GROUP, "A", 2).error_code == 0
    assert put_connector(stubs, GROUP, "B", 1).error_code == 0
    return int(describe(stubs, GROUP).group_epoch)


def test_w1_joins_an_empty_group_then_w2_joins(coordinator: InProcessCoordinator) -> None:
    stubs = coordinator.stubs
    e0 = catalogue(stubs)
    group = describe(stubs, GROUP)
    assert (group.state, group.group_epoch, group.assignment_epoch) == ("EMPTY", e0, e0)

    # W1 joins: group epoch +1, target still at E0, W1 at the target epoch with nothing.
    w1 = ScriptedWorker(stubs, GROUP, "W1")
    resp = w1.join()
    assert resp.error_code == COMPUTE, "the only member is the assignor member"
    assert resp.member_epoch == e0
    assert list(resp.assignment.connectors_and_tasks.connectors) == []
    group = describe(stubs, GROUP)
    assert (group.state, group.group_epoch, group.assignment_epoch) == ("ASSIGNING", e0 + 1, e0)
    assert members_view(group) == {"W1": (e0, "STABLE", [], [])}

    # W1 computes: everything to W1, installed as target E0+1.
    prepared = w1.prepare()
    assert prepared.error_code == 0 and prepared.group_epoch == e0 + 1
    assert [c.name for c in prepared.catalogue] == ["A", "B"]
    everything = parse("A", "A-0", "A-1", "B", "B-0")
    assert w1.install(prepared.group_epoch, {"W1": everything}).error_code == 0
    group = describe(stubs, GROUP)
    assert group.assignment_epoch == e0 + 1
    assert target_view(group) == {"W1": names(everything)}
    assert members_view(group)["W1"] == (e0, "STABLE", [], [])

    # W1 heartbeats: nothing to revoke, so it moves to the target epoch with everything.
    resp = w1.heartbeat()
    assert resp.error_code == 0 and resp.member_epoch == e0 + 1
    assert names(w1.owned) == names(everything)
    group = describe(stubs, GROUP)
    assert group.state == "STABLE"
    assert members_view(group) == {"W1": (e0 + 1, "STABLE", names(everything), [])}

    # W2 joins: group epoch +1; W2 at the current assignment epoch with nothing.
    w2 = ScriptedWorker(stubs, GROUP, "W2")
    resp = w2.join()
    assert resp.error_code == 0 and resp.member_epoch == e0 + 1
    group = describe(stubs, GROUP)
    assert (group.group_epoch, group.assignment_epoch) == (e0 + 2, e0 + 1)
    # W1 (the assignor member) is asked to compute; the rest of its response is valid.
    resp = w1.heartbeat()
    assert resp.error_code == COMPUTE and resp.member_epoch == e0 + 1
    prepared = w1.prepare()
    assert prepared.group_epoch == e0 + 2
    assert sorted(m.member_id for m in prepared.members) == ["W1", "W2"]
    w1_target, w2_target = parse("A", "A-0", "A-1"), parse("B", "B-0")
    assert w1.install(e0 + 2, {"W1": w1_target, "W2": w2_target}).error_code == 0

    # W2 moves to the new target epoch at once, but holding nothing: W1 still owns B, B-0.
    resp = w2.heartbeat()
    assert resp.member_epoch == e0 + 2
    assert names(w2.owned) == []
    assert members_view(describe(stubs, GROUP))["W2"] == (e0 + 2, "UNRELEASED", [], [])

    # W1 is told to keep only the intersection and stays at its epoch until it acknowledges.
    resp = w1.heartbeat(report_owned=False)
    assert resp.member_epoch == e0 + 1
    assert names(w1.owned) == names(w1_target)
    assert members_view(describe(stubs, GROUP))["W1"] == (
        e0 + 1,
        "UNREVOKED",
        names(w1_target),
        names(w2_target),
    )
    # W1 acknowledges (its owned list no longer holds B, B-0): it moves to the target epoch.
    resp = w1.heartbeat()
    assert resp.member_epoch == e0 + 2
    # W2 heartbeats and now receives B and B-0.
    resp = w2.heartbeat()
    assert resp.member_epoch == e0 + 2 and names(w2.owned) == names(w2_target)
    group = describe(stubs, GROUP)
    assert group.state == "STABLE"
    assert members_view(group) == {
        "W1": (e0 + 2, "STABLE", names(w1_target), []),
        "W2": (e0 + 2, "STABLE", names(w2_target), []),
    }


def three_stable_workers(
    stubs: Any,
) -> tuple[int, dict[str, ScriptedWorker], dict[str, Any]]:
    """The seed's starting point: W1 [A, A-0], W2 [B, B-0], W3 [A-1], all at the target epoch."""
    catalogue(stubs)
    workers = {w: ScriptedWorker(stubs, GROUP, w) for w in ("W1", "W2", "W3")}
    for w in workers.values():
        w.join()
    targets = {"W1": parse("A", "A-0"), "W2": parse("B", "B-0"), "W3": parse("A-1")}
    assignor = workers["W1"]
    assert assignor.heartbeat().error_code == COMPUTE
    prepared = assignor.prepare()
    assert assignor.install(prepared.group_epoch, targets).error_code == 0
    settle(workers.values())
    group = describe(stubs, GROUP)
    assert group.state == "STABLE"
    return int(group.group_epoch), workers, targets


def settle(workers: Any, rounds: int = 4) -> None:
    for _ in range(rounds):
        for w in workers:
            w.heartbeat()


def keep_alive_until(workers: Any, condition: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for w in workers:
            w.heartbeat()
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def short_sessions(stubs: Any) -> None:
    resp = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(
            group_id=GROUP, set={"session.timeout.ms": "1000", "heartbeat.interval.ms": "100"}
        )
    )
    assert resp.error_code == 0


def test_worker_leaves_resources_deferred_then_placed_by_delayed_rebalance(
    coordinator: InProcessCoordinator,
) -> None:
    stubs = coordinator.stubs
    e, workers, targets = three_stable_workers(stubs)
    short_sessions(stubs)
    w1, w3 = workers["W1"], workers["W3"]
    # W2 stops heartbeating; the coordinator removes it after the session timeout, bumps epoch.
    group = keep_alive_until(
        [w1, w3], lambda: (g := describe(stubs, GROUP)).group_epoch == e + 1 and g
    )
    assert sorted(m.member_id for m in group.members) == ["W1", "W3"]
    assert group.assignment_epoch == e
    # The assignor defers W2's resources: same targets for W1 and W3, with a delay.
    assert w1.heartbeat().error_code == COMPUTE
    prepared = w1.prepare()
    assert prepared.group_epoch == e + 1
    assert (
        w1.install(e + 1, {"W1": targets["W1"], "W3": targets["W3"]}, delay_ms=800).error_code == 0
    )
    settle([w1, w3])
    group = describe(stubs, GROUP)
    assert group.HasField("scheduled_rebalance_at_ms")
    assert members_view(group) == {
        "W1": (e + 1, "STABLE", names(targets["W1"]), []),
        "W3": (e + 1, "STABLE", names(targets["W3"]), []),
    }
    # The coordinator fires the delayed rebalance itself: group epoch + 1.
    group = keep_alive_until(
        [w1, w3], lambda: (g := describe(stubs, GROUP)).group_epoch == e + 2 and g
    )
    assert not group.HasField("scheduled_rebalance_at_ms")
    assert w1.heartbeat().error_code == COMPUTE
    prepared = w1.prepare()
    final = {"W1": parse("A", "A-0", "B"), "W3": parse("B-0", "A-1")}
    assert w1.install(prepared.group_epoch, final).error_code == 0
    settle([w1, w3])
    group = describe(stubs, GROUP)
    assert group.state == "STABLE"
    assert members_view(group) == {
        "W1": (e + 2, "STABLE", names(final["W1"]), []),
        "W3": (e + 2, "STABLE", names(final["W3"]), []),
    }


def test_worker_bounces_and_gets_its_resources_back(coordinator: InProcessCoordinator) -> None:
    stubs = coordinator.stubs
    e, workers, targets = three_stable_workers(stubs)
    short_sessions(stubs)
    w1, w2, w3 = workers["W1"], workers["W2"], workers["W3"]
    keep_alive_until([w1, w3], lambda: describe(stubs, GROUP).group_epoch == e + 1)
    assert w1.heartbeat().error_code == COMPUTE
    assert (
        w1.install(
            w1.prepare().group_epoch, {"W1": targets["W1"], "W3": targets["W3"]}, delay_ms=60_000
        ).error_code
        == 0
    )
    settle([w1, w3])
    # W2 comes back before the delay ends. Its old epoch is fenced, so it rejoins at epoch 0.
    stale = w2.heartbeat()
    assert stale.error_code == 25, "W2 was removed: UNKNOWN_MEMBER_ID, rejoin at epoch 0"
    resp = w2.join()
    assert resp.error_code == 0
    group = describe(stubs, GROUP)
    assert group.group_epoch == e + 2
    # The assignor gives W2 exactly its own resources back (the original target).
    assert w1.heartbeat().error_code == COMPUTE
    assert w1.install(w1.prepare().group_epoch, targets).error_code == 0
    settle([w1, w2, w3])
    group = describe(stubs, GROUP)
    assert group.state == "STABLE"
    assert not group.HasField("scheduled_rebalance_at_ms"), "a no-delay install clears it"
    assert members_view(group) == {
        "W1": (e + 2, "STABLE", names(targets["W1"]), []),
        "W2": (e + 2, "STABLE", names(targets["W2"]), []),
        "W3": (e + 2, "STABLE", names(targets["W3"]), []),
    }
