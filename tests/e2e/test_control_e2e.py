"""End to end, target states and restarts (issue 29, DESIGN 3.20 "Target states", "Restarts",
"Automatic restarts"): a real coordinator (`coordinator-svc serve` on PostgreSQL, FAST_DEFAULTS:
heartbeat 200 ms) and real worker agents (`python -m worker_agent.cli run`, connect protocol)
with the recording exec hook, whose records are the intervals each resource ran in.

What it shows: stop leaves the connector assigned and reporting STOPPED with none of its tasks
running, and resume brings them back; pause and resume move nothing; `restart --include-tasks
--only-failed` of one failed task gives exactly one stop and one start of it and nothing else,
and neither a coordinator takeover nor the answers that follow repeat it; a task whose start
hook fails twice, then succeeds, is restarted by the coordinator twice after the configured
backoffs and reports RUNNING; with the attempts spent it stays FAILED; a crash loop (RUNNING,
then FAILED a second later, reported by the worker) is restarted at most
restart.failed.max.attempts times; a pending automatic restart is cancelled by a pause."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, common_pb2

from tests.e2e.test_lifecycle_e2e import status_port, statuses
from tests.support.agents import Fleet, HookRecord, wait_for
from tests.support.coordinator import CoordinatorProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

INTERVAL_S = 0.2  # FAST_DEFAULTS.heartbeat_interval_ms
BACKOFF_MS = 600


def admin(fleet: Fleet, rpc: str, **fields: Any) -> Any:
    request = getattr(admin_pb2, f"{rpc}Request")(group_id=fleet.group, **fields)
    resp = getattr(fleet.stubs.admin, rpc)(request, timeout=10)
    assert resp.error_code == 0, resp
    return resp


def records(fleet: Fleet, event: str, resource: str, after: float = 0.0) -> list[HookRecord]:
    return [
        r
        for m in fleet.agents
        for r in fleet.records(m, after)
        if r.event == event and resource in r.resources
    ]


def state_of(fleet: Fleet, resource: str) -> Any:
    return statuses(fleet).get(resource)


def wait_state(fleet: Fleet, resource: str, state: int, timeout_s: float = 10.0) -> Any:
    name = common_pb2.ResourceState.Name(state)
    return wait_for(
        f"{resource} {name}",
        lambda: s if (s := state_of(fleet, resource)) is not None and s.state == state else None,
        timeout_s=timeout_s,
        diagnostics=fleet.diagnostics,
    )


def post_status(port: int, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/status",
        data=json.dumps(body).encode(),
        headers={"X-Worker-Agent": "status", "Host": f"127.0.0.1:{port}"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return int(resp.status)


def test_stop_pause_resume_and_restart_only_failed(
    fleet: Fleet, coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    fleet.put_connector("A", 3, {"topic": "a"})
    fleet.put_connector("B", 1, {"topic": "b"})
    fleet.agent("W1", extra_args=("--status-port", "0"))
    fleet.agent("W2", extra_args=("--status-port", "0"))
    fleet.start("W1", "W2")
    quiet = fleet.wait_quiet()
    holder = {r: m for m, held in quiet.assigned.items() for r in held}

    # Pause and resume: nothing moves, the holders are told, statuses follow.
    t_pause = time.time()
    assert not admin(fleet, "PauseConnector", connector="A").rebalance_triggered
    for r in ("A", "A-0", "A-1", "A-2"):
        wait_state(fleet, r, common_pb2.PAUSED)
    paused = {
        r
        for m in fleet.agents
        for p in fleet.records(m, t_pause)
        if p.event == "paused"
        for r in p.resources
    }
    assert paused == {"A", "A-0", "A-1", "A-2"}
    admin(fleet, "ResumeConnector", connector="A")
    wait_state(fleet, "A-1", common_pb2.RUNNING)
    assert fleet.wait_quiet().assigned == quiet.assigned  # nothing moved

    # Stop: the connector stays assigned, reporting STOPPED; no task of it runs.
    admin(fleet, "StopConnector", connector="A")
    stopped = fleet.wait_quiet()
    wait_state(fleet, "A", common_pb2.STOPPED)
    running = {r for held in fleet.running().values() for r in held}
    assert "A" in running and not {"A-0", "A-1", "A-2"} & running
    assert holder["A"] in {m for m, held in stopped.assigned.items() if "A" in held}
    assert {s for s in statuses(fleet) if s.startswith("A-")} == set()  # Connect: no tasks
    admin(fleet, "ResumeConnector", connector="A")
    back = fleet.wait_quiet()
    assert {"A-0", "A-1", "A-2"} <= {r for held in back.assigned.values() for r in held}
    for r in ("A", "A-0", "A-1", "A-2"):
        wait_state(fleet, r, common_pb2.RUNNING)

    # One task fails (the worker says so); restart --only-failed restarts it and nothing else.
    task = "A-1"
    owner = next(m for m, held in back.assigned.items() if task in held)
    port = status_port(fleet, owner)
    assert post_status(port, {"connector": "A", "task": 1, "state": "FAILED", "trace": "x"}) == 202
    wait_state(fleet, task, common_pb2.FAILED)
    t_restart = time.time()
    planned = admin(fleet, "RestartConnector", connector="A", include_tasks=True, only_failed=True)
    assert [(p.connector, p.task, p.worker_id) for p in planned.restarts] == [("A", 1, owner)]
    wait_state(fleet, task, common_pb2.RUNNING)
    time.sleep(6 * INTERVAL_S)  # answers keep coming: none repeats the restart
    after = [
        (r.event, r.reason, sorted(r.resources))
        for m in fleet.agents
        for r in fleet.records(m, t_restart)
    ]
    assert after == [("revoked", "restart", [task]), ("assigned", "restart", [task])], after
    assert fleet.wait_quiet().assigned == back.assigned

    # A coordinator takeover: the count survives and nothing is restarted again.
    coordinator.kill()
    coordinator.start()
    time.sleep(10 * INTERVAL_S)
    fleet.wait_quiet(timeout_s=30)
    assert state_of(fleet, task).restart_count == 1
    restarts = [r for m in fleet.agents for r in fleet.records(m, t_restart) if r.reason]
    assert len(restarts) == 2, restarts


def test_automatic_restarts_follow_the_backoff_then_stop_and_reset(
    fleet: Fleet, tmp_path: Path
) -> None:
    fleet.alter_configs({"restart.failed.backoff.ms": BACKOFF_MS, "restart.failed.max.attempts": 2})
    fail_file = tmp_path / "fail"
    fail_file.write_text("F\nthe sink is not reachable\n2\n")  # fails twice, then starts
    fleet.put_connector("F", 0, {"topic": "f"})
    fleet.agent("W1", fail_file=fail_file, extra_args=("--status-port", "0"))
    fleet.start("W1")
    running = wait_state(fleet, "F", common_pb2.RUNNING, timeout_s=20)
    assert running.restart_count == 2
    failed = records(fleet, "start_failed", "F")
    starts = records(fleet, "assigned", "F")
    assert len(failed) == 2 and len(starts) == 1, (failed, starts)
    assert starts[0].reason == "restart"
    # The coordinator waited the backoff after each FAILED report, doubling: the next attempt
    # began at least BACKOFF (then 2 x BACKOFF) after the failed one ended.
    waits = [b.t_start - a.t_end for a, b in zip(failed, [*failed[1:], starts[0]], strict=True)]
    assert waits[0] >= BACKOFF_MS / 1000 and waits[1] >= 2 * BACKOFF_MS / 1000, waits

    # It fails again before RUNNING lasted the backoff: the attempts are not reset, they are
    # spent, and it stays FAILED.
    port = status_port(fleet, "W1")
    assert post_status(port, {"connector": "F", "state": "FAILED", "trace": "down"}) == 202
    spent = wait_for(
        "attempts spent",
        lambda: s if (s := state_of(fleet, "F")).auto_restarts_exhausted else None,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )
    assert (spent.state, spent.restart_count, spent.auto_restart_attempts) == (
        common_pb2.FAILED,
        2,
        2,
    )
    time.sleep(4 * BACKOFF_MS / 1000)
    assert state_of(fleet, "F").restart_count == 2  # it stays FAILED

    # Restarted by hand, it runs; once RUNNING has lasted the backoff, the attempts reset: the
    # next failure is restarted automatically again (attempt 1, after one backoff).
    admin(fleet, "RestartConnector", connector="F")
    wait_state(fleet, "F", common_pb2.RUNNING)
    time.sleep(BACKOFF_MS / 1000 + 0.2)
    assert post_status(port, {"connector": "F", "state": "FAILED", "trace": "again"}) == 202
    wait_for(
        "an automatic restart after the reset",
        lambda: s if (s := state_of(fleet, "F")).restart_count == 4 else None,
        timeout_s=10,
        diagnostics=fleet.diagnostics,
    )
    again = wait_state(fleet, "F", common_pb2.RUNNING)
    assert again.auto_restart_attempts == 1


def test_a_crash_loop_is_restarted_at_most_max_attempts_and_a_pause_cancels(
    fleet: Fleet,
) -> None:
    # RUNNING for well under the backoff each time (the report reaches the coordinator within
    # a heartbeat interval of the POST): the attempts never reset.
    fleet.alter_configs({"restart.failed.backoff.ms": 1_500, "restart.failed.max.attempts": 2})
    fleet.put_connector("L", 1, {"topic": "l"})
    fleet.agent("W1", extra_args=("--status-port", "0"))
    fleet.start("W1")
    fleet.wait_quiet()
    port = status_port(fleet, "W1")
    for attempt in range(3):  # RUNNING, then FAILED about a second later, three times over
        wait_state(fleet, "L-0", common_pb2.RUNNING, timeout_s=10)
        time.sleep(0.8)
        assert post_status(port, {"connector": "L", "task": 0, "state": "FAILED"}) == 202
        failed = wait_state(fleet, "L-0", common_pb2.FAILED)
        assert failed.auto_restarts_exhausted == (attempt == 2), failed
    time.sleep(1.8)  # more than the backoff it would have waited: nothing more
    assert len(records(fleet, "assigned", "L-0")) == 3  # the first start and two restarts
    assert state_of(fleet, "L-0").restart_count == 2

    # A manual restart; then a failure whose automatic restart a pause cancels.
    fleet.alter_configs({"restart.failed.max.attempts": 5})
    admin(fleet, "RestartConnector", connector="L", task=0)
    wait_state(fleet, "L-0", common_pb2.RUNNING)
    assert post_status(port, {"connector": "L", "task": 0, "state": "FAILED"}) == 202
    pending = wait_for(
        "an automatic restart pending",
        lambda: s if (s := state_of(fleet, "L-0")).HasField("next_restart_at_ms") else None,
        timeout_s=5,
    )
    admin(fleet, "PauseConnector", connector="L")
    assert not state_of(fleet, "L-0").HasField("next_restart_at_ms")
    time.sleep(2.0)  # past the time it was due
    assert state_of(fleet, "L-0").restart_count == pending.restart_count  # cancelled
