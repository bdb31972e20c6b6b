"""The wire's per-task entry bytes (connect_protocol/wire_entries.py) are exactly what protobuf
writes for the same entries, and the entries kept are bounded."""

from __future__ import annotations

from connect.group.v1 import admin_pb2, common_pb2, coordinator_pb2
from hypothesis import given
from hypothesis import strategies as st

from connect_protocol import wire, wire_entries
from connect_protocol.errors import ErrorCode
from connect_protocol.messages import AssignmentMessage, HeartbeatResponse
from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from connect_protocol.tokens import FencingTokens

names = st.text(min_size=1, max_size=40)
numbers = st.integers(min_value=0, max_value=2**31 - 1)
tasks = st.sets(st.builds(TaskId, names, numbers), max_size=60)
tokens = st.integers(min_value=0, max_value=2**63 - 1)


@given(st.sets(names, max_size=5), tasks)
def test_a_set_encodes_to_protobufs_own_bytes(connectors: set[str], task_set: set[TaskId]) -> None:
    share = ResourceSet.of(connectors, task_set)
    by_protobuf = common_pb2.ConnectorsAndTasks(connectors=sorted(connectors))
    for connector, number in sorted(task_set):
        by_protobuf.tasks.add(connector=connector, task=number)
    ours = wire.resources_to(share)
    assert ours.SerializeToString() == by_protobuf.SerializeToString()
    assert wire.resources_bytes(share) == by_protobuf.SerializeToString(deterministic=True)
    assert wire._decode(ours) == share


large_tasks = st.builds(
    lambda per_connector, skip: {
        TaskId(f"c{c}", n)
        for c, count in enumerate(per_connector)
        for n in range(count)
        if n % skip
    },
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=4),
    st.integers(min_value=2, max_value=9),
)
"""Sets of up to 1,200 tasks in gapped runs: above `WIRE_CACHE_MIN_TASKS` and
`BY_CONNECTOR_FROM` too, so they take the kept-bytes path."""


@given(
    st.one_of(tasks, large_tasks),
    st.one_of(st.none(), tokens),
    st.booleans(),
    st.integers(min_value=-5, max_value=2**31 - 1),
)
def test_a_heartbeat_answers_bytes_parse_to_the_message_protobuf_builds(
    task_set: set[TaskId], grant: int | None, by_connector: bool, epoch: int
) -> None:
    """`heartbeat_response_bytes` (the answer as sent, joined from kept entries) parses to the
    message built field by field through protobuf's API."""
    connectors = {c for c, _ in task_set}
    share = (
        ResourceSet.by_connector_of(frozenset(connectors), sorted(task_set))
        if by_connector
        else ResourceSet.of(connectors, task_set)
    )
    if grant is None:
        held = FencingTokens({t: i for i, t in enumerate(sorted(task_set))} | {"x": 3})
    else:
        held = FencingTokens.granted(share, grant)
    answer = HeartbeatResponse(
        error_code=ErrorCode.NONE,
        member_epoch=epoch,
        heartbeat_interval_ms=500,
        session_timeout_ms=10_000,
        assignment=AssignmentMessage(share, version=1, metadata=b"m", tokens=held),
        lifecycle_revision=7,
    )
    expected = coordinator_pb2.ConnectGroupHeartbeatResponse(
        member_epoch=epoch, heartbeat_interval_ms=500, session_timeout_ms=10_000
    )
    expected.lifecycle_revision = 7
    expected.assignment.version = 1
    expected.assignment.metadata = b"m"
    expected.assignment.connectors_and_tasks.connectors.extend(sorted(connectors))
    for connector, number in sorted(task_set):
        expected.assignment.connectors_and_tasks.tasks.add(connector=connector, task=number)
    expected.assignment.connectors_and_tasks.SetInParent()
    for connector, token in held.connectors():
        expected.assignment.fencing_tokens.add(connector=connector, token=token)
    for (connector, number), token in sorted(
        (key, token) for key, token in held.items() if isinstance(key, TaskId)
    ):
        expected.assignment.fencing_tokens.add(connector=connector, task=number, token=token)
    parsed = coordinator_pb2.ConnectGroupHeartbeatResponse.FromString(
        wire.heartbeat_response_bytes(answer)
    )
    assert parsed == expected
    assert parsed.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    )
    assert wire.heartbeat_response_to_wire(answer) == expected


def test_an_answer_without_an_assignment_has_none() -> None:
    answer = HeartbeatResponse(error_code=ErrorCode.FENCED_MEMBER_EPOCH, error_message="old")
    parsed = wire.heartbeat_response_to_wire(answer)
    assert not parsed.HasField("assignment")
    assert (parsed.error_code, parsed.error_message) == (ErrorCode.FENCED_MEMBER_EPOCH, "old")
    empty = wire.heartbeat_response_to_wire(HeartbeatResponse(assignment=AssignmentMessage(EMPTY)))
    assert empty.HasField("assignment") and empty.assignment.HasField("connectors_and_tasks")


@given(
    st.dictionaries(names, tokens, max_size=4),
    st.dictionaries(st.builds(TaskId, names, numbers), tokens, max_size=40),
)
def test_tokens_encode_to_protobufs_own_bytes(
    by_connector: dict[str, int], by_task: dict[TaskId, int]
) -> None:
    value = FencingTokens({**by_connector, **by_task})
    for parent, fresh in (
        (coordinator_pb2.Assignment(), coordinator_pb2.Assignment()),
        (admin_pb2.DescribedMember(), admin_pb2.DescribedMember()),
    ):
        for connector, token in sorted(by_connector.items()):
            parent.fencing_tokens.add(connector=connector, token=token)
        for (connector, number), token in sorted(by_task.items()):
            parent.fencing_tokens.add(connector=connector, task=number, token=token)
        wire.tokens_to(value, fresh)
        assert fresh.SerializeToString() == parent.SerializeToString()
        assert wire.tokens_from(fresh.fencing_tokens) == value


@given(st.sets(names, max_size=3), tasks, tokens)
def test_one_grants_tokens_encode_to_protobufs_own_bytes(
    connectors: set[str], task_set: set[TaskId], token: int
) -> None:
    """A grant's tokens (one token for every task of a connector) are written from the task
    numbers alone: the same bytes."""
    value = FencingTokens.granted(ResourceSet.of(connectors, task_set), token)
    parent, fresh = coordinator_pb2.Assignment(), coordinator_pb2.Assignment()
    for connector in sorted(connectors):
        parent.fencing_tokens.add(connector=connector, token=token)
    for connector, number in sorted(task_set):
        parent.fencing_tokens.add(connector=connector, task=number, token=token)
    wire.tokens_to(value, fresh)
    assert fresh.SerializeToString() == parent.SerializeToString()
    assert wire.tokens_from(fresh.fencing_tokens) == value


def test_a_task_number_of_zero_is_present_in_a_token_and_absent_in_a_task() -> None:
    msg = coordinator_pb2.Assignment()
    wire.tokens_to(FencingTokens({TaskId("a", 0): 3}), msg)
    assert msg.fencing_tokens[0].HasField("task") and msg.fencing_tokens[0].task == 0
    plain = common_pb2.ConnectorsAndTasks()
    plain.MergeFromString(wire._serialized(ResourceSet.of((), [("a", 0)])))
    assert plain.SerializeToString() == b"\x12\x03\x0a\x01a"


def test_the_entries_kept_are_bounded() -> None:
    entries = wire_entries._Entries(wire_entries._task_entries, max_entries=100)
    for i in range(10):
        batch = [TaskId(f"c{i}", n) for n in range(30)]
        joined = entries.join(batch)
        again = entries.join(batch)
        assert joined == again
        assert len(entries._bytes) <= 100
    assert entries.built == 300


def test_entries_are_built_once_per_task() -> None:
    entries = wire_entries._Entries(wire_entries._task_entries)
    batch = [TaskId("once", n) for n in range(50)]
    entries.join(batch)
    entries.join(batch[::-1])
    entries.join(batch[:10])
    assert entries.built == 50


@given(st.lists(names, max_size=5), st.lists(st.builds(TaskId, names, numbers), max_size=60))
def test_a_sets_bytes_are_read_as_protobuf_reads_them(
    connectors: list[str], listed: list[TaskId]
) -> None:
    msg = common_pb2.ConnectorsAndTasks(connectors=connectors)
    for connector, number in listed:
        msg.tasks.add(connector=connector, task=number)
    data = msg.SerializeToString(deterministic=True)
    wire_entries.task_of_entry.clear()
    for _ in range(2):  # read, then looked up
        split = wire_entries.split_resources(data)
        assert split is not None
        assert split == (connectors, [TaskId(t.connector, t.task) for t in msg.tasks])


def test_bytes_it_does_not_read_are_left_to_protobuf() -> None:
    msg = common_pb2.ConnectorsAndTasks(connectors=["c"])
    msg.tasks.add(connector="c", task=1)
    data = msg.SerializeToString()
    assert wire_entries.split_resources(data + b"\x18\x01") is None  # an unknown field 3
    assert wire_entries.split_resources(data[:-1]) is None  # cut short
    negative = common_pb2.ConnectorsAndTasks()
    negative.tasks.add(connector="c", task=-5)
    split = wire_entries.split_resources(negative.SerializeToString())
    assert split == ([], [TaskId("c", -5)])
    share = ResourceSet.of(["c"], [("c", n) for n in range(wire.WIRE_CACHE_MIN_TASKS)])
    extra = wire.resources_to(share)
    extra_bytes = extra.SerializeToString() + b"\x18\x01"
    assert wire.resources_from(common_pb2.ConnectorsAndTasks.FromString(extra_bytes)) == share


@given(st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1))
def test_a_varint_is_what_protobuf_writes(value: int) -> None:
    msg = common_pb2.FencingToken(connector="c", token=value)
    data = msg.SerializeToString()
    assert data.endswith(b"\x18" + wire_entries._varint(value)) or value == 0


def test_tokens_read_like_a_dict_whatever_the_key() -> None:
    tokens = FencingTokens({TaskId("a", 1): 3, "a": 2})
    for key, expected in (((), None), (("a",), None), (("a", 1, 2), None), (5, None)):
        assert tokens.get(key) is expected  # type: ignore[arg-type]
        assert key not in tokens
    assert tokens.get(TaskId("a", 1)) == 3 and tokens.get("a") == 2
