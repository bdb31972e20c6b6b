"""Configuration errors of a join (DESIGN 3.19, "Migration policy" and "Feature flag"), as real
processes: the Python worker agent (both group protocols) and the Node.js client stop all their
work, say once what the operator should do, exit 3 and never join again.

- INCONSISTENT_GROUP_PROTOCOL (23) from the real coordinator (`coordinator-svc serve` on
  PostgreSQL): the group's `group.protocol.migration.policy` is `disabled`, so a connect-protocol
  worker joining a classic group with a member, and a classic one joining a connect group with a
  member, are refused.
- UNSUPPORTED_VERSION (35), which the real coordinator answers only once the `group.version`
  feature level can be lowered: from a scripted coordinator
  (tests/worker_agent_membership/fake_coordinator.py: real gRPC on 127.0.0.1, answers chosen
  here), to a rejoin after the worker lost its membership while running work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from connect.group.v1 import admin_pb2

from connect_protocol.configs import MIGRATION_POLICY
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from tests.clients.conftest import NodeClient
from tests.clients.workers import NodeWorker
from tests.support.agents import AgentProcess, wait_for
from tests.support.client import describe, put_connector
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs

CLASSIC = ("--group-protocol", "classic")
EXIT_LINE = "ERROR worker_agent the agent stopped all work and exits: "


def disable_migration(stubs: Stubs, group: str) -> None:
    resp = stubs.admin.AlterGroupConfigs(
        admin_pb2.AlterGroupConfigsRequest(group_id=group, set={MIGRATION_POLICY.name: "disabled"}),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message


def runs(agent: AgentProcess, resources: set[str]) -> bool:
    """Whether the agent's hook records end with `resources` running."""
    running: set[str] = set()
    for record in agent.records():
        if record.event == "assigned":
            running |= record.resources
        else:
            running -= record.resources
    return running == resources


def classic_agent(coordinator: CoordinatorProcess, group: str, workdir: Path) -> AgentProcess:
    """A classic-protocol agent (its member id is the coordinator's to make)."""
    return AgentProcess(
        "classic", coordinator.address, group, workdir, explicit_member_id=False, extra_args=CLASSIC
    )


def the_exit_line(agent: AgentProcess) -> str:
    lines = agent.current.log_lines(EXIT_LINE)
    assert len(lines) == 1, agent.log_tail()
    return lines[0]


@pytest.mark.timeout(90)
def test_connect_workers_refused_by_the_migration_policy_exit_saying_what_to_do(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    assert put_connector(stubs, group, "A", 1).error_code == 0
    disable_migration(stubs, group)
    classic = classic_agent(coordinator, group, tmp_path)
    node = NodeWorker(node_client.node, coordinator.address, group, "node-1", tmp_path)
    python = AgentProcess("py-connect", coordinator.address, group, tmp_path)
    try:
        classic.start()
        # The group takes its first joiner's type, classic (an empty group converts under any
        # policy); after the initial rebalance delay its one member runs everything.
        wait_for("the classic agent to run A", lambda: runs(classic, {"A", "A-0"}), 30)
        assert describe(stubs, group).group_type == "classic"

        node.start()
        python.start()
        assert node.proc is not None
        assert node.proc.wait(20) == 3, node.log_text()
        assert python.current.proc.wait(20) == 3, python.log_tail()

        [fatal] = node.events("fatal")
        assert fatal["error_code"] == "INCONSISTENT_GROUP_PROTOCOL"
        assert "'disabled'" in fatal["error_message"], fatal
        assert "group.protocol.migration.policy=upgrade" in fatal["fix"], fatal
        assert node.events("retry") == [] and node.events("joined") == [], node.log_text()
        assert node.events("stopped")[0]["fatal"].endswith(f"[configuration error: {fatal['fix']}]")

        line = the_exit_line(python)
        assert "INCONSISTENT_GROUP_PROTOCOL: group " in line and "'disabled'" in line, line
        assert line.endswith("or run this worker with --group-protocol classic]"), line
        assert python.records() == []  # it never ran anything
        assert "attempt" not in python.log_tail(200)  # refused once, never retried

        # The classic worker never noticed.
        g = describe(stubs, group)
        assert g.group_type == "classic" and len(g.members) == 1, g
        assert runs(classic, {"A", "A-0"})
        assert classic.stop() == 0
    finally:
        node.kill()
        python.close()
        classic.close()


@pytest.mark.timeout(90)
def test_a_classic_agent_refused_by_the_migration_policy_exits_saying_what_to_do(
    coordinator: CoordinatorProcess, stubs: Stubs, group: str, tmp_path: Path
) -> None:
    assert put_connector(stubs, group, "A", 1).error_code == 0
    disable_migration(stubs, group)
    connect = AgentProcess("py-connect", coordinator.address, group, tmp_path)
    classic = classic_agent(coordinator, group, tmp_path)
    try:
        connect.start()
        wait_for("the connect agent to run A", lambda: runs(connect, {"A", "A-0"}), 20)
        classic.start()
        assert classic.current.proc.wait(20) == 3, classic.log_tail()
        line = the_exit_line(classic)
        assert "JoinGroup: INCONSISTENT_GROUP_PROTOCOL: group " in line, line
        assert "admits no classic-protocol worker" in line, line
        assert "or run this worker with --group-protocol connect;" in line, line
        assert classic.records() == []
        g = describe(stubs, group)
        assert g.group_type == "connect" and [m.member_id for m in g.members] == ["py-connect"]
        assert connect.stop() == 0
    finally:
        classic.close()
        connect.close()


@dataclass
class Refuses35:
    """The join is answered at epoch 1 with A and A-0; once the worker runs them it is fenced
    (FENCED_MEMBER_EPOCH); its rejoin, and any later one, is answered UNSUPPORTED_VERSION."""

    fenced: bool = False

    def __call__(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)  # a leave (must not come)
        if req.member_epoch == 0 and not self.fenced:
            return answer(1, rs("A", "A-0"))
        if req.member_epoch == 0:
            return HeartbeatResponse(
                ErrorCode.UNSUPPORTED_VERSION,
                "group.version is at level 0: no new connect-protocol member is admitted",
            )
        if req.owned == rs("A", "A-0"):
            self.fenced = True
            return HeartbeatResponse(ErrorCode.FENCED_MEMBER_EPOCH, "fenced by the test")
        return answer(1)


def joins(fake: FakeCoordinator) -> int:
    return sum(1 for s in fake.seen() if s.request.member_epoch == 0)


@pytest.mark.timeout(60)
def test_the_node_client_refused_a_rejoin_for_the_feature_level_stops_and_exits(
    node_client: NodeClient, tmp_path: Path
) -> None:
    with FakeCoordinator(Refuses35()) as fake:
        node = NodeWorker(node_client.node, fake.address, "g", "node-1", tmp_path).start()
        try:
            assert node.proc is not None
            assert node.proc.wait(20) == 3, node.log_text()
        finally:
            node.kill()
        assert joins(fake) == 2, fake.seen()  # the join and the refused rejoin, never a third
        assert all(s.request.member_epoch >= 0 for s in fake.seen())  # no leave either
    kinds = [line["event"] for line in node.lines()]
    stop = node.events("stop")
    assert [s["reason"] for s in stop] == ["membership lost"]
    assert kinds.index("stop") < kinds.index("fatal")  # its work had stopped before the rejoin
    [fatal] = node.events("fatal")
    assert fatal["error_code"] == "UNSUPPORTED_VERSION"
    assert fatal["error_message"].startswith("group.version is at level 0"), fatal
    assert "--feature group.version --level 1" in fatal["fix"], fatal
    assert node.running() == set()


@pytest.mark.timeout(60)
def test_the_python_agent_refused_a_rejoin_for_the_feature_level_stops_and_exits(
    tmp_path: Path,
) -> None:
    with FakeCoordinator(Refuses35()) as fake:
        agent = AgentProcess("py-1", fake.address, "g", tmp_path)
        try:
            agent.start()
            assert agent.current.proc.wait(20) == 3, agent.log_tail()
        finally:
            agent.close()
        assert joins(fake) == 2, fake.seen()
        assert all(s.request.member_epoch >= 0 for s in fake.seen())
    events = [(r.event, r.resources) for r in agent.records()]
    assert events == [("assigned", {"A", "A-0"}), ("revoked", {"A", "A-0"})], events
    line = the_exit_line(agent)
    assert "exits: UNSUPPORTED_VERSION: group.version is at level 0" in line, line
    assert "run this worker with --group-protocol classic, or raise group.version to 1" in line
