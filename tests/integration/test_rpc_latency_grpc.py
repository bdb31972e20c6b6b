"""Issue 24 item 6: the coordinator's own time per call, by RPC (coordinator_rpc_latency_seconds
{rpc}), observed once per call where it is served (`grpc_api.aio`): every method the two services
register, the steady heartbeat answered on the event loop included, refused calls included. The
heartbeat series is also exported under its older name, coordinator_heartbeat_latency_seconds,
which the dashboard and alerts read. A real server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2
from prometheus_client import CollectorRegistry

from coordinator_svc.grpc_api.servicers import CoordinatorServicer
from coordinator_svc.metrics import RPC_LATENCY_BUCKETS
from tests.support.client import ScriptedWorker, describe, put_connector
from tests.support.coordinator import InProcessCoordinator

GROUP = "latency"
METHODS = {
    m.name
    for service, name in (
        (coordinator_pb2, "ConnectGroupCoordinator"),
        (admin_pb2, "ConnectGroupAdmin"),
    )
    for m in service.DESCRIPTOR.services_by_name[name].methods
}


def _samples(registry: CollectorRegistry, family: str) -> dict[tuple[str, str, str], float]:
    """(sample name, rpc label, le label) -> value of one family."""
    return {
        (s.name, s.labels.get("rpc", ""), s.labels.get("le", "")): s.value
        for metric in registry.collect()
        if metric.name == family
        for s in metric.samples
    }


def _counts(registry: CollectorRegistry) -> dict[str, float]:
    return {
        rpc: value
        for (name, rpc, _), value in _samples(registry, "coordinator_rpc_latency_seconds").items()
        if name.endswith("_count") and value
    }


def test_every_rpc_lands_in_its_own_series(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(METHODS) == 22
    pooled: list[str] = []  # heartbeats that took the pool's (full) path
    full_path = CoordinatorServicer.heartbeat_serialized  # what the pool runs (aio.py)

    def counted(self: CoordinatorServicer, request: Any, context: Any) -> Any:
        pooled.append(request.member_id)
        return full_path(self, request, context)

    monkeypatch.setattr(CoordinatorServicer, "heartbeat_serialized", counted)
    with InProcessCoordinator(database_url) as coord:
        stubs = coord.stubs
        assert stubs is not None
        registry = coord.manager.metrics.registry
        assert put_connector(stubs, GROUP, "orders", 2).error_code == 0
        worker = ScriptedWorker(stubs, GROUP, "w1")
        assert worker.join().error_code == 10001  # COMPUTE_ASSIGNMENT
        prepared = worker.prepare()
        assert prepared.error_code == 0
        everything = (frozenset({"orders"}), frozenset({("orders", 0), ("orders", 1)}))
        assert worker.install(prepared.group_epoch, {"w1": everything}).error_code == 0
        assert worker.heartbeat().error_code == 0  # told its assignment
        assert worker.heartbeat().error_code == 0  # reports it: STABLE
        steady = 5
        for _ in range(steady):
            assert worker.heartbeat(report_owned=False).error_code == 0
        heartbeats = 3 + steady
        assert 0 < len(pooled) <= heartbeats - steady, "the steady heartbeats took the fast path"

        admin = stubs.admin
        calls: list[Callable[[], Any]] = [
            lambda: describe(stubs, GROUP),
            lambda: admin.ListGroups(admin_pb2.ListGroupsRequest(), timeout=10),
            lambda: admin.FindCoordinator(
                admin_pb2.FindCoordinatorRequest(group_id=GROUP), timeout=10
            ),
            lambda: admin.AlterGroupConfigs(
                admin_pb2.AlterGroupConfigsRequest(
                    group_id=GROUP, set={"scheduled.rebalance.max.delay.ms": "60000"}
                ),
                timeout=10,
            ),
            lambda: admin.DeleteConnector(
                admin_pb2.DeleteConnectorRequest(group_id=GROUP, connector="none"), timeout=10
            ),
            # Refused in band (ACLs are administered over gRPC only with --authorization acl):
            # a refused call is timed as any other.
            # Refused (INVALID_REQUEST: no member), timed as any other.
            lambda: stubs.coordinator.ConnectGroupConfigs(
                coordinator_pb2.ConnectGroupConfigsRequest(group_id="g"), timeout=10
            ),
            lambda: stubs.coordinator.ConnectGroupReportStatus(
                coordinator_pb2.ConnectGroupReportStatusRequest(group_id="g"), timeout=10
            ),
            lambda: admin.ListAcls(admin_pb2.ListAclsRequest(), timeout=10),
            lambda: admin.AddAcl(admin_pb2.AddAclRequest(), timeout=10),
            lambda: admin.RemoveAcl(admin_pb2.RemoveAclRequest(), timeout=10),
            lambda: admin.DescribeFeatures(admin_pb2.DescribeFeaturesRequest(), timeout=10),
            lambda: admin.UpdateFeatures(
                admin_pb2.UpdateFeaturesRequest(feature="group.version", level=1), timeout=10
            ),
            # Refused in band (INVALID_REQUEST: no such connector), timed as any other.
            lambda: admin.PauseConnector(
                admin_pb2.PauseConnectorRequest(group_id=GROUP, connector="none"), timeout=10
            ),
            lambda: admin.ResumeConnector(
                admin_pb2.ResumeConnectorRequest(group_id=GROUP, connector="none"), timeout=10
            ),
            lambda: admin.StopConnector(
                admin_pb2.StopConnectorRequest(group_id=GROUP, connector="none"), timeout=10
            ),
            lambda: admin.RestartConnector(
                admin_pb2.RestartConnectorRequest(group_id=GROUP, connector="none"), timeout=10
            ),
            # Refused in band (NON_EMPTY_GROUP, UNKNOWN_MEMBER_ID), timed as any other.
            lambda: admin.DeleteGroup(admin_pb2.DeleteGroupRequest(group_id=GROUP), timeout=10),
            lambda: admin.RemoveMember(
                admin_pb2.RemoveMemberRequest(group_id=GROUP, member_id="none"), timeout=10
            ),
        ]
        for call in calls:
            call()
        # A body that is not a message of its RPC: refused by gRPC status, timed too.
        with pytest.raises(grpc.RpcError):
            stubs.channel.unary_unary("/connect.group.v1.ConnectGroupAdmin/ListGroups")(
                b"\xff\xff\xff\x07garbage", timeout=5
            )
        # An aborted call's status reaches the client before the server's handler has
        # finished (and observed it): wait for it.
        deadline = time.monotonic() + 5
        while _counts(registry).get("ListGroups", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        counts = _counts(registry)
        samples = _samples(registry, "coordinator_rpc_latency_seconds")
        legacy = _samples(registry, "coordinator_heartbeat_latency_seconds")

    assert counts == {
        "ConnectGroupHeartbeat": heartbeats,
        "ConnectGroupPrepareAssignment": 1,
        "ConnectGroupInstallAssignment": 1,
        "ConnectGroupConfigs": 1,
        "ConnectGroupReportStatus": 1,
        "PutConnector": 1,
        "DescribeGroups": 1,
        "ListGroups": 2,
        "FindCoordinator": 1,
        "AlterGroupConfigs": 1,
        "DeleteConnector": 1,
        "ListAcls": 1,
        "AddAcl": 1,
        "RemoveAcl": 1,
        "DescribeFeatures": 1,
        "UpdateFeatures": 1,
        "PauseConnector": 1,
        "ResumeConnector": 1,
        "StopConnector": 1,
        "RestartConnector": 1,
        "DeleteGroup": 1,
        "RemoveMember": 1,
    }
    assert set(counts) == METHODS  # the label's values: method names, nothing else
    # Every series has every bucket, and its time is a plausible one.
    for rpc in METHODS:
        buckets = [samples["coordinator_rpc_latency_seconds_bucket", rpc, le] for le in _les()]
        assert buckets == sorted(buckets) and buckets[-1] == counts[rpc], rpc
        assert 0 < samples["coordinator_rpc_latency_seconds_sum", rpc, ""] < 10 * counts[rpc]
    # The older name: the heartbeat series, the same observations.
    hb = {
        (name.replace("coordinator_rpc_latency_seconds", ""), le): v
        for (name, rpc, le), v in samples.items()
        if rpc == "ConnectGroupHeartbeat" and not name.endswith("_created")
    }
    old = {
        (name.replace("coordinator_heartbeat_latency_seconds", ""), le): v
        for (name, _, le), v in legacy.items()
        if not name.endswith("_created")
    }
    assert old == hb and old["_count", ""] == heartbeats


def _les() -> list[str]:
    return [*(str(float(b)) for b in RPC_LATENCY_BUCKETS), "+Inf"]
