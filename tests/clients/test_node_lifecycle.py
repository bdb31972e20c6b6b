"""The Node.js client (clients/node/worker.js) as a library, against a real coordinator
(`coordinator-svc serve` on PostgreSQL), where the conformance suite (tests/clients/conformance,
which runs the worker with its exec hook) does not reach: DESIGN 3.20 "a grant records the
count, so a move satisfies the request": a task restarted on one Node worker and moved to
another that already runs its connector is started there once and never restarted.

What the conformance suite covers for every client, and so no longer here: configs fetched and
handed to the work, digests only in logs, a failed start FAILED then restarted, restarts in
place, pause, resume and stop.

The worker is `node_lifecycle_worker.js` (worker.js as a library): onStart throws while a file
exists, and what the callbacks receive goes to a file of its own, never to the log."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from connect.group.v1 import admin_pb2, common_pb2

from tests.clients.conftest import NodeClient
from tests.clients.workers import NodeWorker, wait_for
from tests.support.coordinator import CoordinatorProcess, Stubs

WRAPPER = Path(__file__).with_name("node_lifecycle_worker.js")
FIRST_SECRET = "pw-first-7f3a9c"
MEMBER = "node-lifecycle"


class LifecycleWorker(NodeWorker):
    """node_lifecycle_worker.js: the library with a failing-while-told onStart."""

    def __init__(
        self, node: str, coordinator: str, group: str, directory: Path, member_id: str = MEMBER
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(node, coordinator, group, member_id, directory)
        self.fail_file = directory / "fail-start"
        self.received_file = directory / "received.jsonl"

    def start(self, *extra: str) -> LifecycleWorker:
        args = [self.coordinator, self.group, self.member_id]
        args += [str(self.fail_file), str(self.received_file), *extra]
        self._spawn([self.node, str(WRAPPER), *args])
        return self

    def received(self) -> list[dict[str, Any]]:
        if not self.received_file.exists():
            return []
        return [json.loads(line) for line in self.received_file.read_text().splitlines()]


def put(stubs: Stubs, group: str, password: str, task_count: int = 1) -> None:
    resp = stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group,
            connector="A",
            task_count=task_count,
            config={"topic": "orders", "password": password},
        ),
        timeout=10,
    )
    assert resp.error_code == 0, resp.error_message


def described(stubs: Stubs, group: str) -> Any:
    resp = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group], include_status=True), timeout=10
    )
    (entry,) = resp.groups
    assert entry.error_code == 0, entry.error_message
    return entry


def statuses(stubs: Stubs, group: str) -> dict[str, tuple[str, str, str]]:
    """'A' / 'A-0' -> (state name, worker id, trace)."""
    out = {}
    for s in described(stubs, group).statuses:
        name = f"{s.connector}-{s.task}" if s.HasField("task") else s.connector
        out[name] = (common_pb2.ResourceState.Name(s.state), s.worker_id, s.trace)
    return out


def calls(received: list[dict[str, Any]]) -> list[tuple[str, str | None, list[str]]]:
    """(callback, reason or event, resources as 'A' / 'A-0') of what the callbacks were handed."""
    out = []
    for r in received:
        names = list(r["connectors"]) + [f"{t['connector']}-{t['task']}" for t in r["tasks"]]
        out.append((r["callback"], r.get("reason") or r.get("event"), names))
    return out


def test_node_client_starts_a_restarted_task_moved_to_it_once(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    """DESIGN 3.20 "a grant records the count, so a move satisfies the request": a task
    restarted on W2 moves to W1, which already runs something of its connector (so has its
    config): W1 starts it once and never restarts it."""
    put(stubs, group, FIRST_SECRET, task_count=3)
    w1 = LifecycleWorker(node_client.node, coordinator.address, group, tmp_path / "w1", "w1")
    w2 = LifecycleWorker(node_client.node, coordinator.address, group, tmp_path / "w2", "w2")
    diagnostics = lambda: f"{statuses(stubs, group)}\n{w1.log_text()}\n{w2.log_text()}"  # noqa: E731

    def held_by(member: str) -> set[str]:
        return {
            n for n, (s, w, _) in statuses(stubs, group).items() if s == "RUNNING" and w == member
        }

    try:
        w1.start()
        wait_for("W1 runs all of A", lambda: len(held_by("w1")) == 4, diagnostics=diagnostics)
        w2.start()
        wait_for(
            "A shared by W1 and W2",
            lambda: (
                len(held_by("w1") | held_by("w2")) == 4
                and any(n.startswith("A-") for n in held_by("w2"))
                and held_by("w1")
            ),
            diagnostics=diagnostics,
        )
        task = min(n for n in held_by("w2") if n.startswith("A-"))
        planned = stubs.admin.RestartConnector(
            admin_pb2.RestartConnectorRequest(
                group_id=group, connector="A", task=int(task.removeprefix("A-"))
            ),
            timeout=10,
        )
        assert len(planned.restarts) == 1, planned
        wait_for(
            "the restart on W2",
            lambda: ("onStart", "restart", [task]) in calls(w2.received()),
            diagnostics=diagnostics,
        )
        before = len(w1.received())
        assert w2.terminate() == 0, w2.log_text()  # W1 takes the task over
        wait_for("W1 runs all of A again", lambda: len(held_by("w1")) == 4, diagnostics=diagnostics)
        time.sleep(0.5)  # more answers: none restarts it
        moved = [c for c in calls(w1.received()[before:]) if task in c[2]]
        assert moved == [("onStart", None, moved[0][2])], w1.received()[before:]
        assert w1.events("restart") == []
        assert w1.terminate() == 0, w1.log_text()
    finally:
        w1.kill()
        w2.kill()
