"""The Node.js client (clients/node, no Python code helps it) and Python worker agents in one group
on a real coordinator (`coordinator-svc serve` on PostgreSQL, scaled-down timeouts).

Intervals during which a resource may have run come from the Node client's start/stop lines and
from the Python agents' exec-hook records; no two may intersect. A mixed group joining, sharing
and handing over its work is a conformance scenario (tests/clients/conformance); what stays here
is the Node worker's own: rejoining after being fenced, UNSUPPORTED_ASSIGNOR, and a regression
test of the Python agent."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2

from tests.clients.conformance.support import as_resources, settled
from tests.clients.conftest import NodeClient
from tests.clients.workers import (
    Interval,
    NodeWorker,
    PythonAgent,
    Resource,
    Worker,
    overlaps,
    wait_for,
)
from tests.support.client import describe
from tests.support.coordinator import CoordinatorProcess, Stubs


def put_catalogue(stubs: Stubs, group: str, catalogue: dict[str, int]) -> None:
    for name, tasks in catalogue.items():
        resp = stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id=group, connector=name, task_count=tasks),
            timeout=10,
        )
        assert resp.error_code == 0, resp.error_message


def wait_settled(
    stubs: Stubs, group_id: str, workers: Sequence[Worker], what: str
) -> dict[str, set[Resource]]:
    def diagnostics() -> str:
        group = describe(stubs, group_id)
        lines = [f"group: {group.state} epoch {group.group_epoch}/{group.assignment_epoch}"]
        for m in group.members:
            lines.append(
                f"  {m.member_id} {m.state} e{m.member_epoch} current "
                f"{sorted(as_resources(m.current_assignment))} pending "
                f"{sorted(as_resources(m.pending_revocation))}"
            )
        lines += [f"  {w.member_id} runs {sorted(w.running())}" for w in workers]
        lines += [f"--- {w.log_path.name}\n{w.log_text()[-3000:]}" for w in workers]
        return "\n".join(lines)

    return wait_for(
        what, lambda: settled(stubs, group_id, workers), timeout_s=25, diagnostics=diagnostics
    )


def test_node_worker_rejoins_at_epoch_zero_after_being_fenced(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    put_catalogue(stubs, group, {"A": 2})
    node = NodeWorker(node_client.node, coordinator.address, group, "node-1", tmp_path).start()
    try:
        wait_settled(stubs, group, [node], "the Node worker to run everything")
        epoch = describe(stubs, group).members[0].member_epoch
        # Someone heartbeats as node-1 with a wrong epoch: the coordinator removes node-1.
        resp = stubs.coordinator.ConnectGroupHeartbeat(
            coordinator_pb2.ConnectGroupHeartbeatRequest(
                group_id=group, member_id="node-1", member_epoch=epoch + 7
            ),
            timeout=10,
        )
        assert common_pb2.ErrorCode.Name(resp.error_code) == "FENCED_MEMBER_EPOCH"
        # The worker learns it on its next heartbeat, stops everything, rejoins at epoch 0 and,
        # once the coordinator's hold on its old work (a session timeout) ends, runs it again.
        rejoin = wait_for("the Node worker to notice", lambda: node.events("rejoin"), 10)
        assert rejoin[0]["why"].split(":")[0] in ("FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID")
        wait_settled(stubs, group, [node], "the Node worker to run everything again")
        lines = node.lines()
        kinds = [line["event"] for line in lines]
        i = kinds.index("rejoin")
        stop = next(line for line in lines[i:] if line["event"] == "stop")
        assert stop["reason"] == "membership lost"
        assert kinds.index("joined", i) > lines.index(stop)  # stopped everything, then rejoined
        assert node.terminate() == 0
    finally:
        node.kill()
    assert overlaps([node]) == []


def test_node_worker_stops_and_exits_on_unsupported_assignor(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    eager_only = PythonAgent(coordinator.address, group, "py-eager", tmp_path)
    eager_only.start("--protocol", "eager")
    node = NodeWorker(node_client.node, coordinator.address, group, "node-1", tmp_path)
    try:
        wait_for("py-eager to join", lambda: describe(stubs, group).members, 15)
        node.start()
        assert node.proc is not None
        code = node.proc.wait(15)
        assert code == 3, node.log_text()
        fatal = node.events("fatal")
        assert fatal and fatal[0]["error_code"] == "UNSUPPORTED_ASSIGNOR", node.log_text()
        assert eager_only.terminate() == 0
    finally:
        node.kill()
        eager_only.kill()


def test_python_agent_keeps_its_first_membership_under_a_short_session_timeout(
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    """Regression test for a bug this module found: the agent's loop computed its next wake-up
    before sending a heartbeat and was not woken by the answer, so after its first heartbeat it
    slept the initial 3000 ms and, under a 3 s session timeout, fenced itself (fixed in
    worker_agent/runtime.py: the loop polls again at once after dispatching)."""
    put_catalogue(stubs, group, {"A": 1})  # the suite's defaults: session 3000, heartbeat 200
    agent = PythonAgent(coordinator.address, group, "py-1", tmp_path).start()
    try:
        wait_settled(stubs, group, [agent], "the agent to run everything")
        # One connector put (epoch 2) and one join (epoch 3): nothing else moved the group.
        assert "fencing itself" not in agent.log_text(), agent.log_text()
        assert describe(stubs, group).group_epoch == 3
        assert agent.terminate() == 0
    finally:
        agent.kill()


class _Recorded:
    def __init__(self, *intervals: Interval) -> None:
        self._intervals = list(intervals)

    def intervals(self) -> list[Interval]:
        return self._intervals


def test_the_overlap_check_finds_a_resource_that_ran_twice() -> None:
    a = _Recorded(Interval("node-1", ("A", 0), 1.0, 2.0), Interval("node-1", ("B",), 1.0, 9.0))
    b = _Recorded(Interval("py-1", ("A", 0), 2.0, 3.0), Interval("py-1", ("B",), 8.5, 10.0))
    assert overlaps([a, b]) == [(a.intervals()[1], b.intervals()[1])]
    assert overlaps([_Recorded(Interval("py-2", ("A", 0), 1.5, float("inf"))), a])
