"""Every request is validated once on its way through the server: the core's
`validate_request`, before the group is taken; the handler is told so and does not repeat it.
Counted with a profiler hook over real servicers, a real GroupManager and PostgreSQL."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2

from coordinator_svc.core.acls import ANONYMOUS
from coordinator_svc.core.model import GroupConfigDefaults
from coordinator_svc.grpc_api.context import PoolContext
from coordinator_svc.grpc_api.servicers import AdminServicer, CoordinatorServicer
from coordinator_svc.runtime.groups import GroupManager
from coordinator_svc.store import SqlStore

VALIDATORS = {
    "validate_request",
    "validate_heartbeat",
    "validate_prepare",
    "validate_install",
    "validate_put_connector",
    "validate_delete_connector",
    "validate_alter_configs",
}


@pytest.fixture
def servicers(database_url: str) -> Iterator[tuple[CoordinatorServicer, AdminServicer]]:
    store = SqlStore(database_url, owner_id="once", advertised_address="127.0.0.1:1")
    store.migrate()
    manager = GroupManager(store, GroupConfigDefaults())
    try:
        yield CoordinatorServicer(manager), AdminServicer(manager)
    finally:
        manager.stop()
        store.close()


def validator_calls(call: Callable[[], Any]) -> tuple[Any, Counter[str]]:
    calls: Counter[str] = Counter()

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in VALIDATORS:
            calls[frame.f_code.co_name] += 1

    sys.setprofile(hook)
    try:
        out = call()
    finally:
        sys.setprofile(None)
    return out, calls


def test_each_request_is_validated_once(
    servicers: tuple[CoordinatorServicer, AdminServicer],
) -> None:
    coordinator, admin = servicers
    context = PoolContext("ipv4:127.0.0.1:1", ANONYMOUS)
    put, calls = validator_calls(
        lambda: admin.PutConnector(
            admin_pb2.PutConnectorRequest(group_id="g", connector="c", task_count=2), context
        )
    )
    assert put.error_code == 0, put.error_message
    assert calls == {"validate_request": 1, "validate_put_connector": 1}
    join = coordinator_pb2.ConnectGroupHeartbeatRequest(
        group_id="g", member_id="w1", member_epoch=0, rebalance_timeout_ms=1000
    )
    join.client_assignors.assignors.add(
        name="sessioned", minimum_version=1, maximum_version=1, version=1
    )
    join.connectors_and_tasks.SetInParent()
    joined, calls = validator_calls(lambda: coordinator.ConnectGroupHeartbeat(join, context))
    assert joined.error_code in (0, 10001), joined.error_message  # NONE or COMPUTE_ASSIGNMENT
    assert calls == {"validate_request": 1, "validate_heartbeat": 1}
    bad = coordinator_pb2.ConnectGroupHeartbeatRequest(group_id="g", member_id="", member_epoch=5)
    refused, calls = validator_calls(lambda: coordinator.ConnectGroupHeartbeat(bad, context))
    assert refused.error_code == 42  # INVALID_REQUEST
    assert calls == {"validate_request": 1, "validate_heartbeat": 1}
