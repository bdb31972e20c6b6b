"""Operating the coordinator as a process: --help, migrate, the embedded SQLite default, health and
reflection, Prometheus metrics, structured epoch logs, describe, and graceful shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import sqlalchemy as sa
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.support.client import ScriptedWorker, describe, put_connector
from tests.support.coordinator import REPO, CoordinatorProcess, Stubs, free_port

ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'generated'}"}


def cli(*args: str, cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", *args],
        cwd=cwd,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_every_command_documents_itself_with_help() -> None:
    top = cli("--help")
    assert top.returncode == 0
    for command in ("serve", "migrate", "describe", "list-groups", "put-connector"):
        assert command in top.stdout
    serve = cli("serve", "--help")
    assert serve.returncode == 0
    for flag in (
        "--port",
        "--database-url",
        "--session-timeout-ms",
        "--heartbeat-interval-ms",
        "--rebalance-timeout-ms",
        "--scheduled-rebalance-max-delay-ms",
        "--advertised-address",
        "--metrics-port",
        "--lease-ms",
    ):
        assert flag in serve.stdout
    assert cli("migrate", "--help").returncode == 0


def test_migrate_creates_the_schema(database_url: str) -> None:
    result = cli("migrate", "--database-url", database_url)
    assert result.returncode == 0, result.stderr
    tables = set(sa.inspect(sa.create_engine(database_url)).get_table_names())
    assert {
        "groups",
        "members",
        "connectors",
        "target_assignments",
        "events",
        "group_configs",
        "group_leases",
    } <= tables


def test_bad_database_url_is_a_clear_error_not_a_traceback() -> None:
    result = cli("migrate", "--database-url", "nosuchdriver://x")
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "coordinator-svc migrate:" in result.stderr


def test_serve_with_no_flags_uses_the_embedded_sqlite_default(tmp_path: Path) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "coordinator_svc.cli",
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=tmp_path,
        env=ENV,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stubs = Stubs(f"127.0.0.1:{port}")
        deadline = time.monotonic() + 30
        while True:
            try:
                if put_connector(stubs, "demo", "A", 2).error_code == 0:
                    break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        assert describe(stubs, "demo").group_epoch == 2
        stubs.close()
        assert (tmp_path / "coordinator.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_health_reflection_metrics_logs_describe_and_graceful_shutdown(
    database_url: str,
    tmp_path: Path,
) -> None:
    log_path = tmp_path / "coordinator.log"
    metrics_port = free_port()
    proc = CoordinatorProcess(
        database_url, "--metrics-port", str(metrics_port), log_path=log_path
    ).start()
    stubs = Stubs(proc.address)
    try:
        health = stubs.health.Check(
            health_pb2.HealthCheckRequest(service="connect.group.v1.ConnectGroupCoordinator"),
            timeout=5,
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING

        reflection = reflection_pb2_grpc.ServerReflectionStub(stubs.channel)
        answers = reflection.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        services = {s.name for a in answers for s in a.list_services_response.service}
        assert {
            "connect.group.v1.ConnectGroupCoordinator",
            "connect.group.v1.ConnectGroupAdmin",
            "grpc.health.v1.Health",
        } <= services

        assert put_connector(stubs, "ops", "A", 2).error_code == 0
        worker = ScriptedWorker(stubs, "ops", "w1")
        assert worker.join().error_code == 10001
        prepared = worker.prepare()
        everything = (frozenset({"A"}), frozenset({("A", 0), ("A", 1)}))
        assert worker.install(prepared.group_epoch, {"w1": everything}).error_code == 0
        worker.heartbeat()

        text = cli("describe", "ops", "--coordinator", proc.address)
        assert text.returncode == 0, text.stderr
        assert "group epoch 3" in text.stdout and "assignment (target) epoch 3" in text.stdout
        assert "w1" in text.stdout and "A, A-0, A-1" in text.stdout

        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5)
            .read()
            .decode()
        )
        for name in (
            "coordinator_groups",
            "coordinator_members",
            "coordinator_rebalances_total",
            "coordinator_assignment_computations_total",
            "coordinator_heartbeat_latency_seconds_bucket",
        ):
            assert name in body, name
        assert 'coordinator_groups{state="STABLE"} 1.0' in body

        assert proc.terminate() == 0, "SIGTERM stops the coordinator cleanly"
        lines = [
            json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")
        ]
        bumps = [entry for entry in lines if entry.get("event") == "group_epoch_bumped"]
        assert [b["group_epoch"] for b in bumps] == [2, 3]
        assert [b["reason"] for b in bumps] == ["connector added", "member joined"]
        assert any(entry.get("event") == "stopped" for entry in lines)
        # The lease was released: another coordinator serves the group at once.
        other = CoordinatorProcess(database_url).start()
        try:
            other_stubs = Stubs(other.address)
            assert describe(other_stubs, "ops").error_code == 0
            other_stubs.close()
        finally:
            other.close()
    finally:
        stubs.close()
        proc.close()


def test_serve_no_migrate_refuses_a_database_that_was_never_migrated(tmp_path: Path) -> None:
    db = tmp_path / "empty.db"
    proc = cli("serve", "--no-migrate", "--database-url", f"sqlite:///{db}", "--port", "0")
    assert proc.returncode == 2, proc.stderr
    assert "not migrated at all" in proc.stderr and "coordinator-svc migrate" in proc.stderr


def test_serve_refuses_a_default_heartbeat_interval_not_below_the_session_timeout(
    tmp_path: Path,
) -> None:
    # The default heartbeat interval is 3000 ms: with a 3000 ms session every AlterGroupConfigs
    # would be refused later; the server says so at once, naming both flags.
    db = tmp_path / "never.db"
    result = cli("serve", "--database-url", f"sqlite:///{db}", "--session-timeout-ms", "3000")
    assert result.returncode == 2
    assert "--heartbeat-interval-ms" in result.stderr
    assert "--session-timeout-ms" in result.stderr
    assert "Traceback" not in result.stderr
    assert not db.exists()  # refused before it touched anything
    ok = cli("serve", "--help", "--session-timeout-ms", "3000", "--heartbeat-interval-ms", "1000")
    assert ok.returncode == 0


def test_an_environment_variable_that_is_empty_leaves_the_default_and_a_bad_one_is_a_usage_error(
    tmp_path: Path,
) -> None:
    db = tmp_path / "never.db"
    env = {**ENV, "SESSION_TIMEOUT_MS": "soon", "HEARTBEAT_INTERVAL_MS": ""}
    result = subprocess.run(
        [sys.executable, "-m", "coordinator_svc.cli", "serve", "--database-url", f"sqlite:///{db}"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--session-timeout-ms" in result.stderr and "'soon'" in result.stderr
    assert "Traceback" not in result.stderr
