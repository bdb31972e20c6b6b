"""The agent's control-plane calls (issue 28, DESIGN 3.20, `worker_agent/control.py`): when it
fetches configs, how it reports statuses (changes only, one call in flight, at most one per
heartbeat interval, refused entries dropped), that it backs off on THROTTLING_QUOTA_EXCEEDED for
at least the time the coordinator asks and never spins, and that the machines start nothing
before its config has come. A scripted transport for the exact timings; then a real agent on a
real coordinator (in-process, real gRPC and PostgreSQL) whose member-call rate is tiny."""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, common_pb2

from connect_protocol import lifecycle_wire
from connect_protocol.errors import ErrorCode
from connect_protocol.lifecycle_messages import (
    ConfigsResponse,
    EntryResult,
    HeldConnector,
    ReportedState,
    ReportStatusResponse,
)
from connect_protocol.messages import AssignmentMessage, Assignor, HeartbeatResponse
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from coordinator_svc.runtime.quotas import PrincipalQuotas
from tests.support.agents import wait_for
from tests.support.coordinator import InProcessCoordinator
from worker_agent.assignors import assignors_for_protocol
from worker_agent.control import CallIdentity, ControlPlane
from worker_agent.lifecycle import ConfigChanges, ResourceNotHeld
from worker_agent.listener import CallbackListener, ListenerFailed, RebalanceEvent
from worker_agent.membership import Membership, MembershipConfig, StartWork
from worker_agent.runtime import Agent, AgentSettings
from worker_agent.status import StatusServer

GROUP = "g"
SECRET = "agent-lifecycle-secret"


# --- a scripted transport and host ----------------------------------------------------------------


@dataclass
class Scripted:
    """Answers ConnectGroupConfigs and ConnectGroupReportStatus from queues (the last answer
    repeats), recording each request with its time."""

    configs: list[ConfigsResponse]
    reports: list[ReportStatusResponse] = field(default_factory=lambda: [ReportStatusResponse()])
    seen: list[tuple[str, float, Any]] = field(default_factory=list)

    def _next(self, queue: list[Any]) -> Any:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    def configs_call(self, request: Any, timeout_s: float) -> Any:
        self.seen.append(
            ("configs", time.monotonic(), lifecycle_wire.configs_request_from(request))
        )
        return lifecycle_wire.configs_response_to(self._next(self.configs))

    def report_call(self, request: Any, timeout_s: float) -> Any:
        self.seen.append(("report", time.monotonic(), lifecycle_wire.report_request_from(request)))
        return lifecycle_wire.report_response_to(self._next(self.reports))

    def times(self, kind: str) -> list[float]:
        return [t for k, t, _ in self.seen if k == kind]


class FakeTransport:
    def __init__(self, script: Scripted) -> None:
        self.script = script

    def configs(self, request: Any, timeout_s: float) -> Any:
        return self.script.configs_call(request, timeout_s)

    def report_status(self, request: Any, timeout_s: float) -> Any:
        return self.script.report_call(request, timeout_s)


class Host:
    def __init__(self, interval_ms: int = 100) -> None:
        self.identity = CallIdentity("w1", 5, True, interval_ms)
        self.changes: list[ConfigChanges | None] = []

    def _lifecycle_identity(self) -> CallIdentity:
        return self.identity

    def _lifecycle_keep(self) -> frozenset[str]:
        return frozenset()

    def _configs_changed(self, changes: ConfigChanges | None, current: bool) -> None:
        self.changes.append(changes)


@pytest.fixture
def plane() -> Iterator[tuple[ControlPlane, Scripted, Host]]:
    script = Scripted([ConfigsResponse(lifecycle_revision=1)])
    host = Host()
    control = ControlPlane(host, FakeTransport(script), GROUP, lambda: 1.0)  # type: ignore[arg-type]
    control.start()
    try:
        yield control, script, host
    finally:
        control.close()


def held(name: str, digest: str, config: dict[str, str] | None) -> HeldConnector:
    return HeldConnector(name, digest, config)


def test_fetches_when_the_revision_moves_with_the_digests_it_has(
    plane: tuple[ControlPlane, Scripted, Host],
) -> None:
    control, script, host = plane
    script.configs[:] = [
        ConfigsResponse(lifecycle_revision=3, connectors=(held("a", "d1", {"k": "v"}),)),
        ConfigsResponse(lifecycle_revision=4, connectors=(held("a", "d2", {"k": "w"}),)),
    ]
    control.joined()
    control.saw_revision(3)
    wait_for("the first fetch", lambda: len(host.changes) == 1, timeout_s=2)
    control.saw_revision(3)  # the same revision again: nothing to fetch
    time.sleep(0.1)
    assert len(script.times("configs")) == 1
    control.saw_revision(4)
    wait_for("the second fetch", lambda: len(host.changes) == 2, timeout_s=2)
    second = [r for k, _, r in script.seen if k == "configs"][1]
    assert dict(second.known_digests) == {"a": "d1"} and second.member_epoch == 5
    assert host.changes[1] is not None and host.changes[1].reconfigured == {"a"}


def test_throttled_calls_wait_at_least_the_time_asked_and_never_spin(
    plane: tuple[ControlPlane, Scripted, Host],
) -> None:
    control, script, _host = plane
    throttled = ConfigsResponse(
        error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED, throttle_time_ms=300
    )
    script.configs[:] = [throttled, throttled, ConfigsResponse(lifecycle_revision=2)]
    script.reports[:] = [
        ReportStatusResponse(error_code=ErrorCode.THROTTLING_QUOTA_EXCEEDED, throttle_time_ms=250),
        ReportStatusResponse(results=(EntryResult("a"),)),
    ]
    control.saw_revision(2)
    control.report("a", ReportedState.RUNNING, "", 7)
    wait_for("the fetch answered", lambda: control.cache.revision == 2, timeout_s=3)
    # pending() is also False while a report is in flight (the throttled one, on a busy
    # machine): wait for the second report's answer.
    wait_for(
        "the report counted",
        lambda: (len(script.times("report")) == 2 and not control.book.pending()) or None,
        timeout_s=3,
    )
    calls = sorted(script.seen, key=lambda s: s[1])
    # 3 fetches and 2 reports, no more; every call after a throttled answer waited at least its
    # throttle time (both kinds share the principal's rate, so a fetch's throttle holds the
    # report back too).
    assert [k for k, _, _ in calls] == ["configs", "configs", "configs", "report", "report"]
    at = [t for _, t, _ in calls]
    assert at[1] - at[0] >= 0.3 and at[2] - at[1] >= 0.3, at
    assert at[4] - at[3] >= 0.25, at
    assert control.throttled == 3


def test_reports_go_one_at_a_time_at_most_one_per_interval_refusals_dropped(
    plane: tuple[ControlPlane, Scripted, Host], caplog: pytest.LogCaptureFixture
) -> None:
    control, script, _host = plane
    caplog.set_level(logging.INFO, "worker_agent")
    script.reports[:] = [
        ReportStatusResponse(
            results=(
                EntryResult("a"),
                EntryResult(TaskId("a", 0), ErrorCode.NOT_RESOURCE_OWNER, "moved away"),
            )
        ),
        ReportStatusResponse(results=(EntryResult("a"),)),
    ]
    control.report("a", ReportedState.RUNNING, "", 7)
    control.report(TaskId("a", 0), ReportedState.FAILED, "boom " + SECRET, 7)
    wait_for("the first report", lambda: len(script.times("report")) == 1, timeout_s=2)
    first = next(r for k, _, r in script.seen if k == "report")
    assert [(e.resource, e.state, e.token) for e in first.entries] == [
        ("a", ReportedState.RUNNING, 7),
        (TaskId("a", 0), ReportedState.FAILED, 7),
    ]
    control.report("a", ReportedState.FAILED, "later", 7)  # a change: the next report
    wait_for("the second report", lambda: len(script.times("report")) == 2, timeout_s=2)
    first_at, second_at = script.times("report")
    assert second_at - first_at >= 0.1  # the heartbeat interval
    second = [r for k, _, r in script.seen if k == "report"][1]
    assert [e.resource for e in second.entries] == ["a"]  # A-0 was refused: dropped
    assert "status of a-0 not counted (NOT_RESOURCE_OWNER: moved away); dropped" in caplog.text
    assert SECRET not in caplog.text  # traces are logged as digests
    time.sleep(0.25)
    assert len(script.times("report")) == 2  # nothing changed since: nothing sent


# --- the machines start nothing before its config --------------------------------------------


def test_the_machine_starts_only_what_it_has_configs_for() -> None:
    m = Membership(MembershipConfig(GROUP, "w1", (Assignor("eager", 0, 0),), 60_000))
    m.ready_connectors = frozenset()
    (_join,) = m.poll(0)
    work = ResourceSet.of(["a", "b"], [("a", 0), ("b", 0)])
    m.on_heartbeat_response(
        HeartbeatResponse(
            member_epoch=1,
            heartbeat_interval_ms=1000,
            session_timeout_ms=10_000,
            assignment=AssignmentMessage(work, tokens=FencingTokens.granted(work, 1)),
        ),
        1,
    )
    assert not [a for a in m.poll(2) if isinstance(a, StartWork)]
    assert m.awaiting_configs == {"a", "b"}  # the runtime fetches again if no fetch is due
    m.ready_connectors = frozenset({"a"})
    (start,) = [a for a in m.poll(3) if isinstance(a, StartWork)]
    assert start.resources == ResourceSet.of(["a"], [("a", 0)])
    m.work_started(start.resources, 4)
    assert m.awaiting_configs == {"b"}
    m.ready_connectors = frozenset({"a", "b"})
    (rest,) = [a for a in m.poll(5) if isinstance(a, StartWork)]
    assert rest.resources == ResourceSet.of(["b"], [("b", 0)])
    m.work_started(rest.resources, 6)
    assert m.awaiting_configs == frozenset()
    # Everything of a stopped: its config is fetched again before anything of it restarts.
    m.configs_dropped(frozenset({"a"}))
    assert m.ready_connectors == {"b"}


# --- a real agent on a real coordinator with a tiny member-call rate -----------------------------


def test_a_throttled_agent_backs_off_and_still_gets_its_configs_and_reports(
    database_url: str,
) -> None:
    quotas = PrincipalQuotas(member_call_rate=4.0, member_call_burst=1.0)
    with InProcessCoordinator(database_url, quotas=quotas) as coord:
        assert coord.stubs is not None
        coord.stubs.admin.PutConnector(
            admin_pb2.PutConnectorRequest(
                group_id=GROUP, connector="a", task_count=2, config={"password": SECRET}
            ),
            timeout=10,
        )
        assigned: list[RebalanceEvent] = []
        attempts: list[int] = []
        while_starting: list[int] = []

        def on_assigned(event: RebalanceEvent) -> None:
            attempts.append(1)
            if len(attempts) == 1:
                try:  # not started yet: the worker cannot report it
                    agent.report_status("a", ReportedState.FAILED, "too early")
                except ResourceNotHeld as error:
                    while_starting.append(error.status)
                raise ListenerFailed(
                    "exec hook 'start' exited with 1; stderr: no route", exit_code=1
                )
            assigned.append(event)

        settings = AgentSettings(
            group_id=GROUP,
            member_id="w1",
            coordinators=(coord.address,),
            assignors=tuple(assignors_for_protocol("sessioned")),
            listener_initial_backoff_s=0.3,
        )
        status = StatusServer(GROUP, "w1")
        status.start()
        agent = Agent(settings, CallbackListener(on_assigned=on_assigned), status)
        started = time.monotonic()
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        try:

            def view() -> dict[Any, Any]:
                resp = coord.stubs.admin.DescribeGroups(  # type: ignore[union-attr]
                    admin_pb2.DescribeGroupsRequest(group_ids=[GROUP], include_status=True),
                    timeout=10,
                )
                return {
                    (s.connector, s.task if s.HasField("task") else None): s
                    for s in resp.groups[0].statuses
                }

            wait_for(
                "FAILED after the failed start",
                lambda: all(s.state == common_pb2.FAILED for s in view().values()) or None,
                timeout_s=10,
            )
            time.sleep(1.0)
            assert attempts == [1] and not assigned  # a failed start is made once (DESIGN 3.20)
            restarted = coord.stubs.admin.RestartConnector(
                admin_pb2.RestartConnectorRequest(
                    group_id=GROUP, connector="a", include_tasks=True, only_failed=True
                ),
                timeout=10,
            )
            assert len(restarted.restarts) == 3, restarted
            wait_for("the start made again on the restart", lambda: assigned or None, timeout_s=10)
            (event,) = assigned
            assert event.reason == "restart"
            assert event.configs["a"].values == {"password": SECRET}
            assert while_starting == [409]

            wait_for(
                "RUNNING after the retry",
                lambda: all(s.state == common_pb2.RUNNING for s in view().values()) or None,
                timeout_s=10,
            )
            # The worker's own reports: in-process, and POST /status on the status endpoint.
            agent.report_status(TaskId("a", 1), "FAILED", "lost its connection")
            headers = {"Host": f"127.0.0.1:{status.port}", "X-Worker-Agent": "status"}
            for body, code in (
                ({"connector": "a", "task": 0, "state": "FAILED", "trace": "disk full"}, 202),
                ({"connector": "zz", "state": "RUNNING"}, 404),
                ({"connector": "a", "task": 0, "state": "STOPPED"}, 400),
            ):
                assert post(status.port, "/status", headers, body)[0] == code, body
            wait_for(
                "the worker's own FAILED",
                lambda: (
                    (
                        view()[("a", 1)].state == common_pb2.FAILED
                        and view()[("a", 0)].state == common_pb2.FAILED
                    )
                    or None
                ),
                timeout_s=10,
            )
            assert view()[("a", 1)].trace == "lost its connection"
            assert view()[("a", 0)].trace == "disk full"
            with pytest.raises(ResourceNotHeld) as not_held:
                agent.report_status("zz", ReportedState.RUNNING)
            assert not_held.value.status == 404
            with pytest.raises(ValueError):
                agent.report_status(TaskId("a", 0), "STOPPED")
            control = agent.control
            assert control.throttled > 0  # the rate was hit ...
            calls = control.fetches + control.reports
            elapsed = time.monotonic() - started
            # ... and not spun against: a throttled call waits for the next token.
            assert calls <= 2 * 4.0 * elapsed + 4, (calls, elapsed)
        finally:
            agent.stop()
            thread.join(10)
            status.close()


def post(port: int, path: str, headers: dict[str, str], body: object) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()
