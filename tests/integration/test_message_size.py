"""Every gRPC server and client sets its message size limit explicitly (--max-message-bytes):
`coordinator-svc serve` and its operator commands, and `worker-agent run`. Real processes on
127.0.0.1 and real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from connect.group.v1 import admin_pb2

from connect_protocol.limits import DEFAULT_MAX_MESSAGE_BYTES
from tests.support.coordinator import REPO, CoordinatorProcess, Stubs, free_port

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}", "COLUMNS": "200"}
GRPC_DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024


def run(
    module: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
    )


def put_connector(
    stubs: Stubs, connector: str, config_bytes: int
) -> admin_pb2.PutConnectorResponse:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id="sized",
            connector=connector,
            task_count=2,
            config={"payload": "x" * config_bytes},
        ),
        timeout=30,
    )


@pytest.fixture
def default_coordinator(database_url: str, tmp_path: Path) -> Iterator[CoordinatorProcess]:
    # Default message limits; the config limits (1 MiB per connector by default) raised so that
    # one large config can carry a request over gRPC's built-in 4 MiB.
    coordinator = CoordinatorProcess(
        database_url,
        "--max-config-bytes-per-connector",
        str(16 * 1024 * 1024),
        log_path=tmp_path / "coordinator.log",
    )
    try:
        yield coordinator.start()
    finally:
        coordinator.close()


# --- the flags -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "command", "env_var"),
    [
        ("coordinator_svc.cli", "serve", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("coordinator_svc.cli", "describe", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("coordinator_svc.cli", "list-groups", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("coordinator_svc.cli", "put-connector", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("coordinator_svc.cli", "delete-connector", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("coordinator_svc.cli", "alter-configs", "COORDINATOR_MAX_MESSAGE_BYTES"),
        ("worker_agent.cli", "run", "WORKER_AGENT_MAX_MESSAGE_BYTES"),
    ],
)
def test_help_lists_the_flag_and_its_environment_variable(
    module: str, command: str, env_var: str
) -> None:
    result = run(module, command, "--help")
    assert result.returncode == 0, result.stderr
    assert "--max-message-bytes" in result.stdout
    assert env_var in result.stdout
    assert str(DEFAULT_MAX_MESSAGE_BYTES) in result.stdout


def serve_args(tmp_path: Path) -> list[str]:
    """Where `serve` would run if it started (it must not)."""
    return [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(free_port()),
        "--database-url",
        f"sqlite:///{tmp_path / 'coordinator.db'}",
    ]


@pytest.mark.parametrize("value", ["0", "-5", str(2**31)])
def test_serve_refuses_an_unusable_limit_with_a_clear_error(value: str, tmp_path: Path) -> None:
    result = run("coordinator_svc.cli", *serve_args(tmp_path), "--max-message-bytes", value)
    assert result.returncode == 2
    assert "coordinator-svc serve: --max-message-bytes" in result.stderr
    assert "must be between 1 and" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_limit_in_the_environment_that_is_not_a_number_is_a_usage_error(tmp_path: Path) -> None:
    result = run(
        "coordinator_svc.cli", *serve_args(tmp_path), env={"COORDINATOR_MAX_MESSAGE_BYTES": "lots"}
    )
    assert result.returncode == 2
    assert "--max-message-bytes" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_agent_refuses_an_unusable_limit_with_a_clear_error() -> None:
    result = run(
        "worker_agent.cli",
        "run",
        "--coordinator",
        f"127.0.0.1:{free_port()}",
        env={"WORKER_AGENT_MAX_MESSAGE_BYTES": "0"},
    )
    assert result.returncode == 2
    assert "worker-agent: --max-message-bytes" in result.stderr
    assert "Traceback" not in result.stderr


# --- the server ----------------------------------------------------------------------------------


def test_by_default_the_server_accepts_a_request_over_grpcs_built_in_4_mib(
    default_coordinator: CoordinatorProcess,
) -> None:
    stubs = Stubs(default_coordinator.address)
    try:
        resp = put_connector(stubs, "big", GRPC_DEFAULT_RECEIVE_BYTES + 1024 * 1024)
    finally:
        stubs.close()
    assert resp.error_code == 0, resp.error_message
    assert resp.created


def test_a_server_with_a_small_limit_rejects_a_larger_request(
    database_url: str, tmp_path: Path
) -> None:
    coordinator = CoordinatorProcess(
        database_url, "--max-message-bytes", "4096", log_path=tmp_path / "coordinator.log"
    ).start()
    stubs = Stubs(coordinator.address)
    try:
        assert put_connector(stubs, "small", 1000).error_code == 0
        with pytest.raises(grpc.RpcError) as raised:
            put_connector(stubs, "large", 8000)
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        stubs.close()
        coordinator.close()


# --- the clients ---------------------------------------------------------------------------------


def test_operator_commands_apply_their_limit_to_what_they_receive(
    default_coordinator: CoordinatorProcess,
) -> None:
    stubs = Stubs(default_coordinator.address)
    try:
        assert put_connector(stubs, "some", 100).error_code == 0
    finally:
        stubs.close()
    address = ["--coordinator", default_coordinator.address]
    assert run("coordinator_svc.cli", "list-groups", *address).returncode == 0
    # The ListGroups answer (one group) is larger than 16 bytes.
    by_flag = run("coordinator_svc.cli", "list-groups", *address, "--max-message-bytes", "16")
    by_env = run(
        "coordinator_svc.cli",
        "list-groups",
        *address,
        env={"COORDINATOR_MAX_MESSAGE_BYTES": "16"},
    )
    for result in (by_flag, by_env):
        assert result.returncode == 1
        assert "RESOURCE_EXHAUSTED" in result.stderr
    describe = run(
        "coordinator_svc.cli", "describe", "sized", *address, "--max-message-bytes", "16"
    )
    assert describe.returncode == 1
    assert "RESOURCE_EXHAUSTED" in describe.stderr


def test_worker_agent_applies_its_limit_and_says_which_flag_raises_it(
    default_coordinator: CoordinatorProcess, tmp_path: Path
) -> None:
    """A limit smaller than the agent's first heartbeat: the call fails on the agent's side, and
    the log says so once, naming the flag."""
    log_path = tmp_path / "agent.log"
    with open(log_path, "wb") as log:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker_agent.cli",
                "run",
                "--coordinator",
                default_coordinator.address,
                "--group",
                "sized",
                "--member-id",
                "worker-1",
                "--log-format",
                "text",
                "--max-message-bytes",
                "16",
            ],
            cwd=REPO,
            env=ENV,
            stdout=log,
            stderr=log,
        )
        try:
            deadline = time.monotonic() + 20
            text = ""
            while "exceeded the gRPC message size limit" not in text:
                assert time.monotonic() < deadline, f"no size-limit error in the log:\n{text}"
                assert agent.poll() is None, f"the agent exited:\n{text}"
                time.sleep(0.1)
                text = log_path.read_text()
            time.sleep(1.0)  # a few more heartbeat attempts
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(20) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    text = log_path.read_text()
    assert text.count("exceeded the gRPC message size limit") == 1, text
    assert "RESOURCE_EXHAUSTED" in text
    assert "WORKER_AGENT_MAX_MESSAGE_BYTES, now 16" in text
