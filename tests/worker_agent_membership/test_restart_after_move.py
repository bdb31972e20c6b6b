"""A restarted task that moves is started once by its new holder (issue 29, DESIGN 3.20 "a grant
records the count, so a move satisfies the request and a resend repeats nothing"), in both
protocols: real agents (in-process, recording listeners) on a real coordinator (in-process, real
gRPC on 127.0.0.1 and PostgreSQL).

The case that needs the agent's start gate (`lifecycle.StartGate`): the new holder already runs
something of the task's connector, so its configs are known and the task could start at once,
with the restart counts of an answer that predates the grant (which does not name the task).
Its persisted restart count (1, from the restart on the previous holder) then came with the next
answer, and the agent restarted the task right after its fresh start: `assigned`, then
`revoked` and `assigned` with reason restart."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator

import pytest
from connect.group.v1 import admin_pb2

from tests.support.agents import wait_for
from tests.support.classic_agents import ClassicFleet
from tests.support.coordinator import FAST_DEFAULTS, InProcessCoordinator

pytestmark = pytest.mark.timeout(60)

INTERVAL_MS = 100
DEFAULTS = dataclasses.replace(
    FAST_DEFAULTS,
    heartbeat_interval_ms=INTERVAL_MS,
    session_timeout_ms=2_000,
    scheduled_rebalance_max_delay_ms=0,
    classic_min_session_timeout_ms=100,
    classic_initial_rebalance_delay_ms=50,
)


@pytest.fixture
def fleet(database_url: str) -> Iterator[ClassicFleet]:
    with InProcessCoordinator(database_url, DEFAULTS) as coordinator:
        fleet = ClassicFleet(
            coordinator.address,
            f"moves-{uuid.uuid4().hex[:8]}",
            session_timeout_ms=2_000,
            heartbeat_interval_ms=INTERVAL_MS,
            rpc_timeout_s=0.5,
        )
        try:
            yield fleet
            fleet.assert_no_overlap()
        finally:
            fleet.close()


@pytest.mark.parametrize("group_protocol", ["connect", "classic"])
def test_a_restarted_task_moved_to_a_holder_of_its_connector_starts_once(
    fleet: ClassicFleet, group_protocol: str
) -> None:
    fleet.put_connector("A", 3, {"topic": "a"})
    w1 = fleet.start("W1", group_protocol=group_protocol)
    fleet.wait_quiet()
    w2 = fleet.start("W2", group_protocol=group_protocol)
    fleet.wait_quiet()
    assert {r for r in w1.running() if r.startswith("A")}, "W1 runs nothing of A"
    task = min(r for r in w2.running() if r.startswith("A-"))

    t_restart = time.monotonic()
    resp = fleet.stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(
            group_id=fleet.group, connector="A", task=int(task.removeprefix("A-"))
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp
    wait_for(
        "the restart on W2",
        lambda: [r for r in list(w2.records) if r.t_start >= t_restart and r.reason] or None,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )

    t_move = time.monotonic()
    fleet.leave(w2)  # W1 takes the task over: it holds A's config already
    fleet.wait_quiet()
    time.sleep(3 * INTERVAL_MS / 1000)  # more answers and fetches: none restarts it
    calls = [
        (r.event, r.reason) for r in list(w1.records) if r.t_start >= t_move and task in r.resources
    ]
    assert calls == [("assigned", "")], calls


@pytest.mark.parametrize("group_protocol", ["connect", "classic"])
def test_a_restart_interrupted_by_a_leave_does_not_start_again(
    fleet: ClassicFleet, group_protocol: str
) -> None:
    """The agent is told to leave while a restart's `revoked` runs: what it stopped is not
    started again on a membership being given up (the leave's stop releases it)."""
    fleet.put_connector("A", 1, {"topic": "a"})
    w1 = fleet.start("W1", group_protocol=group_protocol)
    fleet.wait_quiet()
    w1.slow_once["revoked"] = 1.0  # the restart's stop takes a second
    t_restart = time.monotonic()
    resp = fleet.stubs.admin.RestartConnector(
        admin_pb2.RestartConnectorRequest(group_id=fleet.group, connector="A", task=0),
        timeout=10,
    )
    assert resp.error_code == 0, resp
    time.sleep(0.5)  # the restart reaches W1 within two intervals; its stop takes a second
    w1.agent.stop()  # leave: the loop moves the machine to LEAVING while the stop runs
    wait_for("W1 left", lambda: w1.agent.left or None, timeout_s=15)
    calls = [
        (r.event, r.reason)
        for r in list(w1.records)
        if r.t_start >= t_restart and "A-0" in r.resources
    ]
    assert ("assigned", "restart") not in calls, calls
    assert calls[0] == ("revoked", "restart"), calls
