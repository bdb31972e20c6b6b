"""Fencing tokens (DESIGN 3.18) on the status endpoint (`/assignment`, `/watch`) and in the sample
worker that follows it (examples/sample_worker.py)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest

from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens
from examples.sample_worker import Assignment, Runner
from tests.worker_agent_listeners.test_status import Watch, get_json
from worker_agent.status import StatusServer

ASSIGNMENT = ResourceSet.of(["b", "a"], [("b", 0), ("a", 1)])
TOKENS = FencingTokens(
    {"a": 3, "b": 8, TaskId("a", 1): 4, TaskId("b", 0): 9, TaskId("z", 0): 99}  # z: not listed
)
TOKENS_JSON = {
    "connectors": {"a": 3, "b": 8},
    "tasks": [{"connector": "a", "task": 1, "token": 4}, {"connector": "b", "task": 0, "token": 9}],
}


@pytest.fixture
def server() -> Iterator[StatusServer]:
    status = StatusServer("demo", "worker-1", keepalive_s=0.2)
    status.start()
    try:
        yield status
    finally:
        status.close()


def test_assignment_serves_the_token_of_each_resource_listed(server: StatusServer) -> None:
    server.update(4, ASSIGNMENT, TOKENS)
    code, data = get_json(server, "/assignment")
    assert code == 200
    assert data == {
        "group_id": "demo",
        "member_id": "worker-1",
        "member_epoch": 4,
        "connectors": ["a", "b"],
        "tasks": [{"connector": "a", "task": 1}, {"connector": "b", "task": 0}],
        "fencing_tokens": TOKENS_JSON,
        "configs": {},
        "target_states": {},
        "ready": True,
    }


def test_watch_carries_tokens_and_sends_an_event_when_only_a_token_changed(
    server: StatusServer,
) -> None:
    server.update(4, ASSIGNMENT, TOKENS)
    watch = Watch(server)
    try:
        name, data = watch.next_event()
        assert name == "assignment"
        assert data["fencing_tokens"] == TOKENS_JSON
        server.update(4, ASSIGNMENT, TOKENS)  # nothing new: no event
        newer = TOKENS.with_grant(ResourceSet.of((), [("a", 1)]), 17)
        server.update(4, ASSIGNMENT, newer)
        _, data = watch.next_event()
        assert data["member_epoch"] == 4
        assert data["fencing_tokens"]["tasks"][0] == {  # type: ignore[index]
            "connector": "a",
            "task": 1,
            "token": 17,
        }
    finally:
        watch.close()


def test_sample_worker_reads_tokens_and_logs_them(caplog: pytest.LogCaptureFixture) -> None:
    obj = {
        "member_epoch": 4,
        "connectors": ["a"],
        "tasks": [{"connector": "a", "task": 1}],
        "fencing_tokens": {
            "connectors": {"a": 3},
            "tasks": [{"connector": "a", "task": 1, "token": 4}],
        },
        "ready": True,
    }
    assignment = Assignment.from_json(obj)
    assert assignment.fencing_tokens == (("a", 3), ("a-1", 4))
    without = Assignment.from_json({k: v for k, v in obj.items() if k != "fencing_tokens"})
    assert without.fencing_tokens == ()  # an older agent
    with pytest.raises(ValueError):
        Assignment.from_json({**obj, "fencing_tokens": ["a"]})
    runner = Runner()
    caplog.set_level(logging.INFO, logger="sample_worker")
    runner.apply(assignment)
    fields = {r.fields["event"]: r.fields for r in caplog.records}  # type: ignore[attr-defined]
    assert fields["worker_started"]["fencing_tokens"] == {"a": 3, "a-1": 4}
    assert fields["worker_running"]["fencing_tokens"] == {"a": 3, "a-1": 4}
    caplog.clear()
    # Same resources, a new token: the running line says so.
    runner.apply(Assignment.from_json({**obj, "fencing_tokens": {"connectors": {"a": 5}}}))
    (line,) = [r.fields for r in caplog.records]  # type: ignore[attr-defined]
    assert line["event"] == "worker_running"
    assert line["fencing_tokens"] == {"a": 5}
    json.dumps(line)  # loggable as JSON
