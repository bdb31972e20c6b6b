"""The worker agent installs on its own: the base distribution into a fresh virtualenv brings
grpcio and protobuf, none of the coordinator's or the audit export's libraries, and the agent it
installs joins a real coordinator (PostgreSQL, gRPC on 127.0.0.1).

The install needs the package index (as ./scripts/test does); nothing of the repository is on the
agent's path: it runs from the temporary directory, with PYTHONPATH unset."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import describe, put_connector
from tests.support.coordinator import InProcessCoordinator

REPO = Path(__file__).resolve().parents[2]
SERVER_ONLY = {"sqlalchemy", "alembic", "psycopg", "psycopg-binary", "pyspark"}


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    venv = tmp_path_factory.mktemp("agent-only") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(REPO)],
        cwd=venv.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    yield venv


def _installed(venv: Path) -> dict[str, str]:
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        env=_env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return {p["name"].lower(): p["version"] for p in json.loads(out.stdout)}


def test_the_base_install_brings_the_agent_without_server_libraries(agent_venv: Path) -> None:
    installed = _installed(agent_venv)
    assert {"grpcio", "protobuf", "connect-group-coordinator"} <= set(installed)
    assert not SERVER_ONLY & set(installed), sorted(SERVER_ONLY & set(installed))
    helped = subprocess.run(
        [str(agent_venv / "bin" / "worker-agent"), "--help"],
        cwd=agent_venv.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert helped.returncode == 0, helped.stderr
    assert "run" in helped.stdout
    # The coordinator's command is there but says what to install instead of a traceback.
    served = subprocess.run(
        [str(agent_venv / "bin" / "coordinator-svc"), "serve", "--port", "0"],
        cwd=agent_venv.parent,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert served.returncode == 2
    assert "connect-group-coordinator[coordinator]" in served.stderr
    assert "Traceback" not in served.stderr


def test_the_agent_only_install_joins_a_real_coordinator(
    agent_venv: Path, database_url: str
) -> None:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        assert put_connector(coord.stubs, "solo", "orders", 2).error_code == 0
        proc = subprocess.Popen(
            [
                str(agent_venv / "bin" / "worker-agent"),
                "run",
                "--coordinator",
                coord.address,
                "--group",
                "solo",
                "--member-id",
                "agent-only-1",
                "--rebalance-timeout-ms",
                "5000",
            ],
            cwd=agent_venv.parent,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            group = describe(coord.stubs, "solo")
            while time.monotonic() < deadline:
                group = describe(coord.stubs, "solo")
                members = {m.member_id: m for m in group.members}
                member = members.get("agent-only-1")
                if (
                    member is not None
                    and group.state == "STABLE"
                    and member.current_assignment.tasks
                ):
                    break
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
            members = {m.member_id: m for m in group.members}
            assert group.state == "STABLE", group
            owned = members["agent-only-1"].current_assignment
            assert set(owned.connectors) == {"orders"}
            assert {(t.connector, t.task) for t in owned.tasks} == {("orders", 0), ("orders", 1)}
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(30)
        assert code == 0
        assert all(m.member_id != "agent-only-1" for m in describe(coord.stubs, "solo").members)
