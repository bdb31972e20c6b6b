"""Reading a `ConnectorsAndTasks` message by connector (`connect_protocol.wire_by_connector`):
whatever the bytes, the set read equals what protobuf reads (or the reader declines and the
caller reads it another way); runs of entries seen before come back as the very
`ConnectorTasks` they were, and a run seen before that is only the start of a connector's
entries is never taken for all of them."""

from __future__ import annotations

from connect.group.v1 import common_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol import wire
from connect_protocol.resources import ResourceSet, TaskId
from connect_protocol.wire_by_connector import SeenConnectorTasks

NAMES = st.sampled_from(["a", "b", "c-1", "é", "x" * 130])
ENTRIES = st.lists(st.tuples(NAMES, st.integers(-3, 300)), max_size=60)


def _message(connectors: list[str], entries: list[tuple[str, int]]) -> bytes:
    msg = common_pb2.ConnectorsAndTasks(connectors=connectors)
    for connector, task in entries:
        msg.tasks.add(connector=connector, task=task)
    return msg.SerializeToString()


def _protobuf_set(data: bytes) -> ResourceSet:
    msg = common_pb2.ConnectorsAndTasks.FromString(data)
    return ResourceSet.of(msg.connectors, [(t.connector, t.task) for t in msg.tasks])


@settings(max_examples=300)
@given(st.lists(NAMES, max_size=3), ENTRIES, st.booleans(), ENTRIES)
def test_what_is_read_is_what_protobuf_reads(
    connectors: list[str],
    entries: list[tuple[str, int]],
    in_order: bool,
    seen: list[tuple[str, int]],
) -> None:
    reader = SeenConnectorTasks(max_tasks=1_000)
    reader.read(_message([], sorted(set(seen))))  # some runs seen before, some not
    if in_order:
        entries = sorted(set(entries))
    data = _message(connectors, entries)
    read = reader.read(data)
    expected = _protobuf_set(data)
    in_one_run_each = entries == sorted(set(entries))
    if read is None:
        assert not in_one_run_each or any(len(c.encode()) >= 128 for c, _ in entries)
        return
    assert read == expected
    assert read.ordered_tasks() == tuple(sorted(expected.tasks))
    again = reader.read(data)
    assert again is not None and again == expected
    shards = read.by_connector()
    assert all(again.by_connector()[c] is held for c, held in shards.items())


def test_a_set_written_is_read_back_as_the_same_connector_tasks() -> None:
    share = ResourceSet.by_connector_of(
        frozenset({"a"}), [TaskId(c, n) for c in ("a", "b", "c") for n in range(300)]
    )
    msg = wire.resources_to(share)  # writes each connector's entries once, remembered
    reader = wire._seen_connector_tasks
    read = reader.read(msg.SerializeToString())
    assert read == share
    assert all(read.by_connector()[c] is share.by_connector()[c] for c in ("a", "b", "c"))


def test_a_run_seen_before_that_is_only_the_start_of_a_connector_is_not_taken() -> None:
    reader = SeenConnectorTasks(max_tasks=1_000)
    half = reader.read(_message([], [("a", n) for n in range(50)]))
    assert half is not None
    whole = reader.read(_message([], [("a", n) for n in range(100)] + [("b", 1)]))
    assert whole is not None
    assert whole.by_connector()["a"] == frozenset(TaskId("a", n) for n in range(100))
    assert whole.by_connector()["a"] is not half.by_connector()["a"]
    # Both are remembered: each message finds its own.
    assert reader.read(_message([], [("a", n) for n in range(50)])) == half


def test_what_is_kept_is_bounded_by_its_tasks() -> None:
    reader = SeenConnectorTasks(max_tasks=100)
    first = reader.read(_message([], [("a", n) for n in range(80)]))
    reader.read(_message([], [("b", n) for n in range(80)]))  # over the bound: starts afresh
    again = reader.read(_message([], [("a", n) for n in range(80)]))
    assert first is not None and again == first
    assert again.by_connector()["a"] is not first.by_connector()["a"]


def test_what_was_written_last_is_what_a_message_is_read_as() -> None:
    """A connector's tasks read from a message, then the same tasks written from the
    coordinator's own set (its catalogue): a later message is read as the written object, so
    that an Install's share is checked against the catalogue in O(1) per connector."""
    reader = SeenConnectorTasks(max_tasks=1_000)
    data = _message([], [("a", n) for n in range(50)])
    first = reader.read(data)
    assert first is not None
    catalogue = ResourceSet.by_connector_of(frozenset({"a"}), [TaskId("a", n) for n in range(50)])
    held = catalogue.by_connector()["a"]
    assert held is not first.by_connector()["a"]
    assert reader.entries(held) == data
    again = reader.read(data)
    assert again is not None and again.by_connector()["a"] is held
    assert again <= catalogue
