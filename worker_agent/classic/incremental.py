"""A port of Kafka Connect's `IncrementalCooperativeAssignor` (KIP-415), the leader's assignor
under the `compatible` (V1) and `sessioned` (V2) protocols (DESIGN 3.19, "Connect today").

Read from apache/kafka at commit 1eb7644349cb07139d6a3c1ad1986979647cac99 (trunk, 4.0.0-SNAPSHOT,
2024-10-25): connect/runtime/src/main/java/org/apache/kafka/connect/runtime/distributed/
IncrementalCooperativeAssignor.java, with the `WorkerLoad` and `ConnectorsAndTasks` helpers of
WorkerCoordinator.java and clients' `ExponentialBackoff`; the last changes to the assignor there
are KAFKA-13763 (#11983, the split into `performLoadBalancingRevocations`), KAFKA-12495 (#12561,
the successive-revocation backoff) and KAFKA-15693 (#14647, no delay when the maximum is 0). The
behaviour is re-expressed, not translated; each step below names the Connect method it follows.

What the module owns:

- `LeaderMemory`: what Connect's assignor object keeps between rounds in the leader's memory
  (previous assignment, previous generation and members, `previousRevocation`,
  `revokedInPrevious`, the scheduled rebalance and its delay, the candidate workers for lost
  work, the count of successive revoking rounds). Frozen; each round returns the next one.
- `assign_round`: one round, a pure function (memory, inputs, now) -> (memory, assignment).
- `handle_lost_assignments`: Connect's `handleLostAssignments` on its own (its tests call it
  directly).
- `fill_least_loaded`, `balancing_revocations`: the round-robin placement of new work on the least
  loaded workers (`assignConnectors` / `assignTasks`) and the load-balancing revocations
  (`performLoadBalancingRevocations`).
- `IncrementalCooperativeAssignor`: the leader-side object holding the memory and the
  `scheduled.rebalance.max.delay.ms` configuration, answering every member an assignment.

Behaviour kept from Connect, in its order within `performTaskAssignment`:

1. KAFKA-9848: the previous assignment is forgotten when this leader did not compute the last
   completed generation (its remembered generation differs from the leader worker's last
   completed one), e.g. when the last assignment it computed was never delivered, or another
   worker led in between. Only the previous assignment is dropped; the delay and backoff state
   stay, as in Connect.
2. A previous revocation that did not take effect (something revoked last round is still
   running) makes the leader take what is running as the previous assignment.
3. Derived sets: deleted = previous - configured; duplicated = run by two or more members;
   lost = previous - running - deleted; created = configured - previous - running.
4. Deleted and duplicated work is revoked from every member running it (a duplicated task is
   revoked from all its holders, and placed again next round as new work).
5. Lost work waits for `scheduled.rebalance.max.delay.ms` (see `handle_lost_assignments`),
   except when the last assignment apparently did not arrive (KAFKA-9848: no delay running and
   every previous member still present) or the maximum delay is 0 (KAFKA-15693).
6. Load-balancing revocations, only while no delay is active, with KAFKA-12495's backoff:
   `revokedInPrevious` is set by a round that revokes for balance and cleared by a round that
   needs no such revocation, by any round while a delay is active, and when a delay expires.
   While it is set, a round that would revoke for balance is the n-th successive one: it
   revokes nothing and sets a delay of `ExponentialBackoff(1, 40, max_delay, 0).backoff(n)` ms
   (40, 1,600, 64,000 ms..., capped at the maximum; 1 ms when the maximum is 1), or revokes at
   once when the maximum is 0. n is not reset when a delay expires; only a round that finds
   nothing to revoke while `revokedInPrevious` is set restarts it.
7. New and reassigned lost work goes to the least loaded workers, connectors then tasks.

Orders where Connect iterates hash maps (which members absorb a remainder, which resources a
worker gives up, the order of candidate workers) are made deterministic here: members by id,
resources sorted (connectors by name, tasks by connector then number).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import cycle
from typing import TypeVar

from connect_protocol.resources import EMPTY, ResourceSet, TaskId

from .values import (
    CONNECT_PROTOCOL_V1,
    CONNECT_PROTOCOL_V2,
    DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
    NO_ERROR,
    Catalogue,
    WorkerAssignment,
    WorkerState,
    configured_resources,
    union,
)

__all__ = [
    "NO_GENERATION",
    "ClusterAssignment",
    "IncrementalCooperativeAssignor",
    "LeaderMemory",
    "LostAssignmentHandling",
    "assign_round",
    "balancing_revocations",
    "fill_least_loaded",
    "handle_lost_assignments",
    "successive_revocation_delay",
]

#: Kafka's `Generation.NO_GENERATION.generationId`: a fresh assignor's previous generation and a
#: worker's last completed generation before it completes one.
NO_GENERATION = -1

#: `ExponentialBackoff` parameters of Connect's `consecutiveRevokingRebalancesBackoff`.
_BACKOFF_INITIAL_MS = 1
_BACKOFF_MULTIPLIER = 40

_T = TypeVar("_T", str, TaskId)


@dataclass(frozen=True, slots=True)
class LeaderMemory:
    """What the leader remembers between rounds (the fields of Connect's assignor object).

    Attributes:
        previous_assignment: everything the last round left assigned (plus its lost work),
            `previousAssignment`.
        previous_revocation: what the last round revoked, `previousRevocation`.
        revoked_in_previous: the last revoking round was not followed by a quiet one,
            `revokedInPrevious` (KAFKA-12495).
        successive_revoking_rounds: `numSuccessiveRevokingRebalances`, the backoff's attempt.
        candidate_workers: members seen empty while lost work waits, first seen first
            (`candidateWorkersForReassignment`, a LinkedHashSet in Connect).
        scheduled_rebalance: when the delay ends, in ms of the caller's clock; 0: none.
        delay: the delay sent in every member's assignment, ms; 0: none.
        previous_generation: the generation of the last round, `previousGenerationId`.
        previous_members: the members of the last round, `previousMembers`.
    """

    previous_assignment: ResourceSet = EMPTY
    previous_revocation: ResourceSet = EMPTY
    revoked_in_previous: bool = False
    successive_revoking_rounds: int = 0
    candidate_workers: tuple[str, ...] = ()
    scheduled_rebalance: int = 0
    delay: int = 0
    previous_generation: int = NO_GENERATION
    previous_members: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ClusterAssignment:
    """One round's result for every member (Connect's `ClusterAssignment`).

    Attributes:
        assigned: per member, what it is newly given.
        revoked: per member, what it must stop.
        all_assigned: per member, what it runs once it applied both.
    """

    assigned: Mapping[str, ResourceSet] = field(default_factory=dict)
    revoked: Mapping[str, ResourceSet] = field(default_factory=dict)
    all_assigned: Mapping[str, ResourceSet] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LostAssignmentHandling:
    """The outcome of `handle_lost_assignments`.

    Attributes:
        memory: the leader's memory afterwards (delay, scheduled rebalance, candidates).
        to_reassign: lost work to place as new work this round.
        given: lost work handed directly to candidate workers this round, per worker.
    """

    memory: LeaderMemory
    to_reassign: ResourceSet = EMPTY
    given: Mapping[str, ResourceSet] = field(default_factory=dict)


def successive_revocation_delay(attempt: int, max_delay_ms: int) -> int:
    """The delay before the `attempt`-th successive revoking round may revoke (KAFKA-12495).

    Connect's `ExponentialBackoff(maxDelay == 0 ? 0 : 1, 40, maxDelay, 0).backoff(attempt)`:
    1 ms * 40^attempt, the exponent capped where it reaches `max_delay_ms`, never above it; a
    constant `max_delay_ms` when that is not above the initial 1 ms (so 0 for 0, 1 for 1).
    """
    initial = min(max_delay_ms, 0 if max_delay_ms == 0 else _BACKOFF_INITIAL_MS)
    if max_delay_ms <= initial:
        return initial
    top_exponent = math.log(max_delay_ms / max(initial, 1)) / math.log(_BACKOFF_MULTIPLIER)
    value = int(initial * math.pow(_BACKOFF_MULTIPLIER, min(attempt, top_exponent)))
    return min(value, max_delay_ms)


def fill_least_loaded(loads: Mapping[str, Sequence[_T]], new: Iterable[_T]) -> dict[str, list[_T]]:
    """Where each of `new` goes, following Connect's `assignConnectors` / `assignTasks`.

    The workers are ordered once by (current load, id). Work is poured in levels: every worker
    at the lowest level, in that order, takes one item, then the level rises by one and the next
    workers join in, until `new` runs out. So the least loaded fill up first and equally loaded
    ones take turns by id. Returns what each worker receives (every worker has an entry).
    """
    order = sorted(loads, key=lambda w: (len(loads[w]), w))
    given: dict[str, list[_T]] = {w: [] for w in order}
    if not order:
        return given
    count = {w: len(loads[w]) for w in order}
    items = iter(new)
    level = count[order[0]]
    while True:
        for worker in order:
            if count[worker] > level:
                break
            item = next(items, None)
            if item is None:
                return given
            given[worker].append(item)
            count[worker] += 1
        level += 1


def balancing_revocations(total: int, loads: Mapping[str, Sequence[_T]]) -> dict[str, list[_T]]:
    """What to take from each worker so none runs more than a balanced share of `total`
    (Connect's `loadBalancingRevocations`, for connectors or for tasks).

    A balanced share is `total // n` per worker, plus one for `total % n` of them. If the loads
    already have exactly that shape, nothing is revoked. Otherwise the workers are visited in
    order (of `loads`); those above the floor take the spare places in turn (one running exactly
    floor + 1 keeps all it has), and every worker above its allowance gives up its first items
    down to it. Only workers giving something up have an entry.
    """
    if not loads:
        return {}
    floor, extras = divmod(total, len(loads))
    sizes = [len(items) for items in loads.values()]
    at_floor, one_above = sizes.count(floor), sizes.count(floor + 1)
    if one_above == extras and at_floor + one_above == len(sizes):
        return {}
    taken: dict[str, list[_T]] = {}
    spare = extras
    for worker, items in loads.items():
        if len(items) <= floor:
            continue
        allowance = floor
        if spare > 0:
            spare -= 1
            allowance = floor + 1
            if len(items) == allowance:
                continue
        taken[worker] = list(items[: len(items) - allowance])
    return taken


def handle_lost_assignments(
    memory: LeaderMemory,
    max_delay_ms: int,
    lost: ResourceSet,
    loads: Mapping[str, ResourceSet],
    now_ms: int,
) -> LostAssignmentHandling:
    """Decide what happens to lost work (Connect's `handleLostAssignments`).

    `loads` is every member's work for this round so far (after deleted and duplicated work is
    taken away). In order:

    - nothing lost and no revoking round just before: the delay ends (is reset);
    - no delay running and every previous member still here: the assignment of the last round
      probably did not arrive, so the lost work is placed again at once as new work;
    - `scheduled.rebalance.max.delay.ms` is 0: placed at once;
    - the delay has expired: the lost work is dealt round-robin (connectors, then tasks from the
      first candidate again) to the candidate workers still present (members seen empty during
      the delay: a worker that bounced gets its work back), or placed as new work if none is;
      the delay ends and revoking rounds are allowed again;
    - otherwise the members now empty become candidates, and the delay starts at the maximum or
      goes on for what remains of it.
    """
    if not lost and not memory.revoked_in_previous:
        return LostAssignmentHandling(_reset_delay(memory))
    scheduled = memory.scheduled_rebalance
    if scheduled <= 0 and memory.previous_members.issubset(loads):
        return LostAssignmentHandling(memory, to_reassign=lost)
    if max_delay_ms == 0:
        return LostAssignmentHandling(memory, to_reassign=lost)
    if scheduled > 0 and now_ms >= scheduled:
        after = replace(_reset_delay(memory), revoked_in_previous=False)
        candidates = [w for w in memory.candidate_workers if w in loads]
        if not candidates:
            return LostAssignmentHandling(after, to_reassign=lost)
        connectors: dict[str, list[str]] = {w: [] for w in candidates}
        tasks: dict[str, list[TaskId]] = {w: [] for w in candidates}
        for connector, worker in zip(lost.sorted_connectors(), cycle(candidates), strict=False):
            connectors[worker].append(connector)
        for task, worker in zip(lost.sorted_tasks(), cycle(candidates), strict=False):
            tasks[worker].append(task)
        given = {w: ResourceSet.of(connectors[w], tasks[w]) for w in candidates}
        return LostAssignmentHandling(after, given={w: s for w, s in given.items() if s})
    seen = set(memory.candidate_workers)
    newly_empty = sorted(w for w, load in loads.items() if not load and w not in seen)
    # Still running: what remains of it; not started yet: the maximum.
    delay = min(scheduled - now_ms, max_delay_ms) if now_ms < scheduled else max_delay_ms
    return LostAssignmentHandling(
        replace(
            memory,
            candidate_workers=memory.candidate_workers + tuple(newly_empty),
            delay=delay,
            scheduled_rebalance=now_ms + delay,
        )
    )


def _reset_delay(memory: LeaderMemory) -> LeaderMemory:
    """Connect's `resetDelay`: no candidates, no scheduled rebalance, no delay."""
    return replace(memory, candidate_workers=(), scheduled_rebalance=0, delay=0)


def _duplicated(allocations: Iterable[ResourceSet]) -> ResourceSet:
    """Connectors and tasks run by more than one member (`duplicatedAssignments`)."""
    seen_connectors: set[str] = set()
    seen_tasks: set[TaskId] = set()
    twice_connectors: set[str] = set()
    twice_tasks: set[TaskId] = set()
    for allocation in allocations:
        twice_connectors |= seen_connectors & allocation.connectors
        twice_tasks |= seen_tasks & allocation.tasks
        seen_connectors |= allocation.connectors
        seen_tasks |= allocation.tasks
    return ResourceSet(frozenset(twice_connectors), frozenset(twice_tasks))


class _Loads:
    """Every member's work as the round builds it (Connect's list of `WorkerLoad`), kept in
    resource order so revocations take a worker's first resources deterministically."""

    def __init__(self, allocations: Mapping[str, ResourceSet]) -> None:
        self.connectors = {m: sorted(a.connectors) for m, a in sorted(allocations.items())}
        self.tasks = {m: sorted(a.tasks) for m, a in sorted(allocations.items())}

    def remove(self, taken: Mapping[str, ResourceSet]) -> None:
        for member, gone in taken.items():
            if gone:
                self.connectors[member] = [
                    c for c in self.connectors[member] if c not in gone.connectors
                ]
                self.tasks[member] = [t for t in self.tasks[member] if t not in gone.tasks]

    def add(self, given: Mapping[str, ResourceSet]) -> None:
        for member, extra in given.items():
            self.connectors[member].extend(extra.sorted_connectors())
            self.tasks[member].extend(extra.sorted_tasks())

    def as_sets(self) -> dict[str, ResourceSet]:
        return {m: ResourceSet.of(self.connectors[m], self.tasks[m]) for m in self.connectors}

    def all_empty(self) -> bool:
        return not any(self.connectors.values()) and not any(self.tasks.values())


def _merge(*maps: Mapping[str, ResourceSet]) -> dict[str, ResourceSet]:
    merged: dict[str, ResourceSet] = {}
    for m in maps:
        for member, s in m.items():
            if s:
                merged[member] = merged.get(member, EMPTY) | s
    return merged


def _load_balancing_revocations(configured: ResourceSet, loads: _Loads) -> dict[str, ResourceSet]:
    """Connect's `performLoadBalancingRevocations`: none when every worker is empty or nothing
    is configured; else connectors and tasks are balanced separately."""
    if loads.all_empty() or not configured:
        return {}
    connectors = balancing_revocations(len(configured.connectors), loads.connectors)
    tasks = balancing_revocations(len(configured.tasks), loads.tasks)
    return {
        m: ResourceSet.of(connectors.get(m, ()), tasks.get(m, ()))
        for m in sorted(connectors.keys() | tasks.keys())
    }


def assign_round(
    memory: LeaderMemory,
    *,
    max_delay_ms: int,
    allocations: Mapping[str, ResourceSet],
    catalogue: Catalogue,
    generation: int,
    last_completed_generation: int,
    now_ms: int,
) -> tuple[LeaderMemory, ClusterAssignment]:
    """One round of Connect's `performTaskAssignment(configSnapshot, lastCompletedGenerationId,
    currentGenerationId, memberAssignments)`, as a pure function.

    Args:
        memory: the leader's memory after the previous round (a fresh `LeaderMemory()` for a
            leader that has computed nothing yet).
        max_delay_ms: `scheduled.rebalance.max.delay.ms`.
        allocations: per member, what it reports running.
        catalogue: connector name -> task count.
        generation: the generation being assigned.
        last_completed_generation: the last generation the leader's own worker completed
            (`WorkerCoordinator.lastCompletedGenerationId`).
        now_ms: the caller's clock.

    Returns:
        The memory for the next round and every member's result.
    """
    # KAFKA-9848: a view computed for a generation that did not complete is not to be trusted.
    previous = memory.previous_assignment
    if memory.previous_generation != last_completed_generation:
        previous = EMPTY
    configured = configured_resources(catalogue)
    running = union(allocations.values())
    # A revocation that did not take effect: start again from what is running.
    if memory.previous_revocation and not memory.previous_revocation.isdisjoint(running):
        previous = running
    memory = replace(memory, previous_revocation=EMPTY)

    deleted = previous - configured
    duplicated = _duplicated(allocations.values())
    lost = previous - running - deleted
    created = configured - previous - running

    current = {m: a - deleted for m, a in allocations.items()}
    revoked = _merge(
        {m: a & deleted for m, a in allocations.items()},
        {m: a & duplicated for m, a in allocations.items()},
    )
    loads = _Loads(allocations)
    loads.remove(revoked)

    handling = handle_lost_assignments(memory, max_delay_ms, lost, loads.as_sets(), now_ms)
    memory = handling.memory
    loads.add(handling.given)

    if memory.delay == 0:
        balancing = _load_balancing_revocations(configured, loads)
        if balancing and memory.revoked_in_previous:
            attempt = memory.successive_revoking_rounds + 1
            delay = successive_revocation_delay(attempt, max_delay_ms)
            memory = replace(memory, successive_revoking_rounds=attempt, delay=delay)
            if delay:
                memory = replace(memory, scheduled_rebalance=now_ms + delay)
            else:
                revoked = _merge(revoked, balancing)
                loads.remove(balancing)
        elif balancing:
            revoked = _merge(revoked, balancing)
            loads.remove(balancing)
            memory = replace(memory, revoked_in_previous=True)
        elif memory.revoked_in_previous:
            # A quiet round after a revoking one: the load has converged; the backoff restarts.
            memory = replace(memory, revoked_in_previous=False, successive_revoking_rounds=0)
    else:
        memory = replace(memory, revoked_in_previous=False)

    # New work first, then lost work released for reassignment (each in resource order; the
    # two are disjoint: lost work was assigned before, new work was not).
    lost_now = handling.to_reassign
    new_connectors = created.sorted_connectors() + lost_now.sorted_connectors()
    new_tasks = created.sorted_tasks() + lost_now.sorted_tasks()
    placed_connectors = fill_least_loaded(loads.connectors, new_connectors)
    placed_tasks = fill_least_loaded(loads.tasks, new_tasks)
    loads.add({m: ResourceSet.of(placed_connectors[m], placed_tasks[m]) for m in placed_connectors})
    next_sets = loads.as_sets()

    all_revoked = union(revoked.values())
    memory = replace(
        memory,
        previous_assignment=(union(next_sets.values()) - all_revoked) | lost,
        previous_revocation=all_revoked,
        previous_generation=generation,
        previous_members=frozenset(allocations),
    )
    members = sorted(allocations)
    return memory, ClusterAssignment(
        assigned={m: next_sets[m] - current[m] for m in members},
        revoked={m: revoked.get(m, EMPTY) for m in members},
        all_assigned={m: next_sets[m] - revoked.get(m, EMPTY) for m in members},
    )


class IncrementalCooperativeAssignor:
    """The leader-side assignor of a compatible or sessioned classic group, holding Connect's
    between-rounds memory (not thread-safe, as Connect's is not).

    A worker keeps one for as long as it runs; when another worker leads, its memory stays
    here but is only partly trusted when it leads again (KAFKA-9848, see `assign_round`). A
    worker that restarts starts from a fresh `LeaderMemory`, as Connect does.

    Attributes:
        max_delay_ms: `scheduled.rebalance.max.delay.ms`.
        memory: what the leader remembers from its last round.
    """

    def __init__(
        self,
        max_delay_ms: int = DEFAULT_SCHEDULED_REBALANCE_MAX_DELAY_MS,
        memory: LeaderMemory | None = None,
    ) -> None:
        if max_delay_ms < 0:
            raise ValueError(f"scheduled.rebalance.max.delay.ms must be >= 0, not {max_delay_ms}")
        self.max_delay_ms = max_delay_ms
        self.memory = memory if memory is not None else LeaderMemory()
        self.last_cluster_assignment = ClusterAssignment()

    @property
    def delay(self) -> int:
        """The delay the last round sent (Connect's `delay` field)."""
        return self.memory.delay

    def perform_assignment(
        self,
        leader_id: str,
        members: Mapping[str, WorkerState],
        catalogue: Catalogue,
        *,
        generation: int,
        last_completed_generation: int,
        now_ms: int,
        version: int = CONNECT_PROTOCOL_V2,
    ) -> dict[str, WorkerAssignment]:
        """Every member's assignment for `generation` (Connect's `performAssignment` and
        `fillAssignments`): what it newly gets, what it must stop, the delay, the leader and its
        url, and `version` (1 or 2, which behave the same; echoed only).

        Raises:
            ValueError: the leader is not a member, or `version` is not 1 or 2.
        """
        if leader_id not in members:
            raise ValueError(f"the leader {leader_id!r} is not a member of the generation")
        if version not in (CONNECT_PROTOCOL_V1, CONNECT_PROTOCOL_V2):
            raise ValueError(
                f"the incremental cooperative protocol has versions 1-2, not {version}"
            )
        self.memory, cluster = assign_round(
            self.memory,
            max_delay_ms=self.max_delay_ms,
            allocations={m: s.allocation for m, s in members.items()},
            catalogue=catalogue,
            generation=generation,
            last_completed_generation=last_completed_generation,
            now_ms=now_ms,
        )
        self.last_cluster_assignment = cluster
        leader_url = members[leader_id].url
        return {
            m: WorkerAssignment(
                version=version,
                error=NO_ERROR,
                leader=leader_id,
                leader_url=leader_url,
                assignment=cluster.assigned[m],
                revoked=cluster.revoked[m],
                delay=self.memory.delay,
            )
            for m in sorted(members)
        }
