"""Issue 12: a body that is not a valid protobuf message of its RPC is refused with
INVALID_ARGUMENT naming the expected message, counted in a metric, logged at most once a minute
per RPC and never with a traceback (gRPC's own decoding answered UNKNOWN with the parser's text
and logged a traceback per request). A real server on 127.0.0.1."""

from __future__ import annotations

import logging

import grpc
import pytest
from connect.group.v1 import admin_pb2, coordinator_pb2

from tests.support.client import ScriptedWorker, put_connector
from tests.support.coordinator import InProcessCoordinator

GARBAGE = b"\xff\xff\xff\x07garbage"
RPCS = [
    *(
        f"/connect.group.v1.ConnectGroupCoordinator/{m.name}"
        for m in coordinator_pb2.DESCRIPTOR.services_by_name["ConnectGroupCoordinator"].methods
    ),
    *(
        f"/connect.group.v1.ConnectGroupAdmin/{m.name}"
        for m in admin_pb2.DESCRIPTOR.services_by_name["ConnectGroupAdmin"].methods
    ),
]


def test_undecodable_bodies_are_refused_cleanly_on_every_rpc(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert len(RPCS) == 22  # the coordinator's 5 and the admin service's 17
    with InProcessCoordinator(database_url) as coord:
        assert coord.stubs is not None
        assert put_connector(coord.stubs, "g", "orders", 1).error_code == 0
        healthy = ScriptedWorker(coord.stubs, "g", "healthy")
        assert healthy.join().error_code in (0, 10001)
        channel = coord.stubs.channel
        for rpc in RPCS:
            raw = channel.unary_unary(rpc)  # bytes in, bytes out
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as refused:
                    raw(GARBAGE, timeout=5)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, rpc
                assert "the request body is not a valid connect.group.v1." in (
                    refused.value.details() or ""
                )
            assert healthy.heartbeat().error_code in (0, 10001)  # the group is unharmed
        counts = {
            s.labels["rpc"]: s.value
            for metric in coord.manager.metrics.registry.collect()
            if metric.name == "coordinator_undecodable_requests"
            for s in metric.samples
            if s.name.endswith("_total")
        }
    assert counts == {rpc.rsplit("/", 1)[1]: 3.0 for rpc in RPCS}
    lines = [r for r in caplog.records if "undecodable request" in r.getMessage()]
    assert len(lines) == len(RPCS)  # one per RPC, not one per request
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
