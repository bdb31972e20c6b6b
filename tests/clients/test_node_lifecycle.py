"""The Node.js client (clients/node/worker.js) and the connector lifecycle (issue 28, DESIGN
3.20), against a real coordinator (`coordinator-svc serve` on PostgreSQL): it fetches the configs
of what it starts (ConnectGroupConfigs) and hands them to onStart, fetches again when a
PutConnector changes a held connector's config (the heartbeat's lifecycle_revision rises) and
hands the new values to onReconfigure, and logs only the digests, never a value. It reports its
resources (ConnectGroupReportStatus): FAILED with the error when onStart throws (made once), RUNNING
once a restart succeeds, changes only, and DescribeGroups(include_status) shows them under its
member id. Issue 29: a restart of one running task is one onStop and one onStart of it (reason
"restart") and nothing else, repeated by no later answer (the pause after it makes the worker
fetch again); a pause reaches onTargetState (event paused) and reads PAUSED, a resume RUNNING;
a stop reads STOPPED for the connector and revokes its task, a resume brings it back; a task
restarted on one Node worker and moved to another that already runs its connector is started
there once and never restarted.

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
ROTATED_SECRET = "pw-rotated-e41b07"
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


def all_in(stubs: Stubs, group: str, state: str) -> dict[str, tuple[str, str, str]] | None:
    now = statuses(stubs, group)
    ok = set(now) == {"A", "A-0"} and all(s == state and w == MEMBER for s, w, _ in now.values())
    return now if ok else None


def test_node_client_fetches_configs_logs_digests_only_and_reports_status(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    put(stubs, group, FIRST_SECRET)
    worker = LifecycleWorker(node_client.node, coordinator.address, group, tmp_path)
    worker.fail_file.write_text("fail")
    worker.start()
    diagnostics = lambda: f"{statuses(stubs, group)}\n{worker.log_text()}"  # noqa: E731
    try:
        failed = wait_for(
            "A and A-0 FAILED under the Node member",
            lambda: all_in(stubs, group, "FAILED"),
            diagnostics=diagnostics,
        )
        assert all("start refused by the test" in trace for _, _, trace in failed.values())
        worker.fail_file.unlink()
        # A failed start is made once (DESIGN 3.20): it runs again only on a restart.
        planned = stubs.admin.RestartConnector(
            admin_pb2.RestartConnectorRequest(
                group_id=group, connector="A", include_tasks=True, only_failed=True
            ),
            timeout=10,
        )
        assert len(planned.restarts) == 2, planned
        running = wait_for(
            "A and A-0 RUNNING under the Node member",
            lambda: all_in(stubs, group, "RUNNING"),
            diagnostics=diagnostics,
        )
        assert all(trace == "" for _, _, trace in running.values())
        first = [line for line in worker.events("configs") if "A" in line["config_digests"]]
        first_digest = first[0]["config_digests"]["A"]
        (spec,) = described(stubs, group).catalogue
        assert spec.config_digest == first_digest  # the digest operators see too

        put(stubs, group, ROTATED_SECRET)  # a config-only change: no rebalance
        reconfigured = wait_for(
            "the Node client to hand the new config to onReconfigure",
            lambda: worker.events("reconfigured"),
            timeout_s=5,
            diagnostics=diagnostics,
        )
        rotated_digest = reconfigured[0]["config_digests"]["A"]
        assert rotated_digest != first_digest
        (spec,) = described(stubs, group).catalogue
        assert spec.config_digest == rotated_digest
        assert all_in(stubs, group, "RUNNING"), statuses(stubs, group)
        assert worker.terminate() == 0, worker.log_text()
    finally:
        worker.kill()

    # The configs reached the callbacks, values and all ...
    received = worker.received()
    started, reconfigured_with, stopped = received  # onStop only at the leave: the failed
    assert (stopped["callback"], stopped.get("reason")) == ("onStop", None)  # start ran nothing
    assert (started["callback"], started["reason"]) == ("onStart", "restart")
    assert started["configs"] == {
        "A": {"digest": first_digest, "config": {"topic": "orders", "password": FIRST_SECRET}}
    }
    assert started["target_states"] == {"A": "TARGET_STARTED"}
    assert reconfigured_with["callback"] == "onReconfigure"
    assert reconfigured_with["connectors"] == ["A"]
    assert reconfigured_with["configs"]["A"] == {
        "digest": rotated_digest,
        "config": {"topic": "orders", "password": ROTATED_SECRET},
    }
    # ... and only the digests reached the log.
    log = worker.log_text()
    assert FIRST_SECRET not in log and ROTATED_SECRET not in log
    assert first_digest in log and rotated_digest in log
    changed = [line["changed"] for line in worker.events("configs")]
    assert changed.count(["A"]) == 2, changed  # the grant's fetch and the change's
    (start,) = worker.events("start")
    assert start["config_digests"] == {"A": first_digest}

    # Changes only: FAILED once, then RUNNING once (after the restart); a reconfiguration that
    # keeps it running reports nothing.
    reported = [
        (f"A-{r['task']}" if "task" in r else r["connector"], r["state"])
        for line in worker.events("status")
        for r in line["counted"]
    ]
    assert sorted(reported) == [
        ("A", "FAILED"),
        ("A", "RUNNING"),
        ("A-0", "FAILED"),
        ("A-0", "RUNNING"),
    ], reported
    assert not any(line["refused"] for line in worker.events("status"))


def calls(received: list[dict[str, Any]]) -> list[tuple[str, str | None, list[str]]]:
    """(callback, reason or event, resources as 'A' / 'A-0') of what the callbacks were handed."""
    out = []
    for r in received:
        names = list(r["connectors"]) + [f"{t['connector']}-{t['task']}" for t in r["tasks"]]
        out.append((r["callback"], r.get("reason") or r.get("event"), names))
    return out


def test_node_client_restarts_in_place_and_applies_target_states(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    put(stubs, group, FIRST_SECRET)
    worker = LifecycleWorker(node_client.node, coordinator.address, group, tmp_path)
    worker.start()
    diagnostics = lambda: f"{statuses(stubs, group)}\n{worker.log_text()}"  # noqa: E731
    try:
        wait_for("RUNNING", lambda: all_in(stubs, group, "RUNNING"), diagnostics=diagnostics)
        before = len(worker.received())
        planned = stubs.admin.RestartConnector(
            admin_pb2.RestartConnectorRequest(group_id=group, connector="A", task=0), timeout=10
        )
        assert [(p.connector, p.task) for p in planned.restarts] == [("A", 0)]
        wait_for(
            "the restart",
            lambda: len(worker.received()) >= before + 2 or None,
            diagnostics=diagnostics,
        )
        wait_for("RUNNING again", lambda: all_in(stubs, group, "RUNNING"), diagnostics=diagnostics)
        fetches = len(worker.events("configs"))

        # Pausing raises the revision: the answers fetched from now on carry A-0's raised
        # restart count again, and nothing is restarted twice.
        stubs.admin.PauseConnector(
            admin_pb2.PauseConnectorRequest(group_id=group, connector="A"), timeout=10
        )
        wait_for("PAUSED", lambda: all_in(stubs, group, "PAUSED"), diagnostics=diagnostics)
        (paused,) = [r for r in worker.received() if r["callback"] == "onTargetState"]
        assert (paused["target_state"], paused["event"]) == ("PAUSED", "paused")
        assert paused["target_states"] == {"A": "TARGET_PAUSED"}
        stubs.admin.ResumeConnector(
            admin_pb2.ResumeConnectorRequest(group_id=group, connector="A"), timeout=10
        )
        wait_for("RUNNING", lambda: all_in(stubs, group, "RUNNING"), diagnostics=diagnostics)
        time.sleep(0.5)  # heartbeat answers keep coming: none repeats anything
        assert len(worker.events("configs")) >= fetches + 2  # refetched after the restart
        assert calls(worker.received()[before:]) == [
            ("onStop", "restart", ["A-0"]),
            ("onStart", "restart", ["A-0"]),
            ("onTargetState", "paused", ["A", "A-0"]),
            ("onTargetState", "resumed", ["A", "A-0"]),
        ], worker.received()[before:]
        assert len(worker.events("restart")) == 1 and len(worker.events("start")) == 1
        assert worker.terminate() == 0, worker.log_text()
    finally:
        worker.kill()

    # Each state once, in order: RUNNING, RUNNING again after the restart (RESTARTING between),
    # PAUSED, RUNNING.
    reported = [
        (f"A-{r['task']}" if "task" in r else r["connector"], r["state"])
        for line in worker.events("status")
        for r in line["counted"]
    ]
    assert [state for name, state in reported if name == "A-0"] == [
        "RUNNING",
        "RUNNING",
        "PAUSED",
        "RUNNING",
    ], reported
    assert [state for name, state in reported if name == "A"] == ["RUNNING", "PAUSED", "RUNNING"]


def test_node_client_stopped_connector_reports_stopped_and_resumes_its_tasks(
    node_client: NodeClient,
    coordinator: CoordinatorProcess,
    stubs: Stubs,
    group: str,
    tmp_path: Path,
) -> None:
    put(stubs, group, FIRST_SECRET)
    worker = LifecycleWorker(node_client.node, coordinator.address, group, tmp_path)
    worker.start()
    diagnostics = lambda: f"{statuses(stubs, group)}\n{worker.log_text()}"  # noqa: E731
    try:
        wait_for("RUNNING", lambda: all_in(stubs, group, "RUNNING"), diagnostics=diagnostics)
        before = len(worker.received())
        stopped = stubs.admin.StopConnector(
            admin_pb2.StopConnectorRequest(group_id=group, connector="A"), timeout=10
        )
        assert stopped.error_code == 0 and stopped.changed, stopped
        # The connector stays held and reports STOPPED; its task is revoked (no status left).
        wait_for(
            "A STOPPED and A-0 gone",
            lambda: (
                statuses(stubs, group).keys() == {"A"}
                and statuses(stubs, group)["A"][:2] == ("STOPPED", MEMBER)
            ),
            diagnostics=diagnostics,
        )
        stubs.admin.ResumeConnector(
            admin_pb2.ResumeConnectorRequest(group_id=group, connector="A"), timeout=10
        )
        wait_for("RUNNING", lambda: all_in(stubs, group, "RUNNING"), diagnostics=diagnostics)
        got = calls(worker.received()[before:])
        assert sorted(got[:2]) == [("onStop", None, ["A-0"]), ("onTargetState", "stopped", ["A"])]
        assert sorted(got[2:]) == [("onStart", None, ["A-0"]), ("onTargetState", "resumed", ["A"])]
        assert worker.terminate() == 0, worker.log_text()
    finally:
        worker.kill()


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
