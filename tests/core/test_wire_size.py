"""A catalogue too large for the configured message size is refused when it is put (issue 10):
the estimate is an upper bound of the real PrepareAssignment answer, and the refusal names the
limit and changes nothing."""

from __future__ import annotations

import dataclasses
import json

from connect_protocol.errors import ErrorCode
from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.core.wire_size import prepare_bytes
from coordinator_svc.grpc_api import convert
from tests.core.harness import DEFAULTS, GroupHarness

NAME = "c" * 40  # connector names of 40 characters


def test_the_estimate_bounds_the_real_prepare_answer_from_above() -> None:
    """Worst case: every task in an owned list, in the target, and held in the state blob."""
    h = GroupHarness()
    for c in range(6):
        h.put_connector(f"{NAME}{c}", 50, {"topic": "orders", "password": "x" * 30})
    members = [f"worker-{i:03d}" for i in range(8)]
    for m in members:
        h.join(m, instance_id=f"instance-{m}", url=f"http://{m}.example:8083")
    assert h.state is not None
    resources = sorted(h.state.catalogue_resources().tasks)
    shares = {m: ResourceSet.of([], resources[i :: len(members)]) for i, m in enumerate(members)}
    connectors = sorted(h.state.catalogue)
    for i, name in enumerate(connectors):
        m = members[i % len(members)]
        shares[m] = shares[m] | ResourceSet.of([name])
    held = [
        {
            "member_id": "gone",
            "instance_id": None,
            "resources": ResourceSet.of(connectors, resources).to_json(),
        }
    ]
    blob = json.dumps({"version": 1, "deadline_ms": 1, "held": held, "instances": {}}).encode()
    assignor = h.state.meta.assignor_member_id
    assert assignor is not None
    h.heartbeat(assignor, h.member(assignor).member_epoch)
    h.compute(assignor, shares, assignor_state=blob)
    for m in members:
        h.ack(m)
    prepared = h.prepare(assignor)
    assert prepared.error_code is ErrorCode.NONE

    real = convert.prepare_response(prepared).ByteSize()
    estimate = prepare_bytes(h.state.catalogue_wire_bytes, len(h.state.members))

    print(f"prepare answer {real} bytes, estimate {estimate}")
    assert real <= estimate < 2 * real + 8_192, (real, estimate)


def test_a_connector_that_would_overflow_the_prepare_answer_is_refused_naming_the_limit() -> None:
    h = GroupHarness(defaults=dataclasses.replace(DEFAULTS, max_message_bytes=200_000))
    assert h.put_connector(f"{NAME}-small", 100).error_code is ErrorCode.NONE
    h.join("w1")
    before = h.dump()

    refused = h.put_connector(f"{NAME}-huge", 5_000)

    assert refused.error_code is ErrorCode.INVALID_REQUEST
    assert "maximum message size of 200,000 bytes (--max-message-bytes)" in refused.error_message
    assert h.records_of_last_call == []
    assert h.dump() == before
    # Shrinking a connector, or a config change that adds nothing, is never refused.
    assert h.put_connector(f"{NAME}-small", 10).error_code is ErrorCode.NONE
    assert (
        h.state is not None
        and TaskId(f"{NAME}-small", 50) not in h.state.catalogue_resources().tasks
    )


def test_the_catalogue_size_is_kept_as_connectors_change() -> None:
    h = GroupHarness()
    h.put_connector("A", 10, {"k": "v"})
    h.put_connector("B", 3)
    h.put_connector("A", 20)
    h.delete_connector("B")
    assert h.state is not None
    rebuilt = sum(c.wire_bytes() for c in h.state.catalogue.values())
    assert h.state.catalogue_wire_bytes == rebuilt > 0
