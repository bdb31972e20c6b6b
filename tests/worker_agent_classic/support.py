"""A closed-loop harness for the classic assignor ports, after the fixture of Kafka Connect's
`IncrementalCooperativeAssignorTest` (connect/runtime/src/test/java/org/apache/kafka/connect/
runtime/distributed/ in apache/kafka, commit 1eb7644349cb07139d6a3c1ad1986979647cac99).

`ConnectCluster` holds what Connect's test holds: the connectors and their task counts, every
worker's current allocation, the generation, a mock clock and the assignor. `rebalance()` follows
its `performRebalance`: the generation advances, the leader assigns with the last completed
generation one behind (two behind for a mismatched generation), the answer is checked for
redundant assignments (`assertNoRedundantAssignments`) and, unless the round failed, every worker
applies it (`applyAssignments`: its allocation minus `revoked` plus `assignment`, which must equal
the round's complete assignment for it). The `assert_*` helpers are Connect's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import replace

from connect_protocol.resources import EMPTY, ResourceSet, TaskId
from worker_agent.classic.incremental import ClusterAssignment, IncrementalCooperativeAssignor
from worker_agent.classic.values import (
    CONNECT_PROTOCOL_V2,
    DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
    WorkerAssignment,
    WorkerState,
    configured_resources,
)

__all__ = ["ConnectCluster", "new_connectors", "new_tasks", "worker_load"]


def new_connectors(start: int, end: int) -> list[str]:
    """Connect's `newConnectors(start, end)`: connector<start> .. connector<end - 1>."""
    return [f"connector{i}" for i in range(start, end)]


def new_tasks(start: int, end: int, connector: str = "task") -> list[TaskId]:
    """Connect's `newTasks([connector,] start, end)`: tasks start .. end - 1 of `connector`."""
    return [TaskId(connector, i) for i in range(start, end)]


def worker_load(
    connector_start: int, connector_count: int, task_start: int, task_count: int
) -> ResourceSet:
    """Connect's `workerLoad(worker, connectorStart, connectorNum, taskStart, taskNum)`."""
    return ResourceSet.of(
        new_connectors(connector_start, connector_start + connector_count),
        new_tasks(task_start, task_start + task_count),
    )


class ConnectCluster:
    """Connect's test fixture (`setup`): connector1 and connector2 with 4 tasks each, one empty
    worker `worker1`, generation 1000, an assignor whose previous generation is 1000."""

    def __init__(
        self,
        max_delay_ms: int = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
        *,
        version: int = CONNECT_PROTOCOL_V2,
    ) -> None:
        self.max_delay_ms = max_delay_ms
        self.version = version
        self.now_ms = 1_000_000
        self.generation = 1000
        self.catalogue: dict[str, int] = {}
        self.allocations: dict[str, ResourceSet] = {}
        self.add_connector("connector1", 4)
        self.add_connector("connector2", 4)
        self.add_empty_workers("worker1")
        self.assignor = self.init_assignor()
        self.result = ClusterAssignment()
        self.assignments: dict[str, WorkerAssignment] = {}

    # --- Connect's fixture operations ---------------------------------------------------------

    def init_assignor(self) -> IncrementalCooperativeAssignor:
        """Connect's `initAssignor`: a fresh assignor (a new leader's clean slate) that
        computed the current generation."""
        self.assignor = IncrementalCooperativeAssignor(self.max_delay_ms)
        self.assignor.memory = replace(self.assignor.memory, previous_generation=self.generation)
        return self.assignor

    def add_connector(self, name: str, tasks: int) -> None:
        assert name not in self.catalogue, f"connector {name} already exists"
        self.catalogue[name] = tasks

    def remove_connector(self, name: str) -> None:
        assert self.catalogue.pop(name, None) is not None, f"connector {name} does not exist"

    def add_empty_workers(self, *workers: str) -> None:
        for worker in workers:
            self.add_worker(worker, EMPTY)

    def add_worker(self, worker: str, allocation: ResourceSet) -> None:
        assert worker not in self.allocations, f"worker {worker} already exists"
        self.allocations[worker] = allocation

    def remove_workers(self, *workers: str) -> None:
        for worker in workers:
            assert self.allocations.pop(worker, None) is not None, f"no worker {worker}"

    def sleep(self, ms: int) -> None:
        """Connect's `MockTime.sleep`."""
        self.now_ms += ms

    @property
    def delay(self) -> int:
        return self.assignor.delay

    # --- rounds --------------------------------------------------------------------------------

    def rebalance(self, *, failed: bool = False, mismatched_generation: bool = False) -> None:
        """Connect's `performStandardRebalance` / `performFailedRebalance` /
        `performRebalanceWithMismatchedGeneration`."""
        self.generation += 1
        last_completed = self.generation - (2 if mismatched_generation else 1)
        leader = min(self.allocations)
        self.assignments = self.assignor.perform_assignment(
            leader,
            {
                w: WorkerState(url=f"http://{w}:8083", allocation=a)
                for w, a in self.allocations.items()
            },
            dict(self.catalogue),
            generation=self.generation,
            last_completed_generation=last_completed,
            now_ms=self.now_ms,
            version=self.version,
        )
        self.result = self.assignor.last_cluster_assignment
        self.assert_answers_match_result(leader)
        self.assert_no_redundant_assignments()
        if not failed:
            self.apply()

    def apply(self) -> None:
        """Connect's `applyAssignments`: each worker stops what is revoked and starts what is
        newly assigned; what it then runs must be the round's complete assignment for it."""
        for worker, answer in self.assignments.items():
            assert answer.revoked is not None
            after = (self.allocations[worker] - answer.revoked) | answer.assignment
            assert after == self.result.all_assigned[worker], worker
            self.allocations[worker] = after

    # --- Connect's assertions ------------------------------------------------------------------

    @property
    def workers(self) -> set[str]:
        """Connect's `returnedAssignments.allWorkers()`."""
        return set(self.result.all_assigned)

    def connector_counts(self) -> list[int]:
        return sorted(len(a.connectors) for a in self.allocations.values())

    def task_counts(self) -> list[int]:
        return sorted(len(a.tasks) for a in self.allocations.values())

    def assert_allocations(self, connectors: Iterable[int], tasks: Iterable[int]) -> None:
        """Connect's `assertConnectorAllocations` and `assertTaskAllocations` (counts, in any
        order)."""
        assert self.connector_counts() == sorted(connectors)
        assert self.task_counts() == sorted(tasks)

    def assert_no_revocations(self) -> None:
        assert not any(self.result.revoked.values()), self.result.revoked

    def assert_empty_assignment(self) -> None:
        """Connect's `assertEmptyAssignment`: nothing assigned, nothing revoked."""
        assert not any(self.result.assigned.values()), self.result.assigned
        self.assert_no_revocations()

    def assert_balanced_and_complete(self) -> None:
        """Connect's `assertBalancedAndCompleteAllocation`."""
        connectors, tasks = self.connector_counts(), self.task_counts()
        assert connectors[-1] - connectors[0] <= 1, connectors
        assert tasks[-1] - tasks[0] <= 1, tasks
        held = held_counts(self.allocations.values())
        configured = configured_resources(self.catalogue)
        assert set(held) == set(configured.connectors) | set(configured.tasks)

    def assert_no_redundant_assignments(self) -> None:
        """Connect's `assertNoRedundantAssignments`: nothing newly assigned twice, nor to anyone
        while some worker already runs it."""
        new = held_counts(self.result.assigned.values())
        assert all(n == 1 for n in new.values()), new
        running = held_counts(self.allocations.values())
        assert not (new.keys() & running.keys()), new.keys() & running.keys()

    def assert_answers_match_result(self, leader: str) -> None:
        """Every member's answer carries its part of the round, the delay and the leader."""
        assert set(self.assignments) == set(self.allocations)
        for worker, answer in self.assignments.items():
            assert answer.assignment == self.result.assigned[worker]
            assert answer.revoked == self.result.revoked[worker]
            assert answer.delay == self.assignor.delay
            assert (answer.leader, answer.leader_url) == (leader, f"http://{leader}:8083")
            assert answer.version == self.version


def held_counts(sets: Iterable[ResourceSet]) -> Counter[str | TaskId]:
    """How many of `sets` hold each connector and task."""
    counts: Counter[str | TaskId] = Counter()
    for s in sets:
        counts.update(s.connectors)
        counts.update(s.tasks)
    return counts


def duplicates(allocations: Mapping[str, ResourceSet]) -> set[str | TaskId]:
    """Resources held by more than one worker."""
    return {r for r, n in held_counts(allocations.values()).items() if n > 1}
