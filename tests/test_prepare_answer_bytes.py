"""A PrepareAssignment answer sent as bytes joined from kept entries
(`convert.prepare_response_bytes`, issue 24) parses to the message protobuf's own API builds
field by field, whatever its members, owned sets, target shares and catalogue."""

from __future__ import annotations

from connect.group.v1 import common_pb2, coordinator_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.messages import (
    Assignor,
    ConnectorInfo,
    MemberTarget,
    PreparedMemberInfo,
    PrepareResponse,
)
from connect_protocol.resources import ResourceSet, TaskId
from coordinator_svc.grpc_api import convert

names = st.sampled_from(["a", "b", "c-1", "connector-ü"])
small = st.frozensets(st.builds(TaskId, names, st.integers(0, 40)), max_size=30)
large = st.builds(
    lambda count, skip: frozenset(
        TaskId(f"big-{c}", n) for c in range(3) for n in range(count) if n % skip
    ),
    st.integers(100, 300),
    st.integers(2, 7),
)
"""Above `WIRE_CACHE_MIN_TASKS`: the kept-bytes path."""


def _set(tasks: frozenset[TaskId], by_connector: bool) -> ResourceSet:
    connectors = frozenset(c for c, _ in tasks)
    if by_connector:
        return ResourceSet.by_connector_of(connectors, sorted(tasks))
    return ResourceSet.of(connectors, tasks)


def _put(tasks: ResourceSet, out: common_pb2.ConnectorsAndTasks) -> None:
    out.connectors.extend(sorted(tasks.connectors))
    for connector, number in sorted(tasks.tasks):
        out.tasks.add(connector=connector, task=number)


members = st.lists(
    st.tuples(st.one_of(small, large), st.booleans(), st.none() | st.text(max_size=5)),
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(members, members, st.integers(0, 2**31 - 1), st.none() | st.integers(0, 2**40))
def test_the_answers_bytes_parse_to_the_message_protobuf_builds(
    owned: list[tuple[frozenset[TaskId], bool, str | None]],
    targets: list[tuple[frozenset[TaskId], bool, str | None]],
    epoch: int,
    scheduled: int | None,
) -> None:
    assignor = Assignor(name="incremental", minimum_version=1, maximum_version=2, version=1)
    answer = PrepareResponse(
        group_epoch=epoch,
        assignor_name="incremental",
        assignor_version=1,
        members=tuple(
            PreparedMemberInfo(f"m{i}", i + 1, instance, f"http://m{i}", assignor, _set(t, kept))
            for i, (t, kept, instance) in enumerate(owned)
        ),
        catalogue=(ConnectorInfo("a", 41, {"secret": "x"}), ConnectorInfo("b", 3, {})),
        assignment_epoch=epoch // 2,
        target=tuple(
            MemberTarget(f"t{i}", _set(t, kept), version=i, metadata=b"md")
            for i, (t, kept, _instance) in enumerate(targets)
        ),
        assignor_state=b"state",
        group_configs={"session.timeout.ms": "45000"},
        coordinator_time_ms=123,
        scheduled_rebalance_at_ms=scheduled,
    )
    expected = coordinator_pb2.ConnectGroupPrepareAssignmentResponse(
        group_epoch=epoch,
        assignor_name="incremental",
        assignor_version=1,
        assignment_epoch=epoch // 2,
        assignor_state=b"state",
        coordinator_time_ms=123,
    )
    for m in answer.members:
        pm = expected.members.add(
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            url=m.url,
            last_grant_at_ms=0,
        )
        pm.assignor.name, pm.assignor.minimum_version = "incremental", 1
        pm.assignor.maximum_version, pm.assignor.version = 2, 1
        if m.instance_id is not None:
            pm.instance_id = m.instance_id
        pm.connectors_and_tasks.SetInParent()  # always present, empty when it owns nothing
        _put(m.owned, pm.connectors_and_tasks)
    expected.catalogue.add(name="a", task_count=41)  # never a config
    expected.catalogue.add(name="b", task_count=3)
    for t in answer.target:
        entry = expected.target_assignment.add(member_id=t.member_id, version=t.version)
        entry.metadata = b"md"
        entry.connectors_and_tasks.SetInParent()
        _put(t.resources, entry.connectors_and_tasks)
    expected.group_configs["session.timeout.ms"] = "45000"
    if scheduled is not None:
        expected.scheduled_rebalance_at_ms = scheduled
    parsed = convert.prepare_response(answer)
    assert parsed == expected
    for got in (*parsed.members, *parsed.target_assignment):
        assert got.HasField("connectors_and_tasks")
    data = convert.prepare_response_bytes(answer)
    assert len(data) == expected.ByteSize()
