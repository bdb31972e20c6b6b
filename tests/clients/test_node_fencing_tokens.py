"""The Node.js client (clients/node/worker.js) carries fencing tokens (DESIGN 3.18): its
`assignment`, `start` and `stop` lines (and so what it hands onStart/onStop) hold the token of
each resource, kept for resources a later assignment keeps and taken from each new assignment.

It runs against a scripted coordinator (tests/worker_agent_membership/fake_coordinator.py: real
gRPC, answers chosen here), so the test does not depend on the real coordinator's version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from connect_protocol.resources import EMPTY, ResourceSet
from connect_protocol.tokens import FencingTokens
from tests.clients.conftest import NodeClient
from tests.clients.workers import NodeWorker, wait_for
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs

FIRST = rs("A", "A-0")
SECOND = rs("A", "A-0", "B")
THIRD = rs("A", "B")
TOKENS = FencingTokens.granted(FIRST, 7).with_grant(rs("A-0"), 9).with_grant(rs("B"), 11)


@dataclass
class Script:
    """Epoch 1: A, A-0. Once it runs them, epoch 2 adds B (the answer carries tokens for every
    resource, as the coordinator does). Once it runs those, A-0 is revoked at epoch 2."""

    owned: ResourceSet = EMPTY
    step: int = 0

    def __call__(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)
        if req.member_epoch == 0:
            return answer(1, FIRST, TOKENS.restricted(FIRST))
        if req.owned is not None:
            self.owned = req.owned
        if self.step == 0 and self.owned == FIRST:
            self.step = 1
            return answer(2, SECOND, TOKENS.restricted(SECOND))
        if self.step == 1 and self.owned == SECOND:
            self.step = 2
            return answer(2, THIRD, TOKENS.restricted(THIRD))
        return answer(max(req.member_epoch, 1))


def test_node_client_logs_and_hands_on_the_fencing_tokens(
    node_client: NodeClient, tmp_path: Path
) -> None:
    with FakeCoordinator(Script()) as fake:
        worker = NodeWorker(node_client.node, fake.address, "g", "node-1", tmp_path).start()
        try:
            wait_for(
                "A-0 to be stopped",
                lambda: worker.events("stop"),
                diagnostics=worker.log_text,
            )
            assert worker.terminate() == 0, worker.log_text()
        finally:
            worker.kill()
    assignments = worker.events("assignment")
    assert assignments[0]["fencing_tokens"] == {
        "connectors": {"A": 7},
        "tasks": [{"connector": "A", "task": 0, "token": 9}],
    }
    assert assignments[-1]["fencing_tokens"] == {"connectors": {"A": 7, "B": 11}, "tasks": []}
    starts = worker.events("start")
    assert [s["fencing_tokens"] for s in starts] == [
        {"connectors": {"A": 7}, "tasks": [{"connector": "A", "task": 0, "token": 9}]},
        {"connectors": {"B": 11}, "tasks": []},
    ]
    revoked, leaving = worker.events("stop")
    assert revoked["reason"] == "revoked"
    assert revoked["fencing_tokens"] == {
        "connectors": {},
        "tasks": [{"connector": "A", "task": 0, "token": 9}],
    }
    assert leaving["reason"] == "leaving"
    assert leaving["fencing_tokens"] == {"connectors": {"A": 7, "B": 11}, "tasks": []}
