"""The eager assignor, the protocol lists, and the incremental assignor's state blob."""

from __future__ import annotations

import pytest

from connect_protocol.resources import EMPTY
from tests.core.harness import EAGER, GroupHarness
from tests.worker_agent_assignors.test_assignors_support import (
    Coordinated,
    assert_installable,
    rs,
    view,
)
from worker_agent.assignor import MemberView
from worker_agent.assignors import (
    EagerAssignor,
    IncrementalCooperativeAssignor,
    assignors_for_protocol,
)
from worker_agent.assignors.state import (
    AssignorState,
    HeldShare,
    decode_state,
    encode_state,
)

# --- eager ------------------------------------------------------------------------------------


def test_eager_deals_connectors_then_tasks_round_robin_continuing_the_rotation() -> None:
    # Connectors A, B, C go to w1, w2, w3; the tasks continue with w1: A-0 w1, A-1 w2,
    # B-0 w3, C-0 w1, C-1 w2, C-2 w3 (KAFKA's EagerAssignor: one CircularIterator for both).
    group = view({"C": 3, "A": 2, "B": 1}, ["w3", "w1", "w2"])

    result = EagerAssignor().assign(group)

    assert result.members == {
        "w1": rs("A", "A-0", "C-0"),
        "w2": rs("B", "A-1", "C-1"),
        "w3": rs("C", "B-0", "C-2"),
    }
    assert (result.assignor_state, result.scheduled_rebalance_delay_ms) == (b"", 0)
    assert_installable(group, result)


def test_eager_continues_the_rotation_where_the_connectors_stopped() -> None:
    # Two connectors over three members: the first task goes to the third member, not the first.
    group = view({"A": 2, "B": 1}, ["w1", "w2", "w3"])

    result = EagerAssignor().assign(group)

    assert result.members == {
        "w1": rs("A", "A-1"),
        "w2": rs("B", "B-0"),
        "w3": rs("A-0"),
    }


def test_eager_orders_tasks_by_number_not_by_text() -> None:
    group = view({"A": 11}, ["w1", "w2"])

    result = EagerAssignor().assign(group)

    # A -> w1, then A-0 w2, A-1 w1, ..., A-10 w2 (A-10 sorts after A-9 numerically).
    assert result.members["w2"] == rs("A-0", "A-2", "A-4", "A-6", "A-8", "A-10")
    assert result.members["w1"] == rs("A", "A-1", "A-3", "A-5", "A-7", "A-9")


def test_eager_is_not_sticky_and_gives_every_member_an_entry() -> None:
    members: list[str | MemberView] = [
        MemberView("w1", owned=rs("B", "B-0")),
        MemberView("w2", owned=rs("A")),
        "w3",
    ]
    group = view({"A": 1, "B": 1}, members, target={"w1": rs("B", "B-0"), "w2": rs("A")})

    result = EagerAssignor().assign(group)

    assert result.members == {"w1": rs("A", "B-0"), "w2": rs("B"), "w3": rs("A-0")}
    assert_installable(group, result)


def test_eager_with_more_members_than_resources_leaves_some_empty() -> None:
    group = view({"A": 0}, ["w1", "w2", "w3"])

    result = EagerAssignor().assign(group)

    assert result.members == {"w1": rs("A"), "w2": EMPTY, "w3": EMPTY}


def test_eager_with_no_members_assigns_nothing() -> None:
    assert EagerAssignor().assign(view({"A": 1}, [])).members == {}


def test_eager_installs_on_a_real_group() -> None:
    h = GroupHarness()
    h.put_connector("A", 2)
    h.put_connector("B", 1)
    h.join("w2", assignors=EAGER)
    h.join("w1", assignors=EAGER)
    group, result = Coordinated(EagerAssignor(), h).compute()

    assert group.assignor_name == "eager"
    assert h.target_of("w1") == rs("A", "A-0", "B-0") == result.members["w1"]
    assert h.target_of("w2") == rs("B", "A-1") == result.members["w2"]


# --- protocols --------------------------------------------------------------------------------


def describe(protocol: str) -> list[tuple[str, int, int, int]]:
    return [
        (a.name, a.minimum_version, a.maximum_version, a.metadata().version)
        for a in assignors_for_protocol(protocol)
    ]


def test_each_protocol_advertises_its_assignors_in_order_of_preference() -> None:
    assert describe("eager") == [("eager", 0, 0, 0)]
    assert describe("compatible") == [("incremental_cooperative", 1, 1, 1), ("eager", 0, 0, 0)]
    assert describe("sessioned") == [("incremental_cooperative", 1, 2, 2), ("eager", 0, 0, 0)]


def test_an_unknown_protocol_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"'cooperative'.*eager, compatible, sessioned"):
        assignors_for_protocol("cooperative")


def test_incremental_refuses_versions_it_does_not_speak() -> None:
    with pytest.raises(ValueError, match="versions 1 to 2"):
        IncrementalCooperativeAssignor(maximum_version=3)
    with pytest.raises(ValueError, match="versions 1 to 2"):
        IncrementalCooperativeAssignor(maximum_version=0)


# --- the state blob ---------------------------------------------------------------------------


def test_the_state_blob_round_trips_and_is_deterministic() -> None:
    state = AssignorState(
        deadline_ms=1234,
        held=(HeldShare("w2", "i2", rs("B", "A-1")), HeldShare("w1", None, rs("C-0"))),
        instances={"w3": "i3"},
    )

    blob = encode_state(state)

    assert blob == encode_state(AssignorState(1234, tuple(reversed(state.held)), {"w3": "i3"}))
    decoded = decode_state(blob)
    assert decoded.deadline_ms == 1234
    assert decoded.held == (HeldShare("w1", None, rs("C-0")), HeldShare("w2", "i2", rs("B", "A-1")))
    assert dict(decoded.instances) == {"w3": "i3"}
    assert decoded.held_resources() == rs("B", "A-1", "C-0")


def test_the_state_blob_is_versioned_json() -> None:
    blob = encode_state(AssignorState(deadline_ms=5, held=(HeldShare("w", None, rs("A")),)))

    assert blob == (
        b'{"deadline_ms":5,"held":[{"instance_id":null,"member_id":"w","resources":'
        b'{"connectors":["A"],"tasks":[]}}],"instances":{},"version":1}'
    )


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\xff\xfe",
        b"not json",
        b"[]",
        b'{"version": 2, "deadline_ms": 5, "held": []}',
        b'{"deadline_ms": 5, "held": []}',
        b'{"version": 1, "deadline_ms": "soon"}',
        b'{"version": 1, "held": [{"member_id": 7, "resources": {}}]}',
        b'{"version": 1, "held": [{"member_id": "w", "resources": []}]}',
        b'{"version": 1, "held": [{"member_id": "w", "resources": {"tasks": [{"task": 1}]}}]}',
        b'{"version": 1, "held": [{"member_id": "w", "resources": {"tasks": [{"connector": "A",'
        b' "task": "x"}]}}]}',
        b'{"version": 1, "held": 5}',
        b'{"version": 1, "instances": {"w": 1}}',
    ],
)
def test_an_empty_or_undecodable_blob_is_no_state(blob: bytes) -> None:
    assert decode_state(blob) == AssignorState()
