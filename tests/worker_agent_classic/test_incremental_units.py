"""Connect's `IncrementalCooperativeAssignorTest` tests of single steps (the lost-assignment
family on `handleLostAssignments`, `assignConnectors` / `assignTasks`), transcribed onto the
port's pure functions, plus the backoff values and KAFKA-9848's generation check.

Connect source: apache/kafka commit 1eb7644349cb07139d6a3c1ad1986979647cac99,
connect/runtime/src/test/java/org/apache/kafka/connect/runtime/distributed/
IncrementalCooperativeAssignorTest.java.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest

from connect_protocol.resources import EMPTY, ResourceSet
from worker_agent.classic.incremental import (
    IncrementalCooperativeAssignor,
    LeaderMemory,
    LostAssignmentHandling,
    balancing_revocations,
    fill_least_loaded,
    handle_lost_assignments,
    successive_revocation_delay,
)
from worker_agent.classic.values import WorkerState

from .support import new_connectors, new_tasks, worker_load

DELAY = 300_000
START = 1_000_000


class LostAssignments:
    """Connect's lost-assignment tests' setting: three workers (`configuredAssignment`), a mock
    clock and the assignor's memory, driven through `handle_lost_assignments`."""

    def __init__(self, max_delay_ms: int = DELAY) -> None:
        self.max_delay_ms = max_delay_ms
        self.now_ms = START
        self.memory = LeaderMemory()
        self.loads: dict[str, ResourceSet] = {
            "worker0": worker_load(0, 2, 0, 4),
            "worker1": worker_load(2, 2, 4, 4),
            "worker2": worker_load(4, 2, 8, 4),
        }

    def handle(self, lost: ResourceSet) -> LostAssignmentHandling:
        out = handle_lost_assignments(self.memory, self.max_delay_ms, lost, self.loads, self.now_ms)
        self.memory = out.memory
        return out

    def previous_members(self, members: Mapping[str, object] | set[str]) -> None:
        """Connect's `assignor.previousMembers = ...`."""
        self.memory = replace(self.memory, previous_members=frozenset(members))

    def assert_no_delay(self) -> None:
        assert self.memory.candidate_workers == ()
        assert self.memory.scheduled_rebalance == 0
        assert self.memory.delay == 0

    def assert_delay(self, candidates: set[str], delay: int) -> None:
        assert set(self.memory.candidate_workers) == candidates
        assert self.memory.scheduled_rebalance == self.now_ms + delay
        assert self.memory.delay == delay


def test_lost_assignment_handling_when_worker_bounces() -> None:
    """testLostAssignmentHandlingWhenWorkerBounces: the departed worker returns empty within
    the delay, becomes the candidate, and gets all the lost work when the delay expires."""
    s = LostAssignments()
    s.assert_no_delay()
    s.handle(EMPTY)
    s.assert_no_delay()

    s.previous_members(s.loads)
    lost = s.loads.pop("worker1")
    s.handle(lost)
    s.assert_delay(set(), DELAY)

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    s.loads["worker1"] = EMPTY
    s.handle(lost)
    s.assert_delay({"worker1"}, DELAY // 2)

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    out = s.handle(lost)
    assert lost <= out.given["worker1"]
    assert not out.to_reassign
    s.assert_no_delay()


def test_lost_assignment_handling_when_worker_leaves_permanently() -> None:
    """testLostAssignmentHandlingWhenWorkerLeavesPermanently: no one comes back; when the delay
    expires the lost work is to be placed as new work."""
    s = LostAssignments()
    s.handle(EMPTY)
    s.assert_no_delay()

    s.previous_members(s.loads)
    lost = s.loads.pop("worker1")
    s.handle(lost)
    s.assert_delay(set(), DELAY)

    # Connect sets previousMembers to its fixture's members here ({worker1}); a delay is running
    # so they are not looked at.
    s.previous_members({"worker1"})
    s.now_ms += DELAY // 2
    s.handle(lost)
    s.assert_delay(set(), DELAY // 2)

    s.now_ms += DELAY // 2
    out = s.handle(lost)
    assert lost <= out.to_reassign
    assert not out.given
    s.assert_no_delay()


def test_lost_assignment_handling_with_more_than_one_candidates() -> None:
    """testLostAssignmentHandlingWithMoreThanOneCandidates: a new worker and the returning one
    are both candidates; the lost work is dealt between them even though they have since been
    given other work."""
    s = LostAssignments()
    s.handle(EMPTY)
    s.assert_no_delay()

    s.previous_members(s.loads)
    lost = s.loads.pop("worker1")
    s.loads["worker3"] = EMPTY
    s.handle(lost)
    s.assert_delay({"worker3"}, DELAY)

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    s.loads["worker1"] = EMPTY
    s.handle(lost)
    s.assert_delay({"worker3", "worker1"}, DELAY // 2)
    assert s.memory.candidate_workers == ("worker3", "worker1")  # first seen first

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    s.loads["worker1"] = worker_load(6, 2, 8, 4)
    s.loads["worker3"] = worker_load(8, 2, 12, 4)
    out = s.handle(lost)
    assert set(out.given) == {"worker1", "worker3"}
    assert lost <= out.given["worker1"] | out.given["worker3"]
    # Round-robin: each candidate gets one connector and two tasks.
    assert [len(out.given[w].connectors) for w in ("worker3", "worker1")] == [1, 1]
    assert [len(out.given[w].tasks) for w in ("worker3", "worker1")] == [2, 2]
    s.assert_no_delay()


def test_lost_assignment_handling_when_worker_bounces_back_but_finally_leaves() -> None:
    """testLostAssignmentHandlingWhenWorkerBouncesBackButFinallyLeaves: the candidate is gone
    when the delay expires, so the lost work is placed as new work."""
    s = LostAssignments()
    s.handle(EMPTY)
    s.assert_no_delay()

    s.previous_members(s.loads)
    lost = s.loads.pop("worker1")
    s.handle(lost)
    s.assert_delay(set(), DELAY)

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    s.loads["worker1"] = EMPTY
    s.handle(lost)
    s.assert_delay({"worker1"}, DELAY // 2)

    s.previous_members(s.loads)
    s.now_ms += DELAY // 2
    del s.loads["worker1"]
    out = s.handle(lost)
    assert lost <= out.to_reassign
    assert not out.given
    s.assert_no_delay()


def test_lost_assignment_handling_when_scheduled_delay_is_disabled() -> None:
    """testLostAssignmentHandlingWhenScheduledDelayIsDisabled: with a maximum delay of 0 the lost
    work is placed at once and no delay starts."""
    s = LostAssignments(0)
    s.handle(EMPTY)
    s.assert_no_delay()

    s.previous_members(s.loads)
    lost = s.loads.pop("worker1")
    out = s.handle(lost)
    s.assert_no_delay()
    assert out.to_reassign == lost


def test_lost_work_of_a_failed_delivery_is_placed_at_once() -> None:
    """handleLostAssignments' second branch (testTaskAssignmentWhenFirstAssignmentAttemptFails
    end to end): nothing scheduled and every previous member present means the assignment did not
    arrive, so the lost work is placed again without a delay."""
    s = LostAssignments()
    s.previous_members(s.loads)
    lost = worker_load(20, 1, 20, 2)
    out = s.handle(lost)
    assert out.to_reassign == lost
    s.assert_no_delay()


def test_assign_connectors_when_balanced() -> None:
    """testAssignConnectorsWhenBalanced: equally loaded workers take new connectors in turn,
    by id."""
    loads = {f"worker{i}": new_connectors(i * 2, i * 2 + 2) for i in range(3)}
    given = fill_least_loaded(loads, new_connectors(6, 11))
    assert given == {
        "worker0": ["connector6", "connector9"],
        "worker1": ["connector7", "connector10"],
        "worker2": ["connector8"],
    }


def test_assign_tasks_when_balanced() -> None:
    """testAssignTasksWhenBalanced: the same for tasks."""
    loads = {f"worker{i}": new_tasks(i * 2, i * 2 + 2) for i in range(3)}
    given = fill_least_loaded(loads, new_tasks(6, 11))
    assert given == {
        "worker0": new_tasks(6, 7) + new_tasks(9, 10),
        "worker1": new_tasks(7, 8) + new_tasks(10, 11),
        "worker2": new_tasks(8, 9),
    }


def test_assign_connectors_when_imbalanced() -> None:
    """testAssignConnectorsWhenImbalanced: the least loaded fill up first, and all end equal."""
    starts = {"worker0": (0, 2), "worker1": (2, 3), "worker2": (5, 4), "worker3": (0, 0)}
    connectors = {w: new_connectors(a, a + n) for w, (a, n) in starts.items()}
    tasks = {w: new_tasks(a, a + n) for w, (a, n) in starts.items()}
    given_connectors = fill_least_loaded(connectors, new_connectors(9, 24))
    given_tasks = fill_least_loaded(tasks, new_tasks(9, 24))
    for w in starts:
        assert len(connectors[w]) + len(given_connectors[w]) == 6
        assert len(tasks[w]) + len(given_tasks[w]) == 6


def test_fill_least_loaded_pours_by_levels() -> None:
    """`assignConnectors`' levels: a worker joins the rotation only when the lowest have caught up
    with it (b alone at 0, then b and c at 1, then both at 2; a at 3 never)."""
    given = fill_least_loaded({"a": ["x", "y", "z"], "b": [], "c": ["x"]}, "12345")
    assert given == {"b": ["1", "2", "4"], "c": ["3", "5"], "a": []}


def test_balancing_revocations() -> None:
    """`loadBalancingRevocations`: nothing when already floor/floor+1 shaped; otherwise the
    first workers above the floor keep floor + 1, later ones the floor."""
    assert balancing_revocations(7, {"a": list("123"), "b": list("45"), "c": list("67")}) == {}
    assert balancing_revocations(12, {"a": list("0123456789AB"), "b": []}) == {"a": list("012345")}
    # total 7 over 3: floor 2, one extra: "a" keeps 3, "b" keeps 2.
    assert balancing_revocations(7, {"a": list("1234"), "b": list("567"), "c": []}) == {
        "a": ["1"],
        "b": ["5"],
    }
    # A worker at exactly floor + 1 takes the extra and keeps everything.
    assert balancing_revocations(7, {"a": list("123"), "b": list("4567"), "c": []}) == {
        "b": ["4", "5"]
    }


def test_successive_revocation_delay_is_connects_exponential_backoff() -> None:
    """KAFKA-12495's backoff, `ExponentialBackoff(maxDelay == 0 ? 0 : 1, 40, maxDelay, 0)`."""
    assert [successive_revocation_delay(n, DELAY) for n in (1, 2, 3)] == [40, 1600, 64_000]
    # The exponent is capped at log40(max): 40 ** 3.42 ~= 300,000 (floating point may land 1 ms
    # short, in Java too).
    assert 299_999 <= successive_revocation_delay(4, DELAY) <= DELAY
    assert successive_revocation_delay(50, DELAY) <= DELAY
    assert successive_revocation_delay(3, 1) == 1
    assert successive_revocation_delay(3, 0) == 0
    assert successive_revocation_delay(1, 1_000) == 40
    # 40 ** log40(1000) is 999.99..., truncated as Java's (long) cast does.
    assert 999 <= successive_revocation_delay(2, 1_000) <= 1_000


def _round(
    assignor: IncrementalCooperativeAssignor,
    allocations: dict[str, ResourceSet],
    generation: int,
    last_completed: int,
) -> None:
    answers = assignor.perform_assignment(
        min(allocations),
        {w: WorkerState(url=w, allocation=a) for w, a in allocations.items()},
        {"connector1": 4, "connector2": 4},
        generation=generation,
        last_completed_generation=last_completed,
        now_ms=START,
    )
    for w, a in answers.items():
        assert a.revoked is not None
        allocations[w] = (allocations[w] - a.revoked) | a.assignment


def test_previous_assignment_is_dropped_when_the_leader_did_not_compute_the_last_generation() -> (
    None
):
    """KAFKA-9848 (`performTaskAssignment`'s generation check): a leader whose remembered
    generation is not the last completed one forgets its previous assignment, so a departed
    worker's work is not held back for the delay but placed at once as new work."""
    for last_completed_is_ours in (True, False):
        assignor = IncrementalCooperativeAssignor(DELAY)
        allocations = {"worker1": EMPTY, "worker2": EMPTY}
        _round(assignor, allocations, 1001, -1)
        assert assignor.memory.previous_generation == 1001
        del allocations["worker2"]
        if last_completed_is_ours:
            _round(assignor, allocations, 1002, 1001)
        else:  # generation 1002 was computed by another leader
            _round(assignor, allocations, 1003, 1002)
        if last_completed_is_ours:
            assert assignor.delay == DELAY
            assert len(allocations["worker1"]) == 5  # one connector, four tasks: the rest waits
        else:
            assert assignor.delay == 0
            assert len(allocations["worker1"]) == 10  # everything, at once


def test_the_assignor_refuses_what_connect_cannot_be_asked() -> None:
    """The leader must be a member; the incremental protocol has versions 1 and 2 only; the
    maximum delay is not negative (DistributedConfig's `atLeast(0)`)."""
    assignor = IncrementalCooperativeAssignor()
    members = {"w": WorkerState("u")}
    with pytest.raises(ValueError, match="not a member"):
        assignor.perform_assignment(
            "x", members, {}, generation=1, last_completed_generation=-1, now_ms=0
        )
    with pytest.raises(ValueError, match="versions 1-2"):
        assignor.perform_assignment(
            "w", members, {}, generation=1, last_completed_generation=-1, now_ms=0, version=0
        )
    with pytest.raises(ValueError, match=">= 0"):
        IncrementalCooperativeAssignor(-1)
    assert assignor.memory == LeaderMemory()  # nothing was computed
