"""The Node.js client (clients/node/worker.js) accepts a new member epoch without an assignment
(DESIGN 3.21: an install moves a member whose share it does not change, and the next answer
carries the new epoch with the assignment ABSENT): it keeps running what it runs, stops nothing,
and heartbeats at the new epoch from then on.

It runs against a scripted coordinator (tests/worker_agent_membership/fake_coordinator.py: real
gRPC, answers chosen here)."""

from __future__ import annotations

from pathlib import Path

from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from tests.clients.conftest import NodeClient
from tests.clients.workers import NodeWorker, wait_for
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs

SHARE = rs("A", "A-0")
MOVED_TO = 9


def script(req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
    """Join: epoch 2 with A, A-0. Once it reports running them: epoch 9, assignment ABSENT.
    Any epoch other than 0, 2 and 9 would be a bug: answered with a fencing error."""
    if req.member_epoch < 0:
        return HeartbeatResponse(member_epoch=req.member_epoch)
    if req.member_epoch == 0:
        return answer(2, SHARE)
    if req.member_epoch == 2 and req.owned == SHARE:
        return answer(MOVED_TO)
    return answer(req.member_epoch)


def test_node_client_takes_a_new_epoch_without_an_assignment_and_keeps_its_work(
    node_client: NodeClient, tmp_path: Path
) -> None:
    with FakeCoordinator(script) as fake:
        worker = NodeWorker(node_client.node, fake.address, "g", "node-1", tmp_path).start()
        try:
            wait_for(
                "two heartbeats at the new epoch",
                lambda: sum(s.request.member_epoch == MOVED_TO for s in fake.seen()) >= 2,
                diagnostics=worker.log_text,
            )
            stops_before_leaving = worker.events("stop")
            assert worker.terminate() == 0, worker.log_text()
        finally:
            worker.kill()
    epochs = [s.request.member_epoch for s in fake.seen()]
    assert set(epochs) <= {0, 2, MOVED_TO, -1}, epochs
    moved = [s.request for s in fake.seen() if s.request.member_epoch == MOVED_TO]
    assert all(r.owned is None or r.owned == SHARE for r in moved), moved
    assert stops_before_leaving == []
    assert [a["member_epoch"] for a in worker.events("assignment")] == [2]
    [started] = worker.events("start")
    assert started["member_epoch"] == 2
