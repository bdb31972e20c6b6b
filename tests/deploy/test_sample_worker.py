"""The sample worker of the deployment example (`python -m examples.sample_worker`): it runs
what the agent's webhook says (answering a revocation once stopped), or exactly what the agent's
status endpoint says (through /watch or by polling), and stops everything when the agent is gone
or was replaced, or on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from connect_protocol.resources import ResourceSet
from examples.sample_worker import (
    Assignment,
    Runner,
    Settings,
    _Reachability,
    follow,
    parse_sse,
)
from tests.deploy.local import json_events, wait_for
from worker_agent.status import StatusServer


def resources(*names: str) -> ResourceSet:
    return ResourceSet.from_json(
        {
            "connectors": [n for n in names if not n[-1].isdigit()],
            "tasks": [
                {"connector": n.rpartition("-")[0], "task": int(n.rpartition("-")[2])}
                for n in names
                if n[-1].isdigit()
            ],
        }
    )


def test_parse_sse_yields_named_events_and_skips_comments() -> None:
    lines = [
        ": keepalive\n",
        "\n",
        "event: assignment\n",
        "id: 3\n",
        'data: {"a":\n',
        "data: 1}\n",
        "\n",
        "data: plain\n",
        "\n",
        "event: dangling\n",
    ]
    assert list(parse_sse(lines)) == [("assignment", '{"a":\n1}'), ("message", "plain")]


def test_assignment_parses_the_status_endpoint_object() -> None:
    a = Assignment.from_json(
        {
            "group_id": "g",
            "member_id": "w",
            "member_epoch": 7,
            "connectors": ["A"],
            "tasks": [{"connector": "A", "task": 0}],
            "ready": True,
        }
    )
    assert a == Assignment(7, frozenset({"A"}), frozenset({("A", 0)}), True, (), "w")
    with pytest.raises(ValueError):
        Assignment.from_json({"tasks": [{"connector": "A"}]})
    with pytest.raises(ValueError):
        Assignment.from_json([])


def test_runner_stops_what_is_gone_and_starts_what_is_new() -> None:
    runner = Runner()
    assert runner.apply(Assignment(2, frozenset({"A"}), frozenset({("A", 0), ("A", 1)}), True))
    assert runner.apply(Assignment(3, frozenset({"A", "B"}), frozenset({("A", 1)}), True))
    assert runner.running() == (frozenset({"A", "B"}), frozenset({("A", 1)}))
    assert not runner.apply(Assignment(3, frozenset({"A", "B"}), frozenset({("A", 1)}), True))
    runner.stop_all("test", final=True)
    assert runner.running() == (frozenset(), frozenset())
    assert not runner.apply(Assignment(4, frozenset({"C"}), frozenset(), True))  # closed
    assert runner.running() == (frozenset(), frozenset())


@pytest.fixture
def status() -> Iterator[StatusServer]:
    server = StatusServer("g", "w-0", keepalive_s=0.2)
    server.start()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.parametrize("mode", ["watch", "poll"])
def test_follows_the_agent_status_endpoint(status: StatusServer, mode: str) -> None:
    runner, reach, stop = Runner(), _Reachability(), threading.Event()
    settings = Settings(f"http://127.0.0.1:{status.port}", mode=mode, poll_interval_s=0.1)
    thread = threading.Thread(target=follow, args=(settings, runner.apply, stop, reach))
    thread.start()
    try:
        status.update(3, resources("A", "A-0", "A-1"))
        wait_for("A to run", lambda: runner.running()[0] == {"A"}, 5)
        status.update(4, resources("A-1", "B-0"))
        wait_for(
            "the new assignment",
            lambda: runner.running() == (frozenset(), frozenset({("A", 1), ("B", 0)})),
            5,
        )
        assert reach.unreachable_for() == 0
        status.close()  # the agent is gone
        wait_for("the agent to be unreachable", lambda: reach.unreachable_for() > 0, 5)
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()


def test_process_runs_what_the_agent_says_and_stops_everything_on_sigterm(
    status: StatusServer, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.sample_worker",
                "--mode",
                "watch",
                "--unreachable-stop-s",
                "30",
            ],
            env={"SAMPLE_WORKER_STATUS_URL": f"http://127.0.0.1:{status.port}", "PATH": ""},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            status.update(5, resources("orders", "orders-0"))

            def running() -> list[dict[str, object]]:
                return json_events(log.read_text().splitlines(), "worker_running")

            wait_for(
                "the worker to run its assignment",
                lambda: running() and running()[-1]["tasks"] == ["orders-0"],
                10,
                log.read_text,
            )
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(10) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines = log.read_text().splitlines()
    last = json_events(lines, "worker_running")[-1]
    assert last["connectors"] == [] and last["tasks"] == [], lines
    stopped = json_events(lines, "worker_stopped")[-1]
    assert stopped["tasks"] == ["orders-0"] and stopped["connectors"] == ["orders"]
    assert json.loads(lines[-1])["event"] == "worker_exit"


def test_stops_everything_when_the_agent_stays_unreachable(tmp_path: Path) -> None:
    server = StatusServer("g", "w-0")
    server.start()
    port = server.port
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.sample_worker",
                "--status-url",
                f"http://127.0.0.1:{port}",
                "--mode",
                "poll",
                "--unreachable-stop-s",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            server.update(2, resources("A-0"))

            def last_running() -> dict[str, object] | None:
                found = json_events(log.read_text().splitlines(), "worker_running")
                return found[-1] if found else None

            wait_for("A-0 to run", lambda: (last_running() or {}).get("tasks") == ["A-0"], 10)
            server.close()
            wait_for(
                "the worker to stop everything",
                lambda: (last_running() or {}).get("tasks") == [],
                10,
                log.read_text,
            )
            assert "unreachable" in str(last_running())
        finally:
            proc.kill()
            proc.wait()
