"""Connect's `WorkerCoordinatorIncrementalTest`, whose tests run the incremental cooperative
assignor through the leader's `onLeaderElected` and check every member's `ExtendedAssignment`
with `WorkerTestUtils.assertAssignment` (leader, leader url, assigned connectors, number of
assigned tasks, revoked connectors, number of revoked tasks, delay), under both the compatible
and the sessioned protocol. Transcribed onto `IncrementalCooperativeAssignor.perform_assignment`
(apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99, connect/runtime/src/test/java/
org/apache/kafka/connect/runtime/distributed/WorkerCoordinatorIncrementalTest.java and
connect/runtime/src/test/java/org/apache/kafka/connect/runtime/WorkerTestUtils.java).

In those tests the coordinator never completes a join, so its generation and last completed
generation are both Kafka's NO_GENERATION (-1) in every round, and the members' metadata carries
the assignment each received last (not what they would run after applying it).
"""

from __future__ import annotations

import pytest

from connect_protocol.resources import EMPTY, ResourceSet
from worker_agent.classic.incremental import NO_GENERATION, IncrementalCooperativeAssignor
from worker_agent.classic.values import (
    CONNECT_PROTOCOL_V1,
    CONNECT_PROTOCOL_V2,
    NO_ERROR,
    WorkerAssignment,
    WorkerState,
)

DELAY = 300_000
LEADER, MEMBER, ANOTHER = "worker1", "worker2", "worker3"
CATALOGUE = {"connector1": 4, "connector2": 4}  # WorkerTestUtils.clusterConfigState(offset, 2, 4)


def url(member: str) -> str:
    """WorkerTestUtils.expectedLeaderUrl / the test's expectedUrl."""
    return f"http://{member}:8083"


class Coordinator:
    def __init__(self, version: int) -> None:
        self.version = version
        self.now_ms = 0
        self.assignor = IncrementalCooperativeAssignor(DELAY)

    def on_leader_elected(self, members: dict[str, ResourceSet]) -> dict[str, WorkerAssignment]:
        return self.assignor.perform_assignment(
            LEADER,
            {m: WorkerState(url(m), allocation) for m, allocation in members.items()},
            CATALOGUE,
            generation=NO_GENERATION,
            last_completed_generation=NO_GENERATION,
            now_ms=self.now_ms,
            version=self.version,
        )


def assert_assignment(
    answer: WorkerAssignment,
    connectors: list[str],
    tasks: int,
    revoked_connectors: list[str],
    revoked_tasks: int,
    delay: int = 0,
) -> None:
    """WorkerTestUtils.assertAssignment (the config offset is not carried here)."""
    assert answer.error == NO_ERROR
    assert (answer.leader, answer.leader_url) == (LEADER, url(LEADER))
    assert answer.assignment.sorted_connectors() == connectors
    assert len(answer.assignment.tasks) == tasks
    assert answer.revoked is not None
    assert answer.revoked.sorted_connectors() == revoked_connectors
    assert len(answer.revoked.tasks) == revoked_tasks
    assert answer.delay == delay


VERSIONS = pytest.mark.parametrize("version", [CONNECT_PROTOCOL_V1, CONNECT_PROTOCOL_V2])


@VERSIONS
def test_task_assignment_when_worker_joins(version: int) -> None:
    """WorkerCoordinatorIncrementalTest.testTaskAssignmentWhenWorkerJoins."""
    c = Coordinator(version)
    result = c.on_leader_elected({LEADER: EMPTY, MEMBER: EMPTY})
    assert {a.version for a in result.values()} == {version}
    assert_assignment(result[LEADER], ["connector1"], 4, [], 0)
    assert_assignment(result[MEMBER], ["connector2"], 4, [], 0)

    result = c.on_leader_elected(
        {LEADER: result[LEADER].assignment, MEMBER: result[MEMBER].assignment, ANOTHER: EMPTY}
    )
    assert_assignment(result[LEADER], [], 0, [], 1)
    assert_assignment(result[MEMBER], [], 0, [], 1)
    assert_assignment(result[ANOTHER], [], 0, [], 0)


@VERSIONS
def test_task_assignment_when_worker_leaves_permanently(version: int) -> None:
    """WorkerCoordinatorIncrementalTest.testTaskAssignmentWhenWorkerLeavesPermanently."""
    c = Coordinator(version)
    result = c.on_leader_elected({LEADER: EMPTY, MEMBER: EMPTY, ANOTHER: EMPTY})
    assert_assignment(result[LEADER], ["connector1"], 3, [], 0)
    assert_assignment(result[MEMBER], ["connector2"], 3, [], 0)
    assert_assignment(result[ANOTHER], [], 2, [], 0)

    members = {LEADER: result[LEADER].assignment, MEMBER: result[MEMBER].assignment}
    result = c.on_leader_elected(members)
    assert_assignment(result[LEADER], [], 0, [], 0, DELAY)
    assert_assignment(result[MEMBER], [], 0, [], 0, DELAY)

    c.now_ms += DELAY // 2
    result = c.on_leader_elected(members)
    assert_assignment(result[LEADER], [], 0, [], 0, DELAY // 2)
    assert_assignment(result[MEMBER], [], 0, [], 0, DELAY // 2)

    c.now_ms += DELAY // 2 + 1
    result = c.on_leader_elected(members)
    assert_assignment(result[LEADER], [], 1, [], 0)
    assert_assignment(result[MEMBER], [], 1, [], 0)


@VERSIONS
def test_task_assignment_when_worker_bounces(version: int) -> None:
    """WorkerCoordinatorIncrementalTest.testTaskAssignmentWhenWorkerBounces: the returning
    member gets its two tasks back when the delay expires."""
    c = Coordinator(version)
    result = c.on_leader_elected({LEADER: EMPTY, MEMBER: EMPTY, ANOTHER: EMPTY})
    assert_assignment(result[LEADER], ["connector1"], 3, [], 0)
    assert_assignment(result[MEMBER], ["connector2"], 3, [], 0)
    assert_assignment(result[ANOTHER], [], 2, [], 0)
    another_before = result[ANOTHER].assignment

    members = {LEADER: result[LEADER].assignment, MEMBER: result[MEMBER].assignment}
    result = c.on_leader_elected(members)
    assert_assignment(result[LEADER], [], 0, [], 0, DELAY)
    assert_assignment(result[MEMBER], [], 0, [], 0, DELAY)

    c.now_ms += DELAY // 2
    members[ANOTHER] = EMPTY
    result = c.on_leader_elected(members)
    for m in (LEADER, MEMBER, ANOTHER):
        assert_assignment(result[m], [], 0, [], 0, DELAY // 2)

    c.now_ms += DELAY // 2 + 1
    result = c.on_leader_elected(members)
    assert_assignment(result[LEADER], [], 0, [], 0)
    assert_assignment(result[MEMBER], [], 0, [], 0)
    assert_assignment(result[ANOTHER], [], 2, [], 0)
    assert result[ANOTHER].assignment == another_before
