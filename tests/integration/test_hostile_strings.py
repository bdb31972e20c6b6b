"""Issue 12, "one bad request takes a whole group offline": a NUL character (which PostgreSQL
refuses in text and JSON) or an overlong string in any field is INVALID_REQUEST naming the
field, decided before anything is written; it never fails a commit, so the group's other
members go on being served at once. Real coordinator (gRPC on 127.0.0.1), real PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from connect.group.v1 import admin_pb2, coordinator_pb2

from tests.support.client import ScriptedWorker, put_connector
from tests.support.coordinator import InProcessCoordinator, Stubs

GROUP = "hostile"
INVALID_REQUEST = 42
NUL = "\x00"


@pytest.fixture
def served(database_url: str) -> Iterator[tuple[Stubs, ScriptedWorker]]:
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        assert put_connector(coord.stubs, GROUP, "orders", 2).error_code == 0
        healthy = ScriptedWorker(coord.stubs, GROUP, "healthy")
        assert healthy.join().error_code in (0, 10001)
        yield coord.stubs, healthy


def _join(**fields: Any) -> coordinator_pb2.ConnectGroupHeartbeatRequest:
    req = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id=GROUP, member_id="w-bad", member_epoch=0, rebalance_timeout_ms=5_000
    )
    req.client_assignors.assignors.add(
        name="incremental_cooperative", minimum_version=1, maximum_version=1, version=1
    )
    req.connectors_and_tasks.SetInParent()
    for name, value in fields.items():
        setattr(req, name, value)
    return req


def _heartbeat(stubs: Stubs, req: coordinator_pb2.ConnectGroupHeartbeatRequest) -> Any:
    return stubs.coordinator.ConnectGroupHeartbeat(req, timeout=10)


def _put(stubs: Stubs, connector: str, config: dict[str, str]) -> Any:
    return stubs.admin.PutConnector(
        admin_pb2.PutConnectorRequest(
            group_id=GROUP, connector=connector, task_count=1, config=config
        ),
        timeout=10,
    )


def _assignor_name(stubs: Stubs) -> Any:
    req = _join()
    req.client_assignors.assignors[0].name = f"evil{NUL}"
    return _heartbeat(stubs, req)


def _owned_connector(stubs: Stubs) -> Any:
    req = _join()
    req.connectors_and_tasks.connectors.append(f"orders{NUL}")
    return _heartbeat(stubs, req)


CASES: dict[str, tuple[Callable[[Stubs], Any], str]] = {
    "member id": (lambda s: _heartbeat(s, _join(member_id=f"w{NUL}1")), "MemberId"),
    "instance id": (lambda s: _heartbeat(s, _join(instance_id=f"i{NUL}")), "InstanceId"),
    "instance id, 20,000 characters": (
        lambda s: _heartbeat(s, _join(instance_id="i" * 20_000)),
        "InstanceId",
    ),
    "url": (lambda s: _heartbeat(s, _join(url=f"http://x{NUL}")), "Url"),
    "url, 20,000 characters": (lambda s: _heartbeat(s, _join(url="u" * 20_000)), "Url"),
    "assignor name": (_assignor_name, "Assignor.Name"),
    "owned connector": (_owned_connector, "connector name"),
    "connector name": (lambda s: _put(s, f"c{NUL}", {}), "Connector"),
    "config key": (lambda s: _put(s, "c1", {f"k{NUL}": "v"}), "Config keys"),
    "config value": (lambda s: _put(s, "c1", {"password": f"p{NUL}"}), "Config['password']"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_string_is_invalid_request_and_the_group_keeps_serving(
    served: tuple[Stubs, ScriptedWorker], case: str
) -> None:
    stubs, healthy = served
    call, field = CASES[case]
    answer = call(stubs)
    assert answer.error_code == INVALID_REQUEST, answer
    assert field in answer.error_message, answer.error_message
    assert "SQL" not in answer.error_message and "Traceback" not in answer.error_message
    # The group's owner kept it: its healthy member is served at once, no retry needed.
    assert healthy.heartbeat().error_code in (0, 10001), healthy.last


@pytest.mark.parametrize("rpc", ["DescribeGroups", "FindCoordinator"])
def test_a_group_id_with_nul_on_read_only_calls_is_invalid_request(
    served: tuple[Stubs, ScriptedWorker], rpc: str
) -> None:
    stubs, _healthy = served
    if rpc == "DescribeGroups":
        answer = stubs.admin.DescribeGroups(
            admin_pb2.DescribeGroupsRequest(group_ids=[f"g{NUL}"]), timeout=10
        ).groups[0]
    else:
        answer = stubs.admin.FindCoordinator(
            admin_pb2.FindCoordinatorRequest(group_id=f"g{NUL}"), timeout=10
        )
    assert answer.error_code == INVALID_REQUEST, answer
    assert "GroupId" in answer.error_message


def test_read_only_calls_on_unknown_groups_leave_no_rows(
    served: tuple[Stubs, ScriptedWorker], database_url: str
) -> None:
    """Issue 12: 10,000 Describe/FindCoordinator calls on groups that do not exist left 10,000
    group_leases rows behind. Now each such lease row is deleted with the call."""
    stubs, _healthy = served
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            before = conn.execute(sa.text("SELECT count(*) FROM group_leases")).scalar_one()
        for i in range(25):
            group = stubs.admin.DescribeGroups(
                admin_pb2.DescribeGroupsRequest(group_ids=[f"nobody-{i}"]), timeout=10
            ).groups[0]
            assert group.error_code == 69  # GROUP_ID_NOT_FOUND
            found = stubs.admin.FindCoordinator(
                admin_pb2.FindCoordinatorRequest(group_id=f"nobody-else-{i}"), timeout=10
            )
            assert found.error_code == 0 and found.port > 0
        with engine.connect() as conn:
            after = conn.execute(sa.text("SELECT count(*) FROM group_leases")).scalar_one()
            groups = conn.execute(sa.text("SELECT count(*) FROM groups")).scalar_one()
    finally:
        engine.dispose()
    assert after == before == 1  # the one real group's lease, nothing more
    assert groups == 1


def test_a_refused_join_does_not_learn_the_other_members_ids(
    served: tuple[Stubs, ScriptedWorker],
) -> None:
    """Issue 12: UNSUPPORTED_ASSIGNOR listed every member id to whoever tried to join; the
    joining member now gets the rule, and only DescribeGroups (an operator's call) the list."""
    stubs, healthy = served
    req = _join()
    req.client_assignors.assignors[0].name = "something-else"
    answer = _heartbeat(stubs, req)
    assert answer.error_code == 112, answer  # UNSUPPORTED_ASSIGNOR
    assert "no client assignor is supported by every member" in answer.error_message
    assert healthy.member_id not in answer.error_message
