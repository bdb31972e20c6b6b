"""Connect's `IncrementalCooperativeAssignorTest` rebalance scenarios, run closed-loop on the port
(worker_agent.classic.incremental). Each test names the Connect test it transcribes
(apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99, connect/runtime/src/test/java/
org/apache/kafka/connect/runtime/distributed/IncrementalCooperativeAssignorTest.java); the
counts asserted are Connect's, in the same rounds.
"""

from __future__ import annotations

import pytest

from connect_protocol.resources import ResourceSet, TaskId
from worker_agent.classic.values import CONNECT_PROTOCOL_V1, CONNECT_PROTOCOL_V2

from .support import ConnectCluster, new_connectors, new_tasks

DEFAULT_DELAY = 300_000


def test_task_assignment_when_worker_joins() -> None:
    """testTaskAssignmentWhenWorkerJoins: a second worker joins; the first gives up half at
    once, the next round places it on the newcomer, a later round changes nothing."""
    c = ConnectCluster()
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1"}
    c.assert_allocations([2], [8])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 1], [0, 4])

    c.rebalance()
    c.assert_no_revocations()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.sleep(c.delay)
    c.rebalance()
    assert c.delay == 0
    c.assert_empty_assignment()


def test_assignments_when_workers_join_after_revocations() -> None:
    """testAssignmentsWhenWorkersJoinAfterRevocations (KAFKA-12495): a revoking round right
    after a revoking round revokes nothing and backs off (40 ms, then 1,600 ms); once the
    backoff has expired the next join revokes again."""
    c = ConnectCluster()
    c.add_connector("connector3", 4)
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1"}
    c.assert_allocations([3], [12])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 2], [0, 6])

    c.add_empty_workers("worker3")
    c.rebalance()
    assert c.delay > 0
    assert c.delay == 40  # ExponentialBackoff(1, 40, 300000, 0).backoff(1)
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 2], [3, 3, 6])

    c.sleep(c.delay)
    c.add_empty_workers("worker4")
    c.rebalance()
    assert c.workers == {"worker1", "worker2", "worker3", "worker4"}
    c.assert_allocations([0, 0, 1, 1], [0, 3, 3, 3])

    c.add_empty_workers("worker5")
    c.rebalance()
    assert c.delay > 40
    assert c.delay == 1600  # backoff(2)
    assert c.workers == {f"worker{i}" for i in range(1, 6)}
    c.assert_allocations([0, 0, 1, 1, 1], [1, 2, 3, 3, 3])

    c.sleep(c.delay)
    c.add_empty_workers("worker6")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {f"worker{i}" for i in range(1, 7)}
    c.assert_allocations([0, 0, 0, 1, 1, 1], [0, 1, 2, 2, 2, 2])

    c.rebalance()
    assert c.workers == {f"worker{i}" for i in range(1, 7)}
    c.assert_allocations([0, 0, 0, 1, 1, 1], [2, 2, 2, 2, 2, 2])
    c.assert_balanced_and_complete()


def test_immediate_revocations_when_max_delay_is_0() -> None:
    """testImmediateRevocationsWhenMaxDelayIs0: with scheduled.rebalance.max.delay.ms = 0 a
    successive revoking round revokes at once (the backoff is 0)."""
    c = ConnectCluster(0)
    c.add_connector("connector3", 4)
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1"}
    c.assert_allocations([3], [12])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 2], [0, 6])

    c.add_empty_workers("worker3")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 1], [3, 3, 4])

    c.rebalance()
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_no_revocations()
    c.assert_allocations([1, 1, 1], [4, 4, 4])
    c.assert_balanced_and_complete()


def test_successive_revocations_when_max_delay_is_equal_to_exp_backoff_initial_interval() -> None:
    """testSuccessiveRevocationsWhenMaxDelayIsEqualToExpBackOffInitialInterval: with a maximum
    delay of 1 ms the successive revoking round backs off by exactly 1 ms."""
    c = ConnectCluster(1)
    c.add_connector("connector3", 4)
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([3], [12])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker2")
    c.rebalance()
    c.assert_allocations([0, 2], [0, 6])

    c.add_empty_workers("worker3")
    c.rebalance()
    assert c.delay == 1
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 2], [3, 3, 6])


def test_worker_joining_during_delayed_rebalance() -> None:
    """testWorkerJoiningDuringDelayedRebalance: a worker joining while the backoff delay runs
    gets nothing and causes no revocation; after the delay the next join revokes, and the
    round after places the revoked work evenly."""
    c = ConnectCluster()
    c.add_connector("connector3", 4)
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([3], [12])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker2")
    c.rebalance()
    c.assert_allocations([0, 2], [0, 6])

    c.add_empty_workers("worker3")
    c.rebalance()
    assert c.delay > 0
    c.assert_no_revocations()
    c.assert_allocations([0, 1, 2], [3, 3, 6])

    c.sleep(c.delay // 2)
    c.add_empty_workers("worker4")
    c.rebalance()
    assert c.delay > 0
    assert c.workers == {"worker1", "worker2", "worker3", "worker4"}
    c.assert_no_revocations()
    c.assert_allocations([0, 0, 1, 2], [0, 3, 3, 6])

    c.sleep(c.delay)
    c.add_empty_workers("worker5")
    c.rebalance()
    assert c.workers == {f"worker{i}" for i in range(1, 6)}
    assert c.delay == 0
    c.assert_allocations([0, 0, 0, 1, 1], [0, 0, 2, 3, 3])

    c.rebalance()
    assert c.delay == 0
    c.assert_no_revocations()
    c.assert_allocations([0, 0, 1, 1, 1], [2, 2, 2, 3, 3])
    c.assert_balanced_and_complete()


def test_task_assignment_when_worker_leaves_permanently() -> None:
    """testTaskAssignmentWhenWorkerLeavesPermanently: a follower leaves; its work waits the
    whole scheduled.rebalance.max.delay.ms, then goes to the remaining worker."""
    c = ConnectCluster()
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.remove_workers("worker2")
    c.rebalance()
    assert c.delay == DEFAULT_DELAY
    assert c.workers == {"worker1"}
    c.assert_empty_assignment()

    c.sleep(DEFAULT_DELAY // 2)
    c.rebalance()
    assert c.delay == DEFAULT_DELAY // 2
    c.assert_empty_assignment()

    c.sleep(DEFAULT_DELAY // 2 + 1)
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([2], [8])
    c.assert_balanced_and_complete()


def test_task_assignment_when_worker_bounces() -> None:
    """testTaskAssignmentWhenWorkerBounces: a follower leaves and comes back empty within the
    delay; when the delay ends it gets its work back, with no revocation."""
    c = ConnectCluster()
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()
    before = c.allocations["worker2"]

    c.remove_workers("worker2")
    c.rebalance()
    assert c.delay == DEFAULT_DELAY
    assert c.workers == {"worker1"}
    c.assert_empty_assignment()

    c.sleep(DEFAULT_DELAY // 2)
    c.rebalance()
    assert c.delay == DEFAULT_DELAY // 2
    c.assert_empty_assignment()

    c.sleep(DEFAULT_DELAY // 4)
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == DEFAULT_DELAY // 4
    assert c.workers == {"worker1", "worker2"}
    c.assert_empty_assignment()

    c.sleep(DEFAULT_DELAY // 4)
    c.rebalance()
    assert c.delay == 0
    c.assert_no_revocations()
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()
    # The returning worker (the candidate) got exactly what it had.
    assert c.allocations["worker2"] == c.result.assigned["worker2"] == before


def test_task_assignment_when_leader_leaves_permanently() -> None:
    """testTaskAssignmentWhenLeaderLeavesPermanently: the leader leaves; the new leader starts
    from a clean slate, so it sees nothing lost and places the unowned work at once."""
    c = ConnectCluster()
    c.add_empty_workers("worker2", "worker3")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 1], [2, 3, 3])
    c.assert_balanced_and_complete()

    c.remove_workers("worker1")
    c.init_assignor()
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker2", "worker3"}
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.rebalance()
    assert c.delay == 0
    c.assert_empty_assignment()


def test_task_assignment_when_leader_bounces() -> None:
    """testTaskAssignmentWhenLeaderBounces: the old leader returns as a follower and is treated
    as a new worker: revocation at once, then placement."""
    c = ConnectCluster()
    c.add_empty_workers("worker2", "worker3")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([0, 1, 1], [2, 3, 3])
    c.assert_balanced_and_complete()

    c.remove_workers("worker1")
    c.init_assignor()
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker2", "worker3"}
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker1")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 1], [0, 3, 3])

    c.rebalance()
    assert c.delay == 0
    c.assert_no_revocations()
    c.assert_allocations([0, 1, 1], [2, 3, 3])
    c.assert_balanced_and_complete()


def test_task_assignment_when_first_assignment_attempt_fails() -> None:
    """testTaskAssignmentWhenFirstAssignmentAttemptFails: the first assignment never arrives;
    the same members come back with nothing, so the lost work is placed again at once."""
    c = ConnectCluster()
    c.add_empty_workers("worker2")
    c.rebalance(failed=True)
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 0], [0, 0])

    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()


def test_task_assignment_when_subsequent_assignment_attempt_fails() -> None:
    """testTaskAssignmentWhenSubsequentAssignmentAttemptFails: a revoking assignment never
    arrives; the next round sees the revocation did not take effect, counts as a successive
    revoking round and backs off; after the delay it revokes, then places."""
    c = ConnectCluster()
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker3")
    c.rebalance(failed=True)
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2", "worker3"}
    c.assert_allocations([0, 1, 1], [0, 4, 4])

    c.rebalance()
    assert c.delay > 0
    c.assert_allocations([0, 1, 1], [0, 4, 4])

    c.sleep(c.delay)
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([0, 1, 1], [0, 3, 3])

    c.rebalance()
    c.assert_allocations([0, 1, 1], [2, 3, 3])
    c.assert_balanced_and_complete()


def test_task_assignment_when_subsequent_assignment_attempt_fails_outside_the_assignor() -> None:
    """testTaskAssignmentWhenSubsequentAssignmentAttemptFailsOutsideTheAssignor (KAFKA-9848):
    the leader's SyncGroup failed, so the next round's last completed generation is not the one
    the leader computed and its previous assignment is dropped; it still backs off."""
    c = ConnectCluster()
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.add_empty_workers("worker3")
    c.rebalance(failed=True)
    assert c.delay == 0
    c.assert_allocations([0, 1, 1], [0, 4, 4])

    c.rebalance(mismatched_generation=True)
    assert c.delay > 0
    c.assert_allocations([0, 1, 1], [0, 4, 4])

    c.sleep(c.delay)
    c.rebalance()
    c.assert_allocations([0, 1, 1], [0, 3, 3])

    c.rebalance()
    c.assert_allocations([0, 1, 1], [2, 3, 3])
    c.assert_balanced_and_complete()


def test_task_assignment_when_connectors_are_deleted() -> None:
    """testTaskAssignmentWhenConnectorsAreDeleted: a deleted connector and its tasks are revoked
    from whoever runs them."""
    c = ConnectCluster()
    c.add_connector("connector3", 4)
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 2], [6, 6])
    c.assert_balanced_and_complete()

    c.remove_connector("connector3")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()


def test_scheduled_delay_is_disabled() -> None:
    """testScheduledDelayIsDisabled: with scheduled.rebalance.max.delay.ms = 0 a departed
    worker's work is placed at once."""
    c = ConnectCluster(0)
    c.add_empty_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.remove_workers("worker2")
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1"}
    c.assert_allocations([2], [8])
    c.assert_balanced_and_complete()


def test_task_assignment_when_tasks_duplicated_in_worker_assignment() -> None:
    """testTaskAssignmentWhenTasksDuplicatedInWorkerAssignment: a worker joins claiming
    connector1 and its tasks, which worker1 runs too; they are revoked from both, and placed
    again the next round."""
    c = ConnectCluster()
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([2], [8])
    c.assert_balanced_and_complete()

    c.add_worker("worker2", ResourceSet.of(new_connectors(1, 2), new_tasks(0, 4, "connector1")))
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 1], [0, 4])
    duplicated = ResourceSet.of(["connector1"], new_tasks(0, 4, "connector1"))
    assert c.result.revoked["worker1"] == duplicated
    assert c.result.revoked["worker2"] == duplicated

    c.rebalance()
    assert c.delay == 0
    c.assert_no_revocations()
    c.assert_allocations([1, 1], [4, 4])
    c.assert_balanced_and_complete()

    c.rebalance()
    assert c.delay == 0
    c.assert_empty_assignment()


def test_duplicated_assignment_handle_when_the_duplicated_assignments_deleted() -> None:
    """testDuplicatedAssignmentHandleWhenTheDuplicatedAssignmentsDeleted: the duplicated
    connector is deleted in the same round; revoked from both, never placed again."""
    c = ConnectCluster()
    c.rebalance()
    assert c.delay == 0
    c.assert_allocations([2], [8])
    c.assert_balanced_and_complete()

    c.remove_connector("connector1")
    c.add_worker("worker2", ResourceSet.of(new_connectors(1, 2), new_tasks(0, 4, "connector1")))
    c.rebalance()
    assert c.delay == 0
    assert c.workers == {"worker1", "worker2"}
    c.assert_allocations([0, 1], [0, 2])

    c.rebalance()
    assert c.delay == 0
    c.assert_no_revocations()
    c.assert_allocations([0, 1], [2, 2])
    c.assert_balanced_and_complete()

    c.sleep(c.delay)
    c.rebalance()
    assert c.delay == 0
    c.assert_empty_assignment()


@pytest.mark.parametrize("version", [CONNECT_PROTOCOL_V1, CONNECT_PROTOCOL_V2])
def test_protocol_versions_behave_the_same(version: int) -> None:
    """testProtocolV1 / testProtocolV2: the answer carries the protocol's version; beyond that,
    compatible (1) and sessioned (2) assign identically (the worker-joins scenario)."""
    runs: dict[int, list[tuple[list[int], list[int], int]]] = {}
    for v in (version, CONNECT_PROTOCOL_V1 + CONNECT_PROTOCOL_V2 - version):
        c = ConnectCluster(version=v)
        steps = []
        for join in (None, "worker2", None, "worker3", None):
            if join:
                c.add_empty_workers(join)
            c.rebalance()
            assert {a.version for a in c.assignments.values()} == {v}
            steps.append((c.connector_counts(), c.task_counts(), c.delay))
        runs[v] = steps
    assert runs[CONNECT_PROTOCOL_V1] == runs[CONNECT_PROTOCOL_V2]


def test_leader_state_names_the_leader_and_its_url() -> None:
    """testLeaderStateUpdated (in spirit): every member is told the leader and its url, and an
    empty catalogue gives everyone an empty assignment."""
    c = ConnectCluster()
    c.remove_connector("connector1")
    c.remove_connector("connector2")
    c.rebalance()
    answer = c.assignments["worker1"]
    assert (answer.leader, answer.leader_url, answer.error) == ("worker1", "http://worker1:8083", 0)
    assert not answer.assignment and answer.revoked is not None and not answer.revoked


def test_a_fresh_leader_meets_work_outside_the_catalogue() -> None:
    """Found by the closed-loop property, and Connect's behaviour as written: a leader with no
    previous view counts work a member runs outside the catalogue (here task 0 of a connector
    that now has no tasks) as load in its first round, revokes it as deleted only in its second
    round (deleted = previous - configured), and that revocation unbalances the tasks, so the
    second round also revokes for balance; the third places what it revoked."""
    c = ConnectCluster(0)
    c.remove_connector("connector1")
    c.remove_connector("connector2")
    c.add_connector("c1", 0)
    c.add_connector("c2", 2)
    c.add_worker("worker2", ResourceSet.of((), [TaskId("c1", 0)]))
    c.rebalance()
    c.assert_no_revocations()
    assert c.allocations["worker1"] == ResourceSet.of(["c1"], [TaskId("c2", 0), TaskId("c2", 1)])
    assert c.allocations["worker2"] == ResourceSet.of(["c2"], [TaskId("c1", 0)])

    c.rebalance()
    assert c.result.revoked == {
        "worker1": ResourceSet.of((), [TaskId("c2", 0)]),
        "worker2": ResourceSet.of((), [TaskId("c1", 0)]),
    }
    c.rebalance()
    c.assert_no_revocations()
    c.assert_balanced_and_complete()
