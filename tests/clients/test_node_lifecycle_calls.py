"""How the Node.js client (clients/node/worker.js) makes the connector-lifecycle calls (issue 28,
DESIGN 3.20), against a scripted coordinator (tests/worker_agent_membership/fake_coordinator.py,
extended here with ConnectGroupConfigs and ConnectGroupReportStatus), so that throttling, slow
answers and refusals happen exactly when the test wants them:

- it starts nothing before it has the configs, and waits out THROTTLING_QUOTA_EXCEEDED's
  throttle_time_ms before its next member call (configs and statuses share the quota);
- it fetches again when the heartbeat's lifecycle_revision changes, naming the digests it has,
  and keeps its values when the answer leaves them ABSENT;
- it reports changes only, one call in flight, at most one per heartbeat interval, and does not
  resend an entry refused with NOT_RESOURCE_OWNER;
- a failed start is made once, and made again on the restart counts of a later answer (issue
  29);
- an answer reflecting a revision newer than the last heartbeat answer's is the latest: it is
  not fetched again and again until a heartbeat answer catches up;
- a restart starts again only what the membership still holds once its onStop returned (a
  worker fenced meanwhile starts nothing).

The worker is node_lifecycle_worker.js: onStart throws while a file exists."""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connect.group.v1 import common_pb2, coordinator_pb2

from connect_protocol.errors import ErrorCode
from connect_protocol.messages import HeartbeatRequest, HeartbeatResponse
from connect_protocol.tokens import FencingTokens
from tests.clients.conftest import NodeClient
from tests.clients.test_node_lifecycle import LifecycleWorker
from tests.clients.workers import wait_for
from tests.worker_agent_membership.fake_coordinator import FakeCoordinator, Seen, answer, rs

SHARE = rs("A", "A-0")
TOKENS = FencingTokens.granted(rs("A"), 7).with_grant(rs("A-0"), 9)
INTERVAL_MS = 200
CONFIGS_THROTTLE_MS = 800
REPORT_THROTTLE_MS = 500
SLOW_REPORT_S = 0.5  # longer than the heartbeat interval: a second call would overlap
SECRET = "pw-0c8d1e"
DIGESTS = {1: "sha256:first", 2: "sha256:second", 3: "sha256:second"}  # revision 3: same config


@dataclass
class Call:
    name: str
    start: float  # time.time(), as the worker's `ts`
    end: float
    request: Any
    answered: str


@dataclass
class Lifecycle:
    """The member's revision, and the member calls seen."""

    revision: int = 1
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, name: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.name == name]


class LifecycleFake(FakeCoordinator):
    """Heartbeats: epoch 1 with A and A-0 (tokens 7 and 9), the current revision. Configs: the
    first is throttled; then the config of the revision asked at, from revision 2 with restart
    counts of 1 for A and A-0. Statuses: the first report is throttled, the second (FAILED) is
    slow, removes the fail file and then raises the revision to 2, as the coordinator's restart
    of a FAILED resource does (the worker never retries a failed start by itself: it restarts
    them on the counts, with revision 2's config); the third refuses A-0 and raises the revision
    to 3 (same digest)."""

    def __init__(self, fail_file: Path) -> None:
        self.fail_file = fail_file
        self.state = Lifecycle()
        super().__init__(self.script)

    def script(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)
        base = answer(1, SHARE, TOKENS, interval_ms=INTERVAL_MS) if req.member_epoch == 0 else None
        base = base or answer(1, interval_ms=INTERVAL_MS)
        return dataclasses.replace(base, lifecycle_revision=self.state.revision)

    def _leave(self, name: str, start: float, request: Any, answered: str) -> None:
        with self.state.lock:
            self.state.calls.append(Call(name, start, time.time(), request, answered))

    def ConnectGroupConfigs(
        self, request: coordinator_pb2.ConnectGroupConfigsRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupConfigsResponse:
        start = time.time()
        Answer = coordinator_pb2.ConnectGroupConfigsResponse
        if not self.state.of("configs"):
            resp = Answer(
                error_code=common_pb2.THROTTLING_QUOTA_EXCEEDED,
                error_message="over the rate (test)",
                throttle_time_ms=CONFIGS_THROTTLE_MS,
            )
        else:
            revision = self.state.revision
            digest = DIGESTS[revision]
            held = coordinator_pb2.HeldConnector(
                connector="A", config_digest=digest, target_state=common_pb2.TARGET_STARTED
            )
            if request.known_digests.get("A") != digest:
                held.config.values.update({"password": f"{SECRET}-{digest}", "topic": "t"})
            restarts = [
                coordinator_pb2.RestartCount(connector="A", restart_count=1),
                coordinator_pb2.RestartCount(connector="A", task=0, restart_count=1),
            ]
            resp = Answer(
                lifecycle_revision=revision,
                connectors=[held],
                restart_counts=restarts if revision >= 2 else [],
            )
        self._leave("configs", start, request, common_pb2.ErrorCode.Name(resp.error_code))
        return resp

    def ConnectGroupReportStatus(
        self, request: coordinator_pb2.ConnectGroupReportStatusRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupReportStatusResponse:
        start = time.time()
        Answer = coordinator_pb2.ConnectGroupReportStatusResponse
        number = len(self.state.of("report")) + 1
        results = [
            coordinator_pb2.StatusEntryResult(connector=e.connector, task=e.task)
            if e.HasField("task")
            else coordinator_pb2.StatusEntryResult(connector=e.connector)
            for e in request.entries
        ]
        if number == 1:
            resp = Answer(
                error_code=common_pb2.THROTTLING_QUOTA_EXCEEDED,
                error_message="over the rate (test)",
                throttle_time_ms=REPORT_THROTTLE_MS,
            )
        else:
            if number == 2:
                self.fail_file.unlink(missing_ok=True)
                time.sleep(SLOW_REPORT_S)
                self.state.revision = 2  # FAILED: restarted (as the coordinator would)
            if number == 3:
                for r in results:
                    if r.HasField("task"):
                        r.error_code = common_pb2.NOT_RESOURCE_OWNER
                        r.error_message = "not held under that token (test)"
                self.state.revision = 3
            resp = Answer(lifecycle_revision=self.state.revision, results=results)
        self._leave("report", start, request, common_pb2.ErrorCode.Name(resp.error_code))
        return resp


def entries(call: Call) -> list[tuple[str, str, int]]:
    out = []
    for e in call.request.entries:
        name = f"{e.connector}-{e.task}" if e.HasField("task") else e.connector
        out.append((name, common_pb2.ResourceState.Name(e.state), e.fencing_token))
    return sorted(out)


def test_node_client_backs_off_fetches_before_starting_and_reports_changes_once(
    node_client: NodeClient, tmp_path: Path
) -> None:
    fail_file = tmp_path / "fail-start"
    fail_file.write_text("fail")
    with LifecycleFake(fail_file) as fake:
        worker = LifecycleWorker(node_client.node, fake.address, "g", tmp_path).start()
        try:
            wait_for(
                "the fetch at revision 3",
                lambda: any(c["lifecycle_revision"] == 3 for c in worker.events("configs")),
                timeout_s=10,
                diagnostics=worker.log_text,
            )
            time.sleep(3 * INTERVAL_MS / 1000)  # room for a report that should not come
            assert worker.terminate() == 0, worker.log_text()
        finally:
            worker.kill()
    state = fake.state
    configs, reports = state.of("configs"), state.of("report")

    # Configs: throttled, then not asked again before throttle_time_ms; nothing started before.
    assert [c.answered for c in configs] == ["THROTTLING_QUOTA_EXCEEDED", "NONE", "NONE", "NONE"]
    assert configs[1].start - configs[0].end >= CONFIGS_THROTTLE_MS / 1000 - 0.05
    (start,) = worker.events("start")
    assert start["ts"] >= configs[1].end - 0.05
    assert start["config_digests"] == {"A": "sha256:first"}
    # Each later fetch names the digest it has; an ABSENT config keeps the values.
    assert [dict(c.request.known_digests) for c in configs] == [
        {},
        {},
        {"A": "sha256:first"},
        {"A": "sha256:second"},
    ]
    # The failed start ran once; the restart started them with revision 2's config (no
    # reconfiguration of what never started), and revision 3 changed nothing.
    restarted, left = worker.received()
    assert (restarted["callback"], restarted["reason"]) == ("onStart", "restart")
    assert restarted["configs"]["A"]["config"]["password"] == f"{SECRET}-sha256:second"
    assert (left["callback"], left.get("reason")) == ("onStop", None)
    assert len(worker.events("start")) == 1 and len(worker.events("restart")) == 1
    assert worker.events("reconfigured") == []
    assert SECRET not in worker.log_text()

    # Statuses: FAILED (throttled, then again after throttle_time_ms), then RUNNING only once the
    # slow call returned, and never again: A-0's refusal is not resent, A's RUNNING is unchanged.
    assert [c.answered for c in reports] == ["THROTTLING_QUOTA_EXCEEDED", "NONE", "NONE"]
    failed = [("A", "FAILED", 7), ("A-0", "FAILED", 9)]
    running = [("A", "RUNNING", 7), ("A-0", "RUNNING", 9)]
    assert [entries(c) for c in reports] == [failed, failed, running]
    assert reports[1].start - reports[0].end >= REPORT_THROTTLE_MS / 1000 - 0.05
    assert reports[2].start >= reports[1].end  # one call in flight
    assert reports[2].start - reports[1].start >= INTERVAL_MS / 1000 - 0.02
    trace = reports[0].request.entries[0].trace
    assert "start refused by the test" in trace
    (refused,) = [r for line in worker.events("status") for r in line["refused"]]
    assert refused["task"] == 0 and refused["error_code"] == "NOT_RESOURCE_OWNER"
    assert [line["call"] for line in worker.events("throttled")] == [
        "ConnectGroupConfigs",
        "ConnectGroupReportStatus",
    ]


class AheadFake(FakeCoordinator):
    """The revision rises between a heartbeat answer and the fetch it causes: heartbeats answer
    revision 1 until the first fetch was answered, which reflects revision 2 (as if a pause
    came meanwhile), and revision 2 from then on. Reports are counted."""

    def __init__(self) -> None:
        self.state = Lifecycle()
        super().__init__(self.script)

    def script(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)
        base = answer(1, SHARE, TOKENS, interval_ms=AHEAD_INTERVAL_MS)
        if req.member_epoch != 0:
            base = answer(1, interval_ms=AHEAD_INTERVAL_MS)
        return dataclasses.replace(base, lifecycle_revision=2 if self.state.of("configs") else 1)

    def ConnectGroupConfigs(
        self, request: coordinator_pb2.ConnectGroupConfigsRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupConfigsResponse:
        held = coordinator_pb2.HeldConnector(
            connector="A", config_digest="sha256:first", target_state=common_pb2.TARGET_STARTED
        )
        if request.known_digests.get("A") != "sha256:first":
            held.config.values.update({"topic": "t"})
        with self.state.lock:
            self.state.calls.append(Call("configs", time.time(), time.time(), request, "NONE"))
        return coordinator_pb2.ConnectGroupConfigsResponse(lifecycle_revision=2, connectors=[held])

    def ConnectGroupReportStatus(
        self, request: coordinator_pb2.ConnectGroupReportStatusRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupReportStatusResponse:
        results = [
            coordinator_pb2.StatusEntryResult(connector=e.connector, task=e.task)
            if e.HasField("task")
            else coordinator_pb2.StatusEntryResult(connector=e.connector)
            for e in request.entries
        ]
        return coordinator_pb2.ConnectGroupReportStatusResponse(
            lifecycle_revision=2, results=results
        )


AHEAD_INTERVAL_MS = 1000


def test_node_client_takes_a_fetch_answers_newer_revision_without_fetching_again(
    node_client: NodeClient, tmp_path: Path
) -> None:
    """An answer whose revision is newer than the last heartbeat answer's (no heartbeat answer
    came while it was asked) is the latest the worker knows: it starts at once and does not
    fetch again (it used to fetch in a loop, and start nothing, until a heartbeat answer caught
    up)."""
    with AheadFake() as fake:
        worker = LifecycleWorker(node_client.node, fake.address, "g", tmp_path).start()
        try:
            wait_for("the start", lambda: worker.events("start"), diagnostics=worker.log_text)
            time.sleep(1.5 * AHEAD_INTERVAL_MS / 1000)  # the next heartbeat answer: revision 2
            assert worker.terminate() == 0, worker.log_text()
        finally:
            worker.kill()
    (fetch,) = fake.state.of("configs")
    (start,) = worker.events("start")
    assert start["ts"] - fetch.end < AHEAD_INTERVAL_MS / 1000 / 2  # not after a heartbeat
    assert [r["callback"] for r in worker.received()] == ["onStart", "onStop"]


RESTART_STOP_MS = 1500


class FencedDuringRestartFake(FakeCoordinator):
    """Epoch 1 with A and A-0 at revision 1 (restart counts 0); once the worker reported them
    RUNNING, revision 2, whose answer raises A-0's restart count to 1; 300 ms after that answer
    (while the restart's onStop runs, RESTART_STOP_MS), heartbeats are answered
    FENCED_MEMBER_EPOCH until the worker rejoins, and the rejoin gets nothing."""

    def __init__(self) -> None:
        self.state = Lifecycle()
        self.restart_answered_at: float | None = None
        super().__init__(self.script)

    def script(self, req: HeartbeatRequest, seen: list[Seen]) -> HeartbeatResponse:
        if req.member_epoch < 0:
            return HeartbeatResponse(member_epoch=req.member_epoch)
        at = self.restart_answered_at
        if req.member_epoch == 0 and at is not None:
            return answer(2, rs(), interval_ms=INTERVAL_MS)  # the rejoin: nothing
        if req.member_epoch == 0:
            base = answer(1, SHARE, TOKENS, interval_ms=INTERVAL_MS)
        elif at is not None and time.monotonic() > at + 0.3:
            return HeartbeatResponse(ErrorCode.FENCED_MEMBER_EPOCH, "fenced by the test")
        else:
            base = answer(1, interval_ms=INTERVAL_MS)
        return dataclasses.replace(base, lifecycle_revision=self.state.revision)

    def ConnectGroupConfigs(
        self, request: coordinator_pb2.ConnectGroupConfigsRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupConfigsResponse:
        held = coordinator_pb2.HeldConnector(
            connector="A", config_digest="sha256:first", target_state=common_pb2.TARGET_STARTED
        )
        if request.known_digests.get("A") != "sha256:first":
            held.config.values.update({"topic": "t"})
        revision = self.state.revision
        count = coordinator_pb2.RestartCount(connector="A", task=0, restart_count=1)
        if revision == 2 and self.restart_answered_at is None:
            self.restart_answered_at = time.monotonic()
        return coordinator_pb2.ConnectGroupConfigsResponse(
            lifecycle_revision=revision,
            connectors=[held],
            restart_counts=[count] if revision == 2 else [],
        )

    def ConnectGroupReportStatus(
        self, request: coordinator_pb2.ConnectGroupReportStatusRequest, context: Any
    ) -> coordinator_pb2.ConnectGroupReportStatusResponse:
        self.state.revision = 2  # A-0 restarted (RestartConnector)
        results = [
            coordinator_pb2.StatusEntryResult(connector=e.connector, task=e.task)
            if e.HasField("task")
            else coordinator_pb2.StatusEntryResult(connector=e.connector)
            for e in request.entries
        ]
        return coordinator_pb2.ConnectGroupReportStatusResponse(
            lifecycle_revision=2, results=results
        )


def test_node_client_starts_nothing_again_when_fenced_during_a_restart(
    node_client: NodeClient, tmp_path: Path
) -> None:
    """A restart stops the resource, then starts it only if the membership still holds it: a
    worker fenced while the restart's onStop ran (the coordinator may hand the task to another
    worker once the session is over) does not start it again; it releases it and rejoins."""
    with FencedDuringRestartFake() as fake:
        worker = LifecycleWorker(node_client.node, fake.address, "g", tmp_path)
        worker.start(str(RESTART_STOP_MS))
        try:
            wait_for(
                "the rejoin",
                lambda: len(worker.events("joined")) >= 2,
                timeout_s=10,
                diagnostics=worker.log_text,
            )
            assert worker.terminate() == 0, worker.log_text()
        finally:
            worker.kill()
    got = [(r["callback"], r.get("reason"), r["connectors"], r["tasks"]) for r in worker.received()]
    task = [{"connector": "A", "task": 0}]
    assert got == [
        ("onStart", None, ["A"], task),
        ("onStop", "restart", [], task),
        ("onStop", None, ["A"], []),  # the fence: what still runs
    ], got
    (rejoin,) = worker.events("rejoin")
    released = [line for line in worker.events("stop") if line["ts"] > rejoin["ts"]]
    assert [(line["reason"], line["tasks"]) for line in released] == [
        ("revoked during a restart", task),
        ("membership lost", []),
    ], released
