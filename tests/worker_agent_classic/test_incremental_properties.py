"""Property tests (hypothesis) of the incremental cooperative port, closed-loop in the
`ConnectCluster` harness (Connect's `IncrementalCooperativeAssignorTest` fixture):

- after any round that the members apply, no connector or task is held by two members
  (counting what they keep running), whatever came before: joins with stale or overlapping
  allocations, departures, catalogue changes, undelivered rounds, generation mismatches,
  leader changes, time;
- without departures (and with every round delivered), a catalogue resource no one holds after
  a round is one that round revoked, and the next round places it: every resource is held
  again at most two rounds after it was created or revoked, from any starting allocations and
  any history;
- a round is a pure function of the leader's memory and its inputs.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connect_protocol.resources import ResourceSet, TaskId
from worker_agent.classic.incremental import NO_GENERATION, assign_round
from worker_agent.classic.values import configured_resources, union

from .support import ConnectCluster, duplicates, held_counts

CONNECTORS = ["c1", "c2", "c3", "c4", "c5"]
WORKERS = ["w1", "w2", "w3", "w4", "w5", "w6"]
DELAYS = st.sampled_from([0, 1, 1_000, 300_000])

#: Any set of resources, catalogued or not (a worker may run what the leader never assigned).
resource_sets = st.builds(
    ResourceSet.of,
    st.lists(st.sampled_from([*CONNECTORS, "gone"]), max_size=4),
    st.lists(
        st.builds(TaskId, st.sampled_from([*CONNECTORS, "gone"]), st.integers(0, 5)), max_size=8
    ),
)
catalogues = st.dictionaries(st.sampled_from(CONNECTORS), st.integers(0, 5), max_size=5)


def _cluster(max_delay_ms: int, catalogue: dict[str, int]) -> ConnectCluster:
    c = ConnectCluster(max_delay_ms)
    c.remove_connector("connector1")
    c.remove_connector("connector2")
    c.remove_workers("worker1")
    for name, tasks in catalogue.items():
        c.add_connector(name, tasks)
    return c


def _assert_complete_and_single(c: ConnectCluster) -> None:
    counts = held_counts(c.allocations.values())
    for name, tasks in c.catalogue.items():
        assert counts[name] == 1, (name, c.allocations)
        for n in range(tasks):
            assert counts[TaskId(name, n)] == 1, (name, n, c.allocations)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), max_delay_ms=DELAYS, catalogue=catalogues)
def test_no_resource_is_held_twice_after_an_applied_round(
    data: st.DataObject, max_delay_ms: int, catalogue: dict[str, int]
) -> None:
    c = _cluster(max_delay_ms, catalogue)
    c.add_worker("w1", data.draw(resource_sets))
    for _ in range(data.draw(st.integers(1, 12))):
        op = data.draw(
            st.sampled_from(
                [
                    "join",
                    "join_stale",
                    "leave",
                    "add",
                    "remove",
                    "sleep",
                    "round",
                    "failed",
                    "mismatched",
                    "new_leader",
                ]
            )
        )
        absent = [w for w in WORKERS if w not in c.allocations]
        if op in ("join", "join_stale") and absent:
            stale = data.draw(resource_sets) if op == "join_stale" else ResourceSet()
            c.add_worker(data.draw(st.sampled_from(absent)), stale)
        elif op == "leave" and len(c.allocations) > 1:
            c.remove_workers(data.draw(st.sampled_from(sorted(c.allocations))))
        elif op == "add":
            name = data.draw(st.sampled_from(CONNECTORS))
            c.catalogue[name] = data.draw(st.integers(0, 5))
        elif op == "remove" and c.catalogue:
            c.remove_connector(data.draw(st.sampled_from(sorted(c.catalogue))))
        elif op == "sleep":
            c.sleep(data.draw(st.sampled_from([1, 40, 1_600, 150_000, 300_000])))
        elif op == "new_leader":
            c.init_assignor()
        elif op in ("round", "failed", "mismatched"):
            c.rebalance(failed=op == "failed", mismatched_generation=op == "mismatched")
            if op != "failed":
                assert not duplicates(c.allocations), c.allocations
    c.rebalance()
    assert not duplicates(c.allocations), c.allocations


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    max_delay_ms=DELAYS,
    catalogue=catalogues,
    start=st.dictionaries(st.sampled_from(WORKERS), resource_sets, min_size=1, max_size=5),
)
def test_without_departures_everything_is_placed_within_two_rounds(
    data: st.DataObject,
    max_delay_ms: int,
    catalogue: dict[str, int],
    start: dict[str, ResourceSet],
) -> None:
    """After every round (no departures, every round delivered), what of the catalogue no one
    holds is what that round revoked; what a round revoked no one runs, so the next round cannot
    revoke it again and places it (as new work). So every resource is held again at most two
    rounds after it was created or revoked, whatever the starting allocations (stale, overlapping,
    outside the catalogue), catalogue changes, joins, generation mismatches and time."""
    c = _cluster(max_delay_ms, catalogue)
    for worker, allocation in start.items():
        c.add_worker(worker, allocation)
    revoked_before = ResourceSet()
    for _ in range(data.draw(st.integers(2, 10))):
        op = data.draw(st.sampled_from(["join", "add", "remove", "sleep", "round", "mismatched"]))
        absent = [w for w in WORKERS if w not in c.allocations]
        if op == "join" and absent:
            c.add_empty_workers(data.draw(st.sampled_from(absent)))
        elif op == "add":
            c.catalogue[data.draw(st.sampled_from(CONNECTORS))] = data.draw(st.integers(0, 5))
        elif op == "remove" and c.catalogue:
            c.remove_connector(data.draw(st.sampled_from(sorted(c.catalogue))))
        elif op == "sleep":
            c.sleep(data.draw(st.sampled_from([1, 40, 1_600, 300_000])))
        elif op in ("round", "mismatched"):
            c.rebalance(mismatched_generation=op == "mismatched")
            revoked = union(c.result.revoked.values())
            assert revoked.isdisjoint(revoked_before)
            configured = configured_resources(c.catalogue)
            held = union(c.allocations.values())
            assert configured - held <= revoked, (configured - held, revoked)
            revoked_before = revoked
    # Two rounds with no change: the second places whatever the first revoked.
    for _ in range(2):
        c.sleep(data.draw(st.sampled_from([0, 1, 40])))
        c.rebalance()
    configured = configured_resources(c.catalogue)
    unheld = configured - union(c.allocations.values())
    assert unheld <= union(c.result.revoked.values())
    if not any(c.result.revoked.values()):
        _assert_complete_and_single(c)


def test_a_quiet_round_may_revoke_for_balance_when_the_backoff_expires() -> None:
    """Why the property above is stated per round: with no change at all, a later round may
    still revoke (and leave work unplaced for one round) when the successive-revocation backoff
    expires (KAFKA-12495). Found by hypothesis: a fresh leader, scheduled.rebalance.max.delay.ms
    = 1, a worker running two tasks of a connector that has none."""
    c = _cluster(1, {"c1": 0, "c2": 5})
    for w in ("w1", "w2", "w3", "w4"):
        c.add_empty_workers(w)
    c.add_worker("w5", ResourceSet.of((), [TaskId("c1", 0), TaskId("c1", 1)]))
    c.rebalance()  # places everything; revokes c1-0 from w5 for balance
    assert union(c.result.revoked.values()) == ResourceSet.of((), [TaskId("c1", 0)])
    c.rebalance()  # revokes c1-1 as deleted; a successive balancing revocation backs off 1 ms
    assert union(c.result.revoked.values()) == ResourceSet.of((), [TaskId("c1", 1)])
    assert c.delay == 1
    _assert_complete_and_single(c)
    c.sleep(1)
    c.rebalance()  # the backoff expired: w1's second task is revoked for balance
    assert c.delay == 0
    assert [len(a.tasks) for a in c.result.revoked.values()] == [1, 0, 0, 0, 0]
    c.rebalance()
    c.assert_balanced_and_complete()


@settings(max_examples=50, deadline=None)
@given(
    catalogue=catalogues,
    allocations=st.dictionaries(st.sampled_from(WORKERS), resource_sets, min_size=1, max_size=4),
    max_delay_ms=DELAYS,
    revoked_in_previous=st.booleans(),
)
def test_a_round_is_a_pure_function_of_memory_and_inputs(
    catalogue: dict[str, int],
    allocations: dict[str, ResourceSet],
    max_delay_ms: int,
    revoked_in_previous: bool,
) -> None:
    c = _cluster(max_delay_ms, catalogue)
    memory = replace(c.assignor.memory, revoked_in_previous=revoked_in_previous)
    runs = [
        assign_round(
            memory,
            max_delay_ms=max_delay_ms,
            allocations=dict(allocations),
            catalogue=dict(catalogue),
            generation=7,
            last_completed_generation=NO_GENERATION,
            now_ms=5,
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
