"""The eager port (worker_agent.classic.eager) against Connect's `WorkerCoordinatorTest`
(apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99, connect/runtime/src/test/java/
org/apache/kafka/connect/runtime/distributed/WorkerCoordinatorTest.java), whose
testLeaderPerformAssignment* tests run `EagerAssignor` through `onLeaderElected` under the EAGER
protocol, and a closed loop in which every member revokes everything before each round.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from worker_agent.classic.eager import eager_assignment
from worker_agent.classic.values import (
    CONNECT_PROTOCOL_V0,
    NO_ERROR,
    WorkerState,
    configured_resources,
)

from .support import held_counts

LEADER_URL = "leaderUrl:8083"
MEMBER_URL = "memberUrl:8083"
MEMBERS = {"leader": WorkerState(LEADER_URL), "member": WorkerState(MEMBER_URL)}


def _sets(catalogue: dict[str, int]) -> dict[str, ResourceSet]:
    answers = eager_assignment("leader", MEMBERS, catalogue)
    for a in answers.values():
        assert (a.version, a.error, a.leader, a.leader_url) == (
            CONNECT_PROTOCOL_V0,
            NO_ERROR,
            "leader",
            LEADER_URL,
        )
        assert a.revoked is None and a.delay == 0
    return {m: a.assignment for m, a in answers.items()}


def test_leader_perform_assignment_1() -> None:
    """testLeaderPerformAssignment1: one connector with one task: the connector to the first
    member, its task to the second."""
    assert _sets({"connector1": 1}) == {
        "leader": ResourceSet.of(["connector1"]),
        "member": ResourceSet.of((), [TaskId("connector1", 0)]),
    }


def test_leader_perform_assignment_2() -> None:
    """testLeaderPerformAssignment2: connectors then tasks, one rotation over both."""
    assert _sets({"connector1": 2, "connector2": 1}) == {
        "leader": ResourceSet.of(
            ["connector1"], [TaskId("connector1", 0), TaskId("connector2", 0)]
        ),
        "member": ResourceSet.of(["connector2"], [TaskId("connector1", 1)]),
    }


def test_leader_perform_assignment_single_task_connectors() -> None:
    """testLeaderPerformAssignmentSingleTaskConnectors: with one-task connectors the rotation
    carries on from connectors into tasks, so work spreads evenly."""
    assert _sets({"connector1": 1, "connector2": 1, "connector3": 1}) == {
        "leader": ResourceSet.of(["connector1", "connector3"], [TaskId("connector2", 0)]),
        "member": ResourceSet.of(
            ["connector2"], [TaskId("connector1", 0), TaskId("connector3", 0)]
        ),
    }


def test_members_are_dealt_in_id_order_whatever_they_run() -> None:
    """EagerAssignor sorts the member ids and ignores what members report running."""
    members = {
        "b": WorkerState("b", ResourceSet.of(["connector1"])),
        "a": WorkerState("a"),
        "c": WorkerState("c"),
    }
    answers = eager_assignment("b", members, {"connector1": 2, "connector2": 0})
    assert answers["a"].assignment == ResourceSet.of(["connector1"], [TaskId("connector1", 1)])
    assert answers["b"].assignment == ResourceSet.of(["connector2"])
    assert answers["c"].assignment == ResourceSet.of((), [TaskId("connector1", 0)])
    assert {a.leader_url for a in answers.values()} == {"b"}


def test_the_leader_must_be_a_member() -> None:
    with pytest.raises(ValueError, match="not a member"):
        eager_assignment("x", MEMBERS, {})


@settings(max_examples=60, deadline=None)
@given(
    catalogue=st.dictionaries(st.sampled_from("ABCDEFG"), st.integers(0, 6), max_size=7),
    rounds=st.lists(st.sets(st.sampled_from("pqrstu"), min_size=1), min_size=1, max_size=5),
)
def test_closed_loop_every_round_places_everything_once_and_evenly(
    catalogue: dict[str, int], rounds: list[set[str]]
) -> None:
    """Closed loop: before each round every member revokes all (Connect's eager
    `onJoinPrepare`); each round the catalogue is placed exactly once, connectors and tasks
    together spread within one of each other across members."""
    running: dict[str, ResourceSet] = {}
    for members in rounds:
        running = {m: EMPTY for m in members}  # everyone revoked everything first
        answers = eager_assignment(
            min(members), {m: WorkerState(m, running[m]) for m in members}, catalogue
        )
        for m, a in answers.items():
            running[m] = running[m] | a.assignment
        counts = held_counts(running.values())
        configured = configured_resources(catalogue)
        assert set(counts) == set(configured.connectors) | set(configured.tasks)
        assert all(n == 1 for n in counts.values())
        sizes = [len(s) for s in running.values()]
        assert max(sizes) - min(sizes) <= 1
