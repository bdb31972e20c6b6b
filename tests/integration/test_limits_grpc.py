"""Issue 12's limits through a real `coordinator-svc serve` and its flags: each refusal is an
in-band POLICY_VIOLATION or THROTTLING_QUOTA_EXCEEDED naming its flag, and changes nothing.
(Before the limits, 13 connectors of 3.9 MB of config each were accepted.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2

from connect_protocol.configs import config_digest
from connect_protocol.errors import ErrorCode
from tests.support.coordinator import CoordinatorProcess, Stubs
from tests.support.digests import digest_key

LIMITS = (
    "--max-id-length",
    "20",
    "--max-url-length",
    "30",
    "--max-groups",
    "3",
    "--max-connectors-per-group",
    "3",
    "--max-tasks-per-group",
    "10",
    "--max-config-bytes-per-connector",
    "1000",
    "--max-config-bytes-per-group",
    "2500",
    "--max-assignor-metadata-bytes",
    "100",
    "--max-joins-per-s",
    "2",
    "--max-group-creations-per-s",
    "1000",
)


@pytest.fixture
def limited(database_url: str, tmp_path: Path) -> Iterator[Stubs]:
    coordinator = CoordinatorProcess(database_url, *LIMITS, log_path=tmp_path / "c.log").start()
    stubs = Stubs(coordinator.address)
    try:
        yield stubs
    finally:
        stubs.close()
        coordinator.close()


def _put(stubs: Stubs, group: str, name: str, tasks: int, config_bytes: int = 0) -> object:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=group,
            connector=name,
            task_count=tasks,
            config={"k": "v" * config_bytes} if config_bytes else {},
        ),
        timeout=10,
    )


def _catalogue(stubs: Stubs, group: str) -> dict[str, tuple[int, str]]:
    described = stubs.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=[group]), timeout=10
    ).groups[0]
    return {c.name: (c.task_count, c.config_digest) for c in described.catalogue}


def test_catalogue_limits_refuse_with_policy_violation_and_change_nothing(
    limited: Stubs, database_url: str
) -> None:
    assert _put(limited, "g", "A", 4, 900).error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    too_big = _put(limited, "g", "B", 1, 1000)
    assert too_big.error_code == ErrorCode.POLICY_VIOLATION  # type: ignore[attr-defined]
    assert "--max-config-bytes-per-connector" in too_big.error_message  # type: ignore[attr-defined]
    assert _put(limited, "g", "B", 4, 900).error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    group_bytes = _put(limited, "g", "C", 1, 900)
    assert group_bytes.error_code == ErrorCode.POLICY_VIOLATION  # type: ignore[attr-defined]
    assert "--max-config-bytes-per-group" in group_bytes.error_message  # type: ignore[attr-defined]
    tasks = _put(limited, "g", "C", 3)
    assert tasks.error_code == ErrorCode.POLICY_VIOLATION  # type: ignore[attr-defined]
    assert "--max-tasks-per-group" in tasks.error_message  # type: ignore[attr-defined]
    assert _put(limited, "g", "C", 2).error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    count = _put(limited, "g", "D", 0)
    assert count.error_code == ErrorCode.POLICY_VIOLATION  # type: ignore[attr-defined]
    assert "--max-connectors-per-group" in count.error_message  # type: ignore[attr-defined]
    key = digest_key(database_url)
    big = config_digest({"k": "v" * 900}, key)
    empty = config_digest({}, key)
    assert _catalogue(limited, "g") == {"A": (4, big), "B": (4, big), "C": (2, empty)}


def test_groups_per_database_limit(limited: Stubs) -> None:
    for group in ("g1", "g2", "g3"):
        assert _put(limited, group, "A", 1).error_code == ErrorCode.NONE  # type: ignore[attr-defined]
    refused = _put(limited, "g4", "A", 1)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION  # type: ignore[attr-defined]
    assert "--max-groups" in refused.error_message  # type: ignore[attr-defined]
    described = limited.admin.DescribeGroups(
        admin_pb2.DescribeGroupsRequest(group_ids=["g4"]), timeout=10
    ).groups[0]
    assert described.error_code == ErrorCode.GROUP_ID_NOT_FOUND
    assert _put(limited, "g1", "B", 1).error_code == ErrorCode.NONE  # type: ignore[attr-defined]


def _join(member: str, metadata: bytes = b"") -> coordinator_pb2.ConnectGroupHeartbeatRequest:
    req = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id="joins", member_id=member, member_epoch=0, rebalance_timeout_ms=5000
    )
    assignor = req.client_assignors.assignors.add()
    assignor.name, assignor.minimum_version, assignor.maximum_version = "eager", 0, 0
    assignor.metadata = metadata
    req.connectors_and_tasks.SetInParent()
    return req


def test_assignor_metadata_limit_and_join_rate(limited: Stubs) -> None:
    fat = limited.coordinator.ConnectGroupHeartbeat(_join("fat", b"x" * 101), timeout=10)
    assert fat.error_code == ErrorCode.POLICY_VIOLATION
    assert "--max-assignor-metadata-bytes" in fat.error_message
    codes = [
        limited.coordinator.ConnectGroupHeartbeat(_join(f"m{i}"), timeout=10).error_code
        for i in range(30)
    ]
    throttled = [c for c in codes if c == ErrorCode.THROTTLING_QUOTA_EXCEEDED]
    # A burst of 5x the rate (10), then 2 a second: most of 30 quick joins are throttled.
    assert len(throttled) >= 15, codes
    allowed = (ErrorCode.NONE, ErrorCode.COMPUTE_ASSIGNMENT, ErrorCode.THROTTLING_QUOTA_EXCEEDED)
    assert all(c in allowed for c in codes), codes


def test_id_and_url_length_limits(limited: Stubs) -> None:
    long_member = limited.coordinator.ConnectGroupHeartbeat(_join("m" * 21), timeout=10)
    assert long_member.error_code == ErrorCode.INVALID_REQUEST
    assert "--max-id-length" in long_member.error_message
    long_group = _put(limited, "g" * 21, "A", 1)
    assert long_group.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    long_connector = _put(limited, "g", "c" * 21, 1)
    assert long_connector.error_code == ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    with_url = _join("m" * 20)
    with_url.url = "http://" + "u" * 24
    assert limited.coordinator.ConnectGroupHeartbeat(with_url, timeout=10).error_code == (
        ErrorCode.INVALID_REQUEST
    )
    with_url.url = "http://" + "u" * 23
    assert limited.coordinator.ConnectGroupHeartbeat(with_url, timeout=10).error_code in (
        ErrorCode.NONE,
        ErrorCode.COMPUTE_ASSIGNMENT,
    )
